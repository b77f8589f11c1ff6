#!/usr/bin/env bash
# The parameters sha256 of a fixed-seed short CPU run of each script (3 PPO iterations, or a few
# thousand steps for the off-policy scripts), one thread, in a scratch folder: the same digest before
# and after a change to a script means the change kept its numbers bit for bit. Compare digests of one
# kind of CPU only: oneDNN picks its convolution kernels by the CPU's vector instructions, and the same
# code gave the Atari scripts other digests on an AMD EPYC with AVX-512 BF16 than on an earlier
# machine (the MLP scripts' digests matched). `bash benchmark/param_digests.sh OLD_CHECKOUT` gives the
# old side on the same machine. A run that gives no digest prints FAILED with its last error line, and the
# script exits 1: two blank tables must not read as "unchanged".
#
#     bash benchmark/param_digests.sh [REPO]    # REPO: the checkout whose scripts run (default: this one)
set -uo pipefail
here="$(cd "$(dirname "$0")/.." && pwd -P)"
repo="$(cd "${1:-$here}" && pwd -P)"
scratch="$(mktemp -d)"
cd "$scratch"
export OMP_NUM_THREADS=1 MUJOCO_GL=egl
digest() {  # name, then the command's words after `python`
    local name="$1"; shift
    local line
    line="$("$@" 2>"$scratch/$name.err" | grep -E '^(rank 0: )?parameters sha256' | tail -1)"
    if [ -z "$line" ]; then  # a blank digest on both sides would read as "unchanged"
        printf '| %s | FAILED: %s |\n' "$name" "$(grep -v '^\s*$' "$scratch/$name.err" | tail -1)"
        failed=1
    else
        printf '| %s | %s |\n' "$name" "${line##* }"
    fi
}
failed=0
tool="$here/benchmark/param_digest.py"
echo "| script | parameters sha256 |"
echo "|---|---|"
digest ppo.py python "$tool" "$repo/cleanrl/ppo.py" --total-timesteps 1536
digest ppo_atari.py python "$tool" "$repo/cleanrl/ppo_atari.py" --total-timesteps 3072
digest ppo_atari_envpool.py python "$tool" "$repo/cleanrl/ppo_atari_envpool.py" --total-timesteps 3072
digest ppo_atari_multigpu.py torchrun --standalone --nproc-per-node 2 "$tool" "$repo/cleanrl/ppo_atari_multigpu.py" \
    --local-num-envs 4 --total-timesteps 3072
digest ppo_atari_envpool_xla_jax_scan.py python "$tool" "$repo/cleanrl/ppo_atari_envpool_xla_jax_scan.py" \
    --total-timesteps 3072 --save-model --eval-episodes 1
digest dqn.py python "$tool" "$repo/cleanrl/dqn.py" --total-timesteps 3000 --learning-starts 1000
digest dqn_atari.py python "$tool" "$repo/cleanrl/dqn_atari.py" --total-timesteps 3000 --learning-starts 1000 \
    --buffer-size 10000
digest ppo_continuous_action.py python "$tool" "$repo/cleanrl/ppo_continuous_action.py" --total-timesteps 6144
digest sac_continuous_action.py python "$tool" "$repo/cleanrl/sac_continuous_action.py" --total-timesteps 2000 \
    --learning-starts 1000
rm -rf "$scratch"
exit "$failed"
