#!/usr/bin/env bash
# The pqn_atari.py learning result of docs/benchmarks.md: Breakout, 1M steps, ours with seeds 1 and 2 and
# CleanRL's pqn_atari_envpool.py with seed 1 (run unchanged but for what this stack needs, by
# benchmark/vs_cleanrl.py's run-cleanrl), the same hyperparameters (CleanRL's defaults), one run at a
# time, then the plots. Both take the env id Breakout-v5 (envpool's name, the same game and settings in
# ours), so the runs share a panel. Ours checkpoints every 50 iterations and resumes from there;
# --skip-done: run this again after a stop, and only the runs that did not finish run (CleanRL's has no
# checkpoints: a stopped run of it starts over).
#
#     bash benchmark/pqn_atari_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/pqn_atari_1m/ and docs/img/pqn_atari_1m/*.png
set -euo pipefail
if [ $# -ne 1 ] || [ ! -f "$1/cleanrl/pqn_atari_envpool.py" ]; then
    echo "usage: bash benchmark/pqn_atari_1m.sh CLEANRL_CHECKOUT (a folder with cleanrl/pqn_atari_envpool.py)" >&2
    exit 2
fi
cleanrl="$(cd "$1" && pwd -P)"
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/pqn_atari_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids Breakout-v5 --seeds 1 2 --workers 1 --skip-done \
    --command "python $repo/cleanrl/pqn_atari.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto"
python "$repo/benchmark/run.py" --env-ids Breakout-v5 --seeds 1 --workers 1 --skip-done \
    --command "python $repo/benchmark/vs_cleanrl.py run-cleanrl $cleanrl/cleanrl/pqn_atari_envpool.py --exp-name pqn_atari_envpool --total-timesteps 1000000"

# the mean return of the last 100 games (the table's final return), and the curves
python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
mkdir -p "$repo/docs/img/pqn_atari_1m"
cp "$study"/plots/*.png "$repo/docs/img/pqn_atari_1m/"
