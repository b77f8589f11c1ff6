#!/usr/bin/env bash
# docs/benchmarks.md, "The published trio at 10M steps": ppo_atari.py on one Atari game at the published
# scale (10M agent steps, CleanRL's default hyperparameters, fp32, seed 1), against CleanRL's published
# 10M figure for that game (3 seeds). Then the curve against steps with that figure as a reference line.
#
#     bash benchmark/atari_10m.sh Breakout   # CleanRL: 414.66 +- 28.09
#     bash benchmark/atari_10m.sh Pong       # CleanRL: 20.36 +- 0.20
#     bash benchmark/atari_10m.sh BeamRider  # CleanRL: 1915.93 +- 484.58
#
# Time: 7-12 hours on 2 cores, 15-25 hours on one; longer than one sitting, so it runs in parts. It
# writes a checkpoint every 50 iterations (51,200 steps) and resumes from the newest one
# (--resume auto; --skip-done skips it once it has finished). To carry it to the next machine: stop
# the runner (SIGTERM), then commit the run's event files and log with its newest checkpoint
# (`git add -f runs/NAME/checkpoints/iteration-N.pt`, about 20 MB); the next
# `bash benchmark/atari_10m.sh GAME` resumes it. Once it has finished, `git rm --cached` that checkpoint.
#
#     nice -n 19 taskset -c 1 bash benchmark/atari_10m.sh Pong   # beside other work: one core, niced
set -euo pipefail
game="${1:?usage: bash benchmark/atari_10m.sh Breakout|Pong|BeamRider}"
case "$game" in
    Breakout) published="414.66" ;;
    Pong) published="20.36" ;;
    BeamRider) published="1915.93" ;;
    *) echo "atari_10m.sh: unknown game '$game' (Breakout, Pong or BeamRider: CleanRL publishes these three)" >&2; exit 2 ;;
esac
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
slug="$(echo "$game" | tr '[:upper:]' '[:lower:]')"
study="$repo/benchmark/results/${slug}_10m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids "${game}NoFrameskip-v4" --seeds 1 --workers 1 --skip-done \
    --command "python $repo/cleanrl/ppo_atari.py --total-timesteps 10000000 --checkpoint-every 50 --resume auto"

python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots" \
    --reference "CleanRL ppo_atari.py, 10M steps, 3 seeds=$published" --every 1000000
mkdir -p "$repo/docs/img/${slug}_10m"
cp "$study"/plots/*.png "$repo/docs/img/${slug}_10m/"
