#!/usr/bin/env bash
# The ppo_atari_lstm.py learning result of docs/ppo_atari_lstm.md: Breakout, 1M steps, ours with seeds 1 and 2
# and CleanRL's ppo_atari_lstm.py with seed 1 (run unchanged but for what this stack needs, by
# benchmark/vs_cleanrl.py run-cleanrl; its Atari wrappers come from Stable-Baselines3, `pip install
# stable-baselines3`), the same hyperparameters (both scripts' defaults), one run at a time, then the plots.
# CleanRL's run is named cleanrl_ppo_atari_lstm so that the plots tell the two apart. Ours checkpoint every
# 50 iterations and resume from there; --skip-done: run this again after a stop, and only the runs that did
# not finish run (CleanRL's has no checkpoints: a stopped run of it starts over).
#
#     bash benchmark/ppo_atari_lstm_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/ppo_atari_lstm_1m/ and docs/img/ppo_atari_lstm_1m/*.png
set -euo pipefail
if [ $# -ne 1 ] || [ ! -f "$1/cleanrl/ppo_atari_lstm.py" ]; then
    echo "usage: bash benchmark/ppo_atari_lstm_1m.sh CLEANRL_CHECKOUT (a folder with cleanrl/ppo_atari_lstm.py)" >&2
    exit 2
fi
cleanrl="$(cd "$1" && pwd -P)"
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/ppo_atari_lstm_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 2 --workers 1 --skip-done \
    --command "python $repo/cleanrl/ppo_atari_lstm.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto"
python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 --workers 1 --skip-done \
    --command "python $repo/benchmark/vs_cleanrl.py run-cleanrl $cleanrl/cleanrl/ppo_atari_lstm.py --exp-name cleanrl_ppo_atari_lstm --total-timesteps 1000000"

# the mean return of the last 100 games of each run (the table's final return), and the curves
python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
mkdir -p "$repo/docs/img/ppo_atari_lstm_1m"
cp "$study"/plots/*.png "$repo/docs/img/ppo_atari_lstm_1m/"
