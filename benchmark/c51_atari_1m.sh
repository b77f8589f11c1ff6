#!/usr/bin/env bash
# The c51_atari.py learning result of docs/c51_atari.md: Breakout, 1M steps, ours (seeds 1, 2) against CleanRL's
# c51_atari.py (seed 1), by benchmark/atari_1m_vs_cleanrl.sh; CleanRL's run is named cleanrl_c51_atari.
# Memory: ours keeps a replay memory of 7.06 GB (each frame once); CleanRL's keeps a stack of 4 frames
# per step, 28 GB once its 1M-step memory is full at the end of the run: it needs a machine with about
# 32 GB (on a 24 GB one it is killed after some 600k steps).
# Time: about 2.5-3 hours per run of ours on the project's 2-core CPU, more for CleanRL's. Ours write a
# checkpoint every 100,000 steps (up to 7 GB, the replay memory) and `--resume auto` continues them, so run
# this again until it prints the result (--skip-done skips the finished runs; CleanRL's has no resume).
#
#     bash benchmark/c51_atari_1m.sh ~/cleanrl   # a CleanRL checkout; writes benchmark/results/c51_atari_1m/ and docs/img/c51_atari_1m/*.png
set -euo pipefail
exec bash "$(dirname "$0")/atari_1m_vs_cleanrl.sh" "${1:?usage: bash benchmark/c51_atari_1m.sh CLEANRL_CHECKOUT}" \
    c51_atari c51_atari BreakoutNoFrameskip-v4 100000
