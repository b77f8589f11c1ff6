#!/usr/bin/env bash
# bf16 against fp32 on this CPU, side by side: ppo_atari.py and ppo_atari_envpool.py, each timed phase by
# phase by benchmark/iteration_profile.py --ceiling (the network phases against this CPU's matmul peak),
# ROUNDS times interleaved; then oneDNN's kernels and torch's operators of one bf16 run (on a CPU with AMX,
# `brg_conv_*:..._amx` is a convolution on AMX tiles), and XLA:CPU's matmul rate in fp32 and bf16 (the JAX
# script's). Made for issue 28's AMX check, on the project's 2-core machine or another one (a GPU host,
# say): the runs are pinned to CPUS logical CPUs, each on its own
# physical core, with as many torch threads, and any GPU is hidden. CPUS=all uses the whole machine.
#
#     bash benchmark/amx_profile.sh                    # 2 CPUs, 2 rounds, about 3 minutes
#     CPUS=all ROUNDS=1 bash benchmark/amx_profile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cpus="${CPUS:-2}"
rounds="${ROUNDS:-2}"
PEAK=2048  # the square matmul of iteration_profile.py --ceiling
grep -m1 "model name" /proc/cpuinfo || true
echo "bf16 flags: $(grep -o -w -E 'amx_bf16|amx_tile|avx512_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
pin=()
if [ "$cpus" != "all" ] && ! command -v taskset > /dev/null; then
  echo "warning: no taskset here: the runs use the whole machine"
elif [ "$cpus" != "all" ]; then
  # One logical CPU of each physical core, the first $cpus of them: two hyperthreads of one core would
  # share its AMX unit.
  chosen=$(lscpu -p=CPU,CORE | grep -v '^#' | sort -t, -k2,2n -k1,1n | sort -t, -k2,2n -u | head -n "$cpus" |
    cut -d, -f1 | paste -sd,)
  pin=(taskset -c "$chosen")
  export OMP_NUM_THREADS="$cpus"
  echo "pinned to logical CPUs $chosen of $(nproc --all)"
fi
export CUDA_VISIBLE_DEVICES=""
for round in $(seq "$rounds"); do
  for script in cleanrl/ppo_atari.py cleanrl/ppo_atari_envpool.py; do
    echo "== round $round: $script"
    "${pin[@]}" python3 benchmark/iteration_profile.py --ceiling --iterations 4 --script "$script"
  done
done
echo "== oneDNN's kernels and torch's operators, ppo_atari.py bf16"
"${pin[@]}" python3 benchmark/iteration_profile.py --precisions bf16 --iterations 2 --ops --onednn
echo "== XLA:CPU's matmul rate (the JAX script's kernels), $PEAK x $PEAK, fp32 and bf16"
"${pin[@]}" python3 - <<PY || echo "(no jax here)"
import time
import jax
import jax.numpy as jnp

matmul = jax.jit(lambda a, b: a @ b)
for dtype in (jnp.float32, jnp.bfloat16):
    a = jnp.ones(($PEAK, $PEAK), dtype)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        matmul(a, a).block_until_ready()
        times.append(time.perf_counter() - start)
    print(f"{dtype.__name__}: {2 * $PEAK**3 / min(times[2:]) / 1e9:.0f} GFLOP/s (best of 5 after 2 of warm-up)")
PY
