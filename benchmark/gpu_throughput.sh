#!/usr/bin/env bash
# SPS of the three PPO Atari scripts side by side on a GPU machine. Each one trains Breakout for
# SECONDS_PER_RUN seconds (default 50) in fp32, then in bf16; the table gives the SPS each script
# logged last and its steady SPS (compilation and startup left out). About 6 minutes in all,
# installs included.
#
# On a machine without internet, carry the wheels along: first, where pip works,
#     bash benchmark/gpu_wheels.sh        # writes .whl/ (about 12 MB)
# then on the GPU machine, from the repository root,
#     bash benchmark/gpu_throughput.sh    # extra arguments go to benchmark/throughput.py
# The machine must already have torch and jax with CUDA, flax, optax, tensorboard and numpy.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
  tar -xzf .whl/envpool-*-atari-cp312.tar.gz -C /tmp/site
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed from .whl/ in $(( $(date +%s) - started )) s"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "no nvidia-smi"
python3 -c "import torch, jax; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), '| jax', jax.__version__, jax.devices())"
python3 benchmark/throughput.py --real-only --seconds "${SECONDS_PER_RUN:-50}" --rounds 1 "$@"
echo "gpu_throughput.sh: $(( $(date +%s) - started )) s in all"
