#!/usr/bin/env bash
# The throughput figure of docs/benchmarks.md: steady SPS of the four PPO Atari scripts, fp32 and
# bf16, ppo_atari_multigpu.py with 1 and 2 processes, against the env-only limit of each script's
# environment. Run it on a quiet machine: about 20 minutes on the project's 2 cores.
# bf16 only where the CPU has AVX-512 BF16: elsewhere oneDNN has no bf16 kernels, a bf16 run is
# 8-13x slower than fp32 (docs/ppo_atari.md) and would take this an hour more to show only that.
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
    --precisions ${PRECISIONS:-$precisions} --rounds 2 --json benchmark/results/throughput.json
python benchmark/plot.py throughput benchmark/results/throughput.json --out-dir docs/img
