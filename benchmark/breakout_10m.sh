#!/usr/bin/env bash
# docs/benchmarks.md, "Breakout, 10M steps": ppo_atari.py on BreakoutNoFrameskip-v4 at the published
# scale (10M agent steps, CleanRL's default hyperparameters, fp32, seed 1), against CleanRL's published
# 414.66 +- 28.09 (3 seeds). Then the curve against steps with that figure as a reference line.
# Time: 7-12 hours on 2 cores, 15-25 hours on one; longer than one sitting, so it runs in parts. It
# writes a checkpoint every 50 iterations (51,200 steps) and resumes from the newest one
# (--resume auto; --skip-done skips it once it has finished). To carry it to the next machine: stop
# the runner (SIGTERM), then commit the run's event files and log with its newest checkpoint
# (`git add -f runs/NAME/checkpoints/iteration-N.pt`, about 20 MB); the next
# `bash benchmark/breakout_10m.sh` resumes it. Once it has finished, `git rm --cached` that checkpoint.
#
#     nice -n 19 taskset -c 1 bash benchmark/breakout_10m.sh   # beside other work: one core, niced
#     bash benchmark/breakout_10m.sh                           # a machine of its own
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/breakout_10m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 --workers 1 --skip-done \
    --command "python $repo/cleanrl/ppo_atari.py --total-timesteps 10000000 --checkpoint-every 50 --resume auto"

python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots" \
    --reference "CleanRL ppo_atari.py, 10M steps, 3 seeds=414.66" --every 1000000
mkdir -p "$repo/docs/img/breakout_10m"
cp "$study"/plots/*.png "$repo/docs/img/breakout_10m/"
