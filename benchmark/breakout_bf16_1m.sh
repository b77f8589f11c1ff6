#!/usr/bin/env bash
# docs/benchmarks.md, "Breakout, 1M steps, bf16 against fp32": ppo_atari.py with --mixed-precision bf16,
# seeds 1-4, against fp32 seeds 1-4 (seeds 1 and 2 are the fp32 runs of breakout_1m.sh, linked here;
# seeds 3 and 4 run here), CleanRL's default hyperparameters otherwise. The bf16 runs are named
# ppo_atari_bf16 (--exp-name), so the figures draw them as a script of their own.
# Run it on a CPU with fast bf16 (AMX or AVX-512 BF16; `grep -o 'amx_bf16\|avx512_bf16' /proc/cpuinfo`):
# elsewhere autocast emulates bf16 and a run takes several times longer. The numbers of a bf16 run do
# not depend on which of the two it is: both multiply in bf16 and accumulate in fp32.
# Time: about an hour per run on one core of the 2-core machine. It runs in parts like breakout_1m.sh
# (checkpoints every 50 iterations, --resume auto, --skip-done): commit a finished run's event file and
# log; an unfinished run moves to the next machine with its newest checkpoint (`git add -f`).
#
#     nice -n 19 taskset -c 0 bash benchmark/breakout_bf16_1m.sh   # beside other work: one core, niced
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd -P)"  # the real path: --skip-done compares the commands
study="$repo/benchmark/results/breakout_bf16_1m"
mkdir -p "$study/runs"
cd "$study"   # runs/ and logs/ of this study go here
for run in "$repo"/benchmark/results/breakout_1m/runs/BreakoutNoFrameskip-v4__ppo_atari__[12]__*; do
    ln -sfn "../../breakout_1m/runs/$(basename "$run")" "runs/$(basename "$run")"
done

script="python $repo/cleanrl/ppo_atari.py --total-timesteps 1000000 --checkpoint-every 50 --resume auto"
python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 1 2 3 4 --workers 1 --skip-done \
    --command "$script --mixed-precision bf16 --exp-name ppo_atari_bf16"
python "$repo/benchmark/run.py" --env-ids BreakoutNoFrameskip-v4 --seeds 3 4 --workers 1 --skip-done \
    --command "$script"

python "$repo/benchmark/plot.py" learning --runs-dir "$study/runs" --out-dir "$study/plots" --every 250000 \
    --compare ppo_atari ppo_atari_bf16
mkdir -p "$repo/docs/img/breakout_bf16_1m"
cp "$study"/plots/*.png "$repo/docs/img/breakout_bf16_1m/"
