#!/usr/bin/env bash
# The tuning study of docs/tuning.md, "Benchmark: PPO on CartPole-v1": benchmark/tune.py searches five
# hyperparameters of cleanrl/ppo.py (learning rate, minibatches, update epochs, clipping, entropy
# coefficient) in 30 trials of 2 seeds x 100,000 steps (a minute or two per run on one core), with the
# median pruner; the same study is timed with 1 and with 2 trials at a time (two studies of their own,
# the same sampler seed). Then the best configuration of the 2-worker study and CleanRL's defaults are
# trained on 5 fresh seeds (11-15), with the same 100,000 steps, and compared by benchmark/plot.py.
# Time on the project's 2-core machine: about 1-2 hours per study, 10-20 minutes for the final runs.
# Each step goes on where it stopped when this script is run again (the studies live in
# benchmark/results/tune_cartpole/tune/optuna.db; run.py --skip-done skips the finished final runs).
#
#     bash benchmark/tune_cartpole.sh      # from anywhere; writes benchmark/results/tune_cartpole/ and docs/img/tune_cartpole/
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"
study_dir="$repo/benchmark/results/tune_cartpole"
mkdir -p "$study_dir"
cd "$study_dir"   # runs/, logs/ and tune/ of this study go here

search=(
    --command "python $repo/cleanrl/ppo.py --total-timesteps 100000"
    --env-ids CartPole-v1 --seeds 1 2 --n-trials 30 --seed 1
    --param learning-rate=log:1e-4:1e-2 --param num-minibatches=choice:1,2,4,8 --param update-epochs=int:1:10
            --param clip-coef=float:0.1:0.4 --param ent-coef=float:0:0.05
    --pruner median --pruner-startup-trials 5 --pruner-warmup-steps 30000 --report-every 10000
    --window 100 --status-interval 300
)
for workers in 1 2; do
    start=$(date +%s)
    python "$repo/benchmark/tune.py" "${search[@]}" --workers "$workers" --study-name "ppo-cartpole-$workers-workers"
    echo "study with $workers worker(s): $(( $(date +%s) - start )) s (a study continued after a stop counts only its last part)"
done

# The best trial of the 2-worker study, as the script command that reproduces it.
best=$(python - <<EOF
import optuna
study = optuna.load_study(study_name="ppo-cartpole-2-workers", storage="sqlite:///$study_dir/tune/optuna.db")
print(study.best_trial.user_attrs["command"])
EOF
)
echo "best configuration: $best"
python "$repo/benchmark/run.py" --env-ids CartPole-v1 --seeds 11 12 13 14 15 --workers 2 --skip-done \
    --command "$best --exp-name tuned" "python $repo/cleanrl/ppo.py --total-timesteps 100000 --exp-name defaults"

# The fresh seeds' learning curves and table (final return: the mean of each run's last 100 games).
mkdir -p "$study_dir/final_runs"
for run in runs/CartPole-v1__tuned__* runs/CartPole-v1__defaults__*; do
    ln -sfn "$study_dir/$run" "$study_dir/final_runs/$(basename "$run")"
done
python "$repo/benchmark/plot.py" learning --runs-dir "$study_dir/final_runs" --out-dir "$study_dir/plots"
mkdir -p "$repo/docs/img/tune_cartpole"
cp "$study_dir"/plots/returns_vs_steps.png "$repo/docs/img/tune_cartpole/"
cp "$study_dir"/tune/ppo-cartpole-2-workers/*.png "$repo/docs/img/tune_cartpole/"
