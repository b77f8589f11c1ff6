"""The SHA-256 of what a script learned, to show that a change to a script keeps its numbers bit for bit.

    python benchmark/param_digest.py cleanrl/ppo_atari.py --total-timesteps 3072
    torchrun --standalone --nproc-per-node 2 benchmark/param_digest.py cleanrl/ppo_atari_multigpu.py ...

Runs the script as `python SCRIPT ARGS` would (its own `__main__`), and records every tensor that a
torch optimizer is given (the learned parameters, in the order the script creates its optimizers).
When the script ends it prints `parameters sha256 <hex>` over those tensors' bytes: equal digests mean
bit-identical parameters. Scripts without a torch optimizer (the JAX one) are given `--save-model` and
the digest is taken over the saved model's parameter arrays. Run it with OMP_NUM_THREADS fixed: the
CPU's reductions may add in another order with another thread count.
"""

import atexit
import glob
import hashlib
import os
import runpy
import sys

import numpy as np
import torch

learned: list[torch.Tensor] = []
original_init = torch.optim.Optimizer.__init__


def recording_init(self, params, *args, **kwargs):
    params = list(params)
    for group in params:
        learned.extend(group["params"] if isinstance(group, dict) else [group])
    original_init(self, params, *args, **kwargs)


def digest_of(arrays) -> str:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def print_digest():
    rank = os.environ.get("RANK")
    prefix = f"rank {rank}: " if rank is not None else ""
    if learned:
        print(f"{prefix}parameters sha256 {digest_of(t.detach().float().cpu().numpy() for t in learned)}", flush=True)
        return
    models = sorted(glob.glob("runs/*/*.cleanrl_model"), key=os.path.getmtime)
    if models:  # the JAX script: its saved params (flax msgpack), leaves in their tree order
        import jax
        from flax import serialization

        with open(models[-1], "rb") as f:
            saved = serialization.msgpack_restore(f.read())
        leaves = jax.tree_util.tree_leaves(saved["params"])
        print(f"{prefix}parameters sha256 {digest_of(np.asarray(leaf) for leaf in leaves)}", flush=True)


if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    torch.optim.Optimizer.__init__ = recording_init
    atexit.register(print_digest)
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
