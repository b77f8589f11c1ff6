#!/usr/bin/env bash
# The c51_atari.py learning result of docs/c51_atari.md: Breakout, 1M steps, ours with seeds 1 and 2 and
# CleanRL's c51_atari.py with seed 1 (run as it is by benchmark/vs_cleanrl.py run-cleanrl, which gives it
# gymnasium 0.29's vector-env behaviour from outside the file), the same budget and hyperparameters (both
# scripts' defaults), one run at a time, then the plots. CleanRL's run is named cleanrl_c51_atari so that
# the plots tell the two apart.
# Memory: ours keeps a replay memory of 7.06 GB (each frame once); CleanRL's keeps a stack of 4 frames
# per step, 28 GB once its 1M-step memory is full at the end of the run: it needs a machine with about
# 32 GB (on a 24 GB one it is killed after some 600k steps).
# Time: about 2.5-3 hours per run of ours on the project's 2-core CPU, more for CleanRL's. Ours write a
# checkpoint every 100,000 steps (up to 7 GB, the replay memory) and `--resume auto` continues them, so run
# this again until it prints the result (--skip-done skips the finished runs; CleanRL's has no resume).
#
#     bash benchmark/c51_atari_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/c51_atari_1m/ and docs/img/c51_atari_1m/*.png
set -euo pipefail
cleanrl_dir="$(cd "${1:?usage: bash benchmark/c51_atari_1m.sh CLEANRL_CHECKOUT}" && pwd -P)"
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/c51_atari_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 2 --workers 1 --skip-done \
    --command "python $repo/cleanrl/c51_atari.py --total-timesteps 1000000 --checkpoint-every 100000 --resume auto"
python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 --workers 1 --skip-done \
    --command "python $repo/benchmark/vs_cleanrl.py run-cleanrl $cleanrl_dir/cleanrl/c51_atari.py --exp-name cleanrl_c51_atari --total-timesteps 1000000"

# the mean return of the last 100 games of each run (the table's final return), and the curves
python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
mkdir -p "$repo/docs/img/c51_atari_1m"
cp "$study"/plots/*.png "$repo/docs/img/c51_atari_1m/"
