#!/usr/bin/env bash
# The learning results of td3_continuous_action.py and ddpg_continuous_action.py in docs/benchmarks.md:
# HalfCheetah-v5, 300k steps, ours on seeds 1 and 2, CleanRL's script of the same name on seed 1 with its own
# hyperparameters (benchmark/vs_cleanrl.py run-cleanrl: patched only to run on this stack; it imports
# Stable-Baselines3's replay buffer, `pip install stable-baselines3`), one run at a time, then one figure per
# script (its three runs) and the last-10 means in plots/results.md. Ours write a checkpoint every 50,000
# steps and resume from it, and --skip-done goes on with the runs that did not finish: run this again after a
# session ended midway (CleanRL's run has no checkpoint: it starts over).
#
#     CLEANRL_DIR=~/cleanrl bash benchmark/td3_ddpg_halfcheetah_300k.sh            # both scripts
#     CLEANRL_DIR=~/cleanrl bash benchmark/td3_ddpg_halfcheetah_300k.sh ddpg       # one of them
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
cleanrl="${CLEANRL_DIR:?set CLEANRL_DIR to a checkout of CleanRL (its cleanrl/ and cleanrl_utils/)}"
algorithms=("$@")
[ ${#algorithms[@]} -gt 0 ] || algorithms=(td3 ddpg)

for algorithm in "${algorithms[@]}"; do
    script="${algorithm}_continuous_action"
    study="$repo/benchmark/results/${script}_halfcheetah_300k"
    mkdir -p "$study"
    cd "$study"   # runs/ and logs/ of this study go here
    python "$repo/benchmark/run.py" --env-ids HalfCheetah-v5 --seeds 1 2 --workers 1 --skip-done \
        --command "python $repo/cleanrl/$script.py --total-timesteps 300000 --checkpoint-every 50000 --resume auto"
    python "$repo/benchmark/run.py" --env-ids HalfCheetah-v5 --seeds 1 --workers 1 --skip-done \
        --command "python $repo/benchmark/vs_cleanrl.py run-cleanrl $cleanrl/cleanrl/$script.py --exp-name cleanrl_$script --total-timesteps 300000"
    # MuJoCo's episodes are 1,000 steps: the final return is the mean of the last 10
    python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots" --window 10
    mkdir -p "$repo/docs/img/${script}_halfcheetah_300k"
    cp "$study"/plots/*.png "$repo/docs/img/${script}_halfcheetah_300k/"
done
