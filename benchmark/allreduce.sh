#!/usr/bin/env bash
# The ring-against-central figure of docs/distributed.md: one average of the Nature CNN's gradient
# (1,686,693 fp32 parameters, 6.7 MB) by gloo's ring all-reduce and by the central scheme (all to rank 0
# and back), with 2, 4, 8 and 16 processes on this machine over loopback. Communication only, no
# training: 16 processes fit on 2 cores, taking turns. Run it on a quiet machine (a few minutes on the
# project's 2 cores, most of it the 16 processes' start-up): other processes' load distorts every figure.
#
#     bash benchmark/allreduce.sh    # writes benchmark/results/allreduce.json and docs/img/allreduce.png
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmark/results docs/img
python benchmark/allreduce.py --processes 2 4 8 16 --repeats 30 --warmup 3 --json benchmark/results/allreduce.json
# the figure also draws the capped-link series of benchmark/allreduce_hosts.sh where it has been measured
hosts=$([ -f benchmark/results/allreduce_hosts.json ] && echo benchmark/results/allreduce_hosts.json || true)
python benchmark/plot.py allreduce benchmark/results/allreduce.json $hosts --out-dir docs/img
