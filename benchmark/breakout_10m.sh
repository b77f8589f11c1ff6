#!/usr/bin/env bash
# docs/benchmarks.md, "Breakout, 10M steps": the first of the trio, kept under its old name.
exec bash "$(dirname "$0")/atari_10m.sh" Breakout "$@"
