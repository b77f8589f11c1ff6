#!/usr/bin/env bash
# The commands behind the tables of docs/benchmarks.md and of the script pages that were measured
# before benchmark/run.py existed, as they were run (each line alone reproduces one table; all of
# them take several hours on the project's 2-core machine).
set -euo pipefail
cd "$(dirname "$0")/.."

# Learning: CartPole 3 seeds, Breakout 1M steps one seed per script (docs/benchmarks.md, "Learning")
python benchmark/learning.py --script ppo --seeds 1 2 3 -- --env-id CartPole-v1 --total-timesteps 500000
python benchmark/learning.py --script ppo_atari --seeds 1 -- --total-timesteps 1000000
python benchmark/learning.py --script ppo_atari_envpool_xla_jax_scan --seeds 1 -- --env-id Breakout-v5 --total-timesteps 1000000
python benchmark/learning.py --script ppo_atari_envpool --seeds 1 -- --env-id Breakout-v5 --total-timesteps 1000000

# Throughput on CPU: ppo_atari.py alone, 3 rounds; all three scripts, 2 rounds ("Throughput on CPU")
python benchmark/throughput.py --scripts ppo_atari --rounds 3
python benchmark/throughput.py

# Scaling and gradient sync of ppo_atari_multigpu.py (docs/ppo_atari_multigpu.md, "Gradient sync" and "Throughput")
python benchmark/multigpu.py
