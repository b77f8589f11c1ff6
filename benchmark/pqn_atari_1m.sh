#!/usr/bin/env bash
# The pqn_atari.py learning result of docs/pqn_atari.md: Breakout, 1M steps, ours (seeds 1, 2) against CleanRL's
# pqn_atari_envpool.py (seed 1), by benchmark/atari_1m_vs_cleanrl.sh. Both take the env id Breakout-v5 (envpool's
# name, the same game and settings in ours), so the runs share a panel. Ours checkpoint every 50 iterations.
#
#     bash benchmark/pqn_atari_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/pqn_atari_1m/ and docs/img/pqn_atari_1m/*.png
set -euo pipefail
exec bash "$(dirname "$0")/atari_1m_vs_cleanrl.sh" "${1:?usage: bash benchmark/pqn_atari_1m.sh CLEANRL_CHECKOUT}" \
    pqn_atari pqn_atari_envpool Breakout-v5 50
