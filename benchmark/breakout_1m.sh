#!/usr/bin/env bash
# The learning figures and table of docs/benchmarks.md, "Breakout, 1M steps, four scripts": the four
# PPO Atari scripts on Breakout for 1M steps, seeds 1 and 2, one run at a time (--workers 1: on the
# project's 2-core machine each single-process run gets both cores, the torchrun run one core per
# process), then the plots. ppo_atari_multigpu.py runs 2 processes of 4 envs each, so its batch
# (8 envs x 128 steps) and minibatches are those of the other three scripts.
# Time on the 2-core machine: 35-70 minutes per run, about 5-7 hours in all (about 75 minutes per run
# on an AVX2 CPU). --skip-done: when a session ends midway, running this again goes on with the runs
# that did not finish. Every command writes a checkpoint every 50 iterations (about 4 minutes of a run
# here) and resumes from it, so a runner stopped with SIGTERM loses at most that much of its run.
# A finished run's event file and log are committed (benchmark/results/breakout_1m/, see .gitignore):
# a study of several sessions keeps its finished runs even where a session's machine does not last.
# An unfinished run moves to the next machine with its directory: stop the runner (SIGTERM), then
# commit the run's event file and log with its newest checkpoint (`git add -f
# runs/NAME/checkpoints/iteration-N.pt`, about 20 MB); the next `bash benchmark/breakout_1m.sh`
# resumes it. Once it has finished, `git rm --cached` that checkpoint.
#
#     bash benchmark/breakout_1m.sh        # from anywhere; writes benchmark/results/breakout_1m/ and docs/img/breakout_1m/*.png
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/breakout_1m"
mkdir -p "$study"
cd "$study"   # runs/ and logs/ of this study go here

python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 2 --workers 1 --skip-done \
    --command "python $repo/cleanrl/ppo_atari.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto" \
              "python $repo/cleanrl/ppo_atari_envpool.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto" \
              "python $repo/cleanrl/ppo_atari_envpool_xla_jax_scan.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto" \
              "torchrun --standalone --nproc-per-node=2 $repo/cleanrl/ppo_atari_multigpu.py --local-num-envs 4 --total-timesteps 1000000 --checkpoint-every 50 --resume auto"

python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots"
# The figures go to the docs; the table (printed above, and in plots/results.md) is pasted into
# docs/benchmarks.md by hand (a .md file under docs/ would become a page of the site).
mkdir -p "$repo/docs/img/breakout_1m"
cp "$study"/plots/*.png "$repo/docs/img/breakout_1m/"
