#!/usr/bin/env bash
# Ring against central averaging across hosts (docs/distributed.md#ring-against-central-averaging): one
# average of the Nature CNN's gradient (6.75 MB) with 2, 4 and 8 hosts of benchmark/hosts.py, one worker
# process per host, gloo over the hosts' links, every link capped at 1 Gbit/s, then at 100 Mbit/s (tbf,
# both ways). A simulated network: every host is a network namespace of this one machine, and the workers
# share its cores. Needs root. A few minutes (8 hosts at 100 Mbit/s: about 4 s per central average), so few
# rounds; run it on a quiet machine.
#
#     bash benchmark/allreduce_hosts.sh   # writes benchmark/results/allreduce_hosts.json and docs/img/allreduce.png
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p benchmark/results docs/img
root=$(mktemp -d /tmp/allreduce-hosts.XXXXXX)
trap 'rm -rf "$root"' EXIT
python benchmark/allreduce.py --hosts "$root" --processes 2 4 8 --rate 1gbit 100mbit --repeats 5 --warmup 1 \
    --json benchmark/results/allreduce_hosts.json
python benchmark/plot.py allreduce benchmark/results/allreduce.json benchmark/results/allreduce_hosts.json --out-dir docs/img
