#!/bin/bash
# One cleanrl/ppo_atari_multigpu.py run on several nodes of a Slurm cluster: srun starts one torchrun per
# node, and the torchruns meet at a c10d rendezvous on the job's first node (no ssh, no MPI). Submit it from
# the checkout, with the script's arguments after this file's name (of a flag given twice, the last wins):
#
#   sbatch benchmark/slurm_multinode.sh --env-id PongNoFrameskip-v4 --total-timesteps 10000000
#   sbatch --nodes=4 --gpus-per-node=4 --partition=gpu benchmark/slurm_multinode.sh --local-num-envs 8
#
# Each node runs one process per GPU that Slurm gives it (SLURM_GPUS_ON_NODE), or one without GPUs. The run
# writes runs/ in the job's working folder (sbatch --chdir=FOLDER; default: the checkout), the same path on
# every node. A job that loses a node is requeued (--requeue) once Slurm marks the node DOWN, and its next
# start resumes from the newest checkpoint (--checkpoint-every, --resume auto). docs/cluster.md: the recipe.
#SBATCH --job-name=ppo-multinode
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail

checkout=${SLURM_SUBMIT_DIR:?submit this script with sbatch, from the checkout}
script=$checkout/cleanrl/ppo_atari_multigpu.py
if [[ ! -f $script ]]; then
  echo "error: no $script: submit from the checkout (cd cleanrl-fast && sbatch benchmark/slurm_multinode.sh ...)" >&2
  exit 1
fi
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export PYTHONUNBUFFERED=1
echo "job $SLURM_JOB_ID, start $((${SLURM_RESTART_COUNT:-0} + 1)): nodes $SLURM_JOB_NODELIST, rendezvous $head:29400, in $PWD"
# --max-restarts: a worker that dies is restarted with the others from the newest checkpoint; a lost node
# leaves the others waiting at the rendezvous until Slurm marks it DOWN and requeues the job.
srun torchrun --nnodes="$SLURM_NNODES" --nproc-per-node="${SLURM_GPUS_ON_NODE:-1}" \
  --rdzv-backend=c10d --rdzv-endpoint="$head:29400" --rdzv-id="$SLURM_JOB_ID" --rdzv-conf=read_timeout=300 \
  --max-restarts=3 "$script" --checkpoint-every 50 --resume auto "$@"
