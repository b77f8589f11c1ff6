#!/usr/bin/env bash
# A learning study of one Atari script against CleanRL's counterpart: 1M steps, ours with seeds 1 and 2 and
# CleanRL's script with seed 1 (run unchanged but for what this stack needs, by benchmark/vs_cleanrl.py
# run-cleanrl), the same hyperparameters (both scripts' defaults), one run at a time, then the plots. CleanRL's
# run is named cleanrl_CLEANRL_SCRIPT so that the plots tell the two apart. Ours checkpoint every
# CHECKPOINT_EVERY (iterations or steps, as the script counts them) and resume from there; --skip-done: run this
# again after a stop and only the runs that did not finish run (CleanRL's have no checkpoints: they start over).
# benchmark/pqn_atari_1m.sh, ppo_atari_lstm_1m.sh and c51_atari_1m.sh call it.
#
#     bash benchmark/atari_1m_vs_cleanrl.sh CLEANRL_CHECKOUT SCRIPT CLEANRL_SCRIPT ENV_ID CHECKPOINT_EVERY
#     # writes benchmark/results/SCRIPT_1m/ and docs/img/SCRIPT_1m/*.png
set -euo pipefail
if [ $# -ne 5 ] || [ ! -f "$1/cleanrl/$3.py" ]; then
    echo "usage: bash benchmark/atari_1m_vs_cleanrl.sh CLEANRL_CHECKOUT SCRIPT CLEANRL_SCRIPT ENV_ID CHECKPOINT_EVERY" \
        "(CLEANRL_CHECKOUT: a folder with cleanrl/CLEANRL_SCRIPT.py)" >&2
    exit 2
fi
cleanrl="$(cd "$1" && pwd -P)"
script=$2 cleanrl_script=$3 env_id=$4 checkpoint_every=$5
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/${script}_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids "$env_id" --seeds 1 2 --workers 1 --skip-done \
    --command "python $repo/cleanrl/$script.py --total-timesteps 1000000 --checkpoint-every $checkpoint_every --resume auto"
python "$repo/benchmark/run.py" --env-ids "$env_id" --seeds 1 --workers 1 --skip-done \
    --command "python $repo/benchmark/vs_cleanrl.py run-cleanrl $cleanrl/cleanrl/$cleanrl_script.py --exp-name cleanrl_$cleanrl_script --total-timesteps 1000000"

# the mean return of the last 100 games of each run (the table's final return), and the curves
python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
mkdir -p "$repo/docs/img/${script}_1m"
cp "$study"/plots/*.png "$repo/docs/img/${script}_1m/"
