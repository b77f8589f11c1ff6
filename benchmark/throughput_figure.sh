#!/usr/bin/env bash
# The throughput figure of docs/benchmarks.md: the steady SPS of each scheme a user chooses among, fp32
# and bf16, against the env-only limit of each script's environment (random actions):
#   one process: ppo_atari.py, ppo_atari_envpool.py;
#   the JAX scan script (ppo_atari_envpool_xla_jax_scan.py) on 1 and on 2 XLA devices (on CPU, forced with
#       XLA_FLAGS=--xla_force_host_platform_device_count=2; the script splits its 8 envs over them);
#   ppo_atari_multigpu.py with 1 process, and with 2 under torchrun with --env-split even and with
#       --env-split measured (8 envs per process).
# Each real run is 10 iterations, in 2 interleaved rounds. The title names the CPU and its core count.
# Run it on a quiet machine: 16 minutes on the project's 2-core AVX2 EPYC (fp32 only, 2026-12-04).
# bf16 only where the CPU has AVX-512 BF16: elsewhere oneDNN has no bf16 kernels, a bf16 run is
# 8-13x slower than fp32 (docs/ppo_atari.md) and would take this over an hour more to show only that.
# PRECISIONS="none bf16" measures both anyway.
#
#     bash benchmark/throughput_figure.sh    # writes benchmark/results/throughput.json and docs/img/throughput.png
set -euo pipefail
cd "$(dirname "$0")/.."
precisions="none bf16"
if ! grep -q avx512_bf16 /proc/cpuinfo 2>/dev/null; then
    precisions="none"
    echo "note: this CPU has no AVX-512 BF16: fp32 only (PRECISIONS=\"none bf16\" for both)"
fi
mkdir -p benchmark/results
# shellcheck disable=SC2086  # the precisions are separate arguments
python benchmark/throughput.py --scripts ppo_atari ppo_atari_envpool ppo_atari_envpool_xla_jax_scan ppo_atari_multigpu \
    --xla-devices 1 2 --precisions ${PRECISIONS:-$precisions} --rounds 2 --json benchmark/results/throughput.json
python benchmark/plot.py throughput benchmark/results/throughput.json --out-dir docs/img
