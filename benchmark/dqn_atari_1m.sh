#!/usr/bin/env bash
# The dqn_atari.py learning result of docs/benchmarks.md: Breakout, 1M steps, seed 1, epsilon decaying
# over the whole run (--exploration-fraction 1.0: 1M steps is early in DQN's 10M schedule). About
# 3 hours on the project's 2-core CPU (70-90 SPS with the runner's 2 threads), more than one of its
# sessions: the run writes a checkpoint every 100,000 steps (0.7-7 GB, the replay memory) and
# `--resume auto` continues it, so run this again until it prints the result.
#
#     bash benchmark/dqn_atari_1m.sh       # from anywhere; writes benchmark/results/dqn_atari_1m/ and docs/img/dqn_atari_1m/*.png
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/dqn_atari_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 --workers 1 --skip-done \
    --command "python $repo/cleanrl/dqn_atari.py --total-timesteps 1000000 --exploration-fraction 1.0 --checkpoint-every 100000 --resume auto"

# the mean return of the last 100 games (the table's final return), and the curves
python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
mkdir -p "$repo/docs/img/dqn_atari_1m"
cp "$study"/plots/*.png "$repo/docs/img/dqn_atari_1m/"
