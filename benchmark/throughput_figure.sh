#!/usr/bin/env bash
# The throughput figure of docs/benchmarks.md: steady SPS of the four PPO Atari scripts, fp32 and
# bf16, ppo_atari_multigpu.py with 1 and 2 processes, against the env-only limit of each script's
# environment. Run it on a quiet machine: about 20 minutes on the project's 2 cores.
#
#     bash benchmark/throughput_figure.sh    # writes benchmark/results/throughput.json and docs/img/throughput.png
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmark/results
python benchmark/throughput.py --scripts ppo_atari ppo_atari_envpool ppo_atari_envpool_xla_jax_scan ppo_atari_multigpu \
    --rounds 2 --json benchmark/results/throughput.json
python benchmark/plot.py throughput benchmark/results/throughput.json --out-dir docs/img
