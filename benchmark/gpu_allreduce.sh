#!/usr/bin/env bash
# benchmark/allreduce.sh on a GPU machine: ring against central averaging of the Nature CNN's gradient
# with NCCL, one process per GPU, for 2, 4, 8 and 16 processes as far as the machine has GPUs
# (NCCL_ALGO=Ring keeps NCCL on its ring; without it NCCL may choose a tree or NVLink SHARP), then the
# same with gloo on this machine's CPU cores. A machine with one GPU gets the gloo part only: NCCL puts
# one process on each GPU, and two processes of one communicator cannot share a GPU.
#
#     bash benchmark/gpu_allreduce.sh    # from the repository root; writes to $OUT, else benchmark/results
# The machine must already have torch with CUDA, matplotlib and tensorboard (for benchmark/plot.py).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-benchmark/results}"
mkdir -p "$out"
started=$(date +%s)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
gpus=$(python3 -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
counts=()
for n in 2 4 8 16; do
  if [ "$n" -le "$gpus" ]; then counts+=("$n"); fi
done
if [ "${#counts[@]}" -gt 0 ]; then
  NCCL_ALGO=Ring python3 benchmark/allreduce.py --backend nccl --processes "${counts[@]}" --repeats 30 \
      --json "$out/allreduce_nccl.json"
  python3 benchmark/plot.py allreduce "$out/allreduce_nccl.json" --out-dir "$out/nccl"
else
  echo "note: $gpus GPU(s) here: NCCL runs one process per GPU, so its rows need 2 or more; gloo only"
fi
python3 benchmark/allreduce.py --processes 2 4 8 16 --repeats 30 --json "$out/allreduce_gloo.json"
python3 benchmark/plot.py allreduce "$out/allreduce_gloo.json" --out-dir "$out/gloo"
echo "gpu_allreduce.sh: $(( $(date +%s) - started )) s in all"
