#!/usr/bin/env bash
# The ppo_atari_lstm.py learning result of docs/ppo_atari_lstm.md: Breakout, 1M steps, ours (seeds 1, 2) against
# CleanRL's ppo_atari_lstm.py (seed 1; its Atari wrappers come from Stable-Baselines3, `pip install
# stable-baselines3`), by benchmark/atari_1m_vs_cleanrl.sh. Ours checkpoint every 50 iterations.
#
#     bash benchmark/ppo_atari_lstm_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/ppo_atari_lstm_1m/ and docs/img/ppo_atari_lstm_1m/*.png
set -euo pipefail
exec bash "$(dirname "$0")/atari_1m_vs_cleanrl.sh" "${1:?usage: bash benchmark/ppo_atari_lstm_1m.sh CLEANRL_CHECKOUT}" \
    ppo_atari_lstm ppo_atari_lstm BreakoutNoFrameskip-v4 50
