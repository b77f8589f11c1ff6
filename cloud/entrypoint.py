"""The container's entrypoint: runs a job's command, and spreads it over the nodes of an AWS Batch
multi-node parallel job.

    ENTRYPOINT ["python", "/app/cloud/entrypoint.py"]                    (the Dockerfile)
    "command": ["python", "cleanrl/ppo_atari_multigpu.py", "--env-id", ...]    (the job definition)

A plain job (no `AWS_BATCH_JOB_NUM_NODES` in the environment) runs its command as it is. On each node
of a multi-node job, Batch sets `AWS_BATCH_JOB_NUM_NODES`, `AWS_BATCH_JOB_NODE_INDEX`,
`AWS_BATCH_JOB_MAIN_NODE_INDEX` and, on every node but the main one,
`AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS`. From them the entrypoint launches the script:
- a torch.distributed script (ppo_atari_multigpu.py) under `torchrun --nnodes N --node-rank R
  --master-addr A --master-port P --nproc-per-node K` (the interpreter of the command is replaced);
- a jax.distributed script (ppo_atari_envpool_xla_jax_scan.py) as it is, one process per node, with
  `JAX_COORDINATOR_ADDRESS=A:P`, `JAX_NUM_PROCESSES=N`, `JAX_PROCESS_ID=R`.
The main node gets rank 0 (torchrun's master and JAX's coordinator live there) and uses 127.0.0.1
for its own address. `MASTER_PORT` (default 29500) and `NPROC_PER_NODE` (default: the node's GPUs,
or 1 without GPU) come from the job definition's environment.
Docs: docs/cloud.md
"""

import os
import sys

DEFAULT_PORT = 29500


def fail(message: str):
    sys.exit(f"error: {message}")


def node_rank(node_index: int, main_node_index: int, num_nodes: int) -> int:
    """The rank of a node in the launch: the main node is 0 and the others follow in Batch's order."""
    return (node_index - main_node_index) % num_nodes


def split_command(command: list[str]) -> tuple[list[str], str, list[str]]:
    """(interpreter and its options, script path, script arguments) of `python [opts] script.py args`."""
    for i, word in enumerate(command):
        if word.endswith(".py"):
            interpreter = command[:i]
            if interpreter and not os.path.basename(interpreter[0]).startswith("python"):
                fail(
                    f"a multi-node job runs `python SCRIPT ...` and the entrypoint adds the launcher; "
                    f"this command starts with {interpreter[0]!r}"
                )
            return interpreter, word, command[i + 1 :]
    fail(f"no .py script in the command {' '.join(command)!r}")


def distributed_kind(script: str) -> str:
    """`jax` or `torch`: which distributed runtime the script joins (read from its source)."""
    try:
        with open(script) as f:
            source = f.read()
    except OSError:
        fail(f"no script {script!r} in {os.getcwd()} (the command's paths are relative to the image's /app)")
    if "jax.distributed" in source:
        return "jax"
    if "torch.distributed" in source:
        return "torch"
    fail(
        f"{script} does not train across nodes: a multi-node job runs cleanrl/ppo_atari_multigpu.py (torchrun) "
        "or cleanrl/ppo_atari_envpool_xla_jax_scan.py (jax.distributed)"
    )


def node_int(environ: dict, name: str) -> int:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        fail(f"{name} is missing or not an integer in this multi-node job's environment")


def launch(command: list[str], environ: dict) -> tuple[list[str], dict, str]:
    """What to execute on this node: (argv, environment, one line saying what it is)."""
    if not command:
        fail("no command: the job definition's command names the script, e.g. python cleanrl/ppo_atari.py ...")
    if "AWS_BATCH_JOB_NUM_NODES" not in environ:
        return command, dict(environ), f"entrypoint: single-node job: {' '.join(command)}"

    num_nodes = node_int(environ, "AWS_BATCH_JOB_NUM_NODES")
    node_index = node_int(environ, "AWS_BATCH_JOB_NODE_INDEX")
    main_node_index = node_int(environ, "AWS_BATCH_JOB_MAIN_NODE_INDEX")
    if not (num_nodes >= 1 and 0 <= node_index < num_nodes and 0 <= main_node_index < num_nodes):
        fail(f"node index {node_index} or main node index {main_node_index} is outside 0..{num_nodes - 1}")
    if node_index == main_node_index:
        # Batch gives the main node no address variable; its own processes reach it on the loopback.
        address = "127.0.0.1"
    elif environ.get("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"):
        address = environ["AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS"]
    else:
        fail("AWS_BATCH_JOB_MAIN_NODE_PRIVATE_IPV4_ADDRESS is missing on a node that is not the main node")
    port = node_int(environ, "MASTER_PORT") if "MASTER_PORT" in environ else DEFAULT_PORT
    rank = node_rank(node_index, main_node_index, num_nodes)
    interpreter, script, script_args = split_command(command)
    where = f"node {node_index} of {num_nodes} (main node {main_node_index}), rank {rank}, main at {address}:{port}"

    env = dict(environ)
    if distributed_kind(script) == "jax":
        env.update(
            JAX_COORDINATOR_ADDRESS=f"{address}:{port}", JAX_NUM_PROCESSES=str(num_nodes), JAX_PROCESS_ID=str(rank)
        )
        argv = (interpreter or [sys.executable]) + [script, *script_args]
        return argv, env, f"entrypoint: {where}: jax.distributed, {' '.join(argv)}"

    nproc = node_int(environ, "NPROC_PER_NODE") if "NPROC_PER_NODE" in environ else gpus_on_this_node() or 1
    # torchrun is started by this interpreter, the image's Python, whatever the command called it.
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes",
        str(num_nodes),
        "--node-rank",
        str(rank),
        "--master-addr",
        address,
        "--master-port",
        str(port),
        "--nproc-per-node",
        str(nproc),
        script,
        *script_args,
    ]
    return argv, env, f"entrypoint: {where}: torchrun, {nproc} process(es) on this node: {' '.join(argv)}"


def gpus_on_this_node() -> int:
    import torch  # only a torchrun launch needs it

    return torch.cuda.device_count()


def main():
    argv, env, description = launch(sys.argv[1:], dict(os.environ))
    print(description, flush=True)
    # exec, not a child process: the job's signals (SIGTERM at a Spot reclaim) reach the training
    # directly, and its exit status is the job's.
    try:
        os.execvpe(argv[0], argv, env)
    except OSError as e:
        fail(f"cannot run {argv[0]!r}: {e.strerror}")


if __name__ == "__main__":
    main()
