"""Throughput of the PPO Atari scripts against their serial bounds, measured in one run.

For each script and precision it measures, on the same machine and one after the other:
  env   - seconds per vector step of the script's own vector env under random actions (for the
          JAX script: envpool's XLA step inside a compiled scan, as its rollout runs it);
  nn    - seconds of one iteration's network work on random data of the real shapes
          (num_steps rollout forwards of num_envs observations, then the whole update);
  real  - the script's own training run: the SPS it logs last (the first iteration's warm-up included)
          and its steady SPS (from the wall times of its charts/SPS events, first iteration left out).
The serial bound is batch_size / (num_steps * env + nn): what a loop that does nothing but step
the envs and run the network could reach. The steady SPS over the bound is the script's overhead.
This machine's speed drifts by tens of percent within minutes, so every measurement is repeated
in `--rounds` rounds, interleaved, and the table shows medians.

    python benchmark/throughput.py                       # all three scripts, fp32 and bf16
    python benchmark/throughput.py --scripts ppo_atari --precisions none --rounds 1
    python benchmark/throughput.py --real-only --seconds 40     # on a GPU: benchmark/gpu_throughput.sh
    python benchmark/throughput.py --scripts ppo_atari ppo_atari_multigpu --json throughput.json
    python benchmark/throughput.py --scripts ppo_atari_envpool_xla_jax_scan --xla-devices 1 2  # 1 and 2 XLA devices
    python benchmark/plot.py throughput throughput.json  # the figure of a run written with --json

Besides one process, the schemes a user chooses among (the real runs of each; env and nn are measured
once per script, in one process on one device):
  `ppo_atari_multigpu` (not in the default list): 1 process, then 2 under torchrun with
      `--env-split even` and with `--env-split measured` (each process with --num-envs environments;
      torchrun gives each process one thread; --split-every 3, so that the split can move within a
      run of 10 iterations). Its environment and network are ppo_atari's: real runs only.
  the JAX script with each of `--xla-devices` XLA devices (default 1): 2 or more are forced on the
      CPU with XLA_FLAGS=--xla_force_host_platform_device_count, and the script splits --num-envs
      over them. The env-only limit is the script's, for the same number of envs; the serial bound
      holds for one device only. On a GPU the devices are the GPUs: a count the run does not get is
      left out with a note.
The env-only and NN-only measurements are written for the CPU; --real-only leaves them out.
"""

import argparse
import importlib
import json
import multiprocessing
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.events import scalars, steady_sps  # noqa: E402
from benchmark.ppo_update import ppo_update  # noqa: E402
from benchmark.run import cpu_model  # noqa: E402  (the runner's logs name the CPU alike)

SCRIPTS = ["ppo_atari", "ppo_atari_envpool", "ppo_atari_envpool_xla_jax_scan"]
JAX_SCRIPT = "ppo_atari_envpool_xla_jax_scan"
TORCHRUN_SCRIPT = "ppo_atari_multigpu"  # real runs with 1 and 2 processes
SPLIT_EVERY = 3  # --split-every of its --env-split measured runs
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
PRECISION_NAMES = {"none": "fp32", "bf16": "bf16"}


def in_fresh_process(function, *args):
    """Runs function(*args) in a new Python process, as each script runs in its own: no thread
    pool, allocator setting or compilation cache is shared between measurements."""
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def load_script(script: str):
    return importlib.import_module(f"cleanrl.{script}")


def measure_env(script: str, env_id: str, num_envs: int, num_steps: int) -> float:
    """Seconds per vector step with random actions, through the same interface as the script."""
    module = load_script(script)
    if script == "ppo_atari":
        envs = module.make_envs(env_id, num_envs, 0.0)
    else:
        envs = module.make_envs(env_id, num_envs, 0.0, seed=0, max_episode_steps=27_000)
    envs.reset()
    num_actions = int(envs.single_action_space.n)
    if script == JAX_SCRIPT:
        import jax

        handle, _, _, step_env = envs.xla()

        def step(handle, key):
            handle, _ = step_env(handle, jax.random.randint(key, (num_envs,), 0, num_actions))
            return handle, None

        play = jax.jit(lambda handle, key: jax.lax.scan(step, handle, jax.random.split(key, num_steps))[0])
        handle = jax.block_until_ready(play(handle, jax.random.key(0)))  # compile and warm up
        start = time.perf_counter()
        jax.block_until_ready(play(handle, jax.random.key(1)))
    else:
        rng = np.random.default_rng(0)
        for _ in range(20):  # warm up the threads
            envs.step(rng.integers(0, num_actions, num_envs))
        start = time.perf_counter()
        for _ in range(num_steps):
            envs.step(rng.integers(0, num_actions, num_envs))
    seconds = (time.perf_counter() - start) / num_steps
    envs.close()
    return seconds


def measure_nn(script: str, num_envs: int, num_steps: int, precision: str) -> float:
    """Seconds of one iteration's network work: the rollout forwards and the update."""
    measure = measure_nn_jax if script == JAX_SCRIPT else measure_nn_torch
    return measure(load_script(script), num_envs, num_steps, precision)


def measure_nn_torch(module, num_envs: int, num_steps: int, precision: str, repeats: int = 2) -> float:
    # The allocator as the script's main sets it (kept freed memory: 6-17% faster updates, far fewer page
    # faults); this runs in a fresh process, as the script would.
    getattr(module, "keep_freed_memory", lambda: None)()
    args = module.Args(num_envs=num_envs, num_steps=num_steps)
    batch_size = num_envs * num_steps
    agent = module.Agent(4).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    autocast = lambda: torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16")
    obs = torch.randint(0, 256, (batch_size, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (batch_size,))
    logprobs, advantages, returns, values = torch.randn(4, batch_size)

    def one_iteration():
        for step in range(num_steps):
            with torch.inference_mode(), autocast():
                agent.get_action_and_value(obs[step * num_envs : (step + 1) * num_envs])
        ppo_update(module, agent, optimizer, args, (obs, actions, logprobs, advantages, returns, values), autocast)

    one_iteration()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        one_iteration()
    return (time.perf_counter() - start) / repeats


def measure_nn_jax(module, num_envs: int, num_steps: int, precision: str, repeats: int = 2) -> float:
    """The same for the JAX script, with its own functions: the forwards as one compiled scan, the
    update as the script runs it (one compiled program), on one device."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    args = module.Args(num_envs=num_envs, num_steps=num_steps, mixed_precision=precision)
    args.num_devices, args.local_num_envs = 1, num_envs
    args.local_batch_size = args.batch_size = num_envs * num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    agent = module.Agent(4, jnp.bfloat16 if precision == "bf16" else jnp.float32)
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.scale_by_adam(eps=1e-5))
    params = module.init_params(agent, jax.random.key(0))
    train_state = module.TrainState(params, tx.init(params))

    keys = jax.random.split(jax.random.key(1), 4)
    obs = jax.random.randint(keys[0], (num_steps, num_envs, 4, 84, 84), 0, 256).astype(jnp.uint8)
    forward = lambda params, obs, key: agent.apply(params, obs, key, method=module.Agent.get_action_and_value)
    forwards = jax.jit(
        lambda params, obs, key: jax.lax.scan(
            lambda _, x: (None, forward(params, *x)), None, (obs, jax.random.split(key, num_steps))
        )[1]
    )
    batch_size = args.batch_size
    uniform = jax.random.uniform(keys[1], (3, batch_size))
    batch = module.Batch(
        obs.reshape((batch_size, 4, 84, 84)),
        jax.random.randint(keys[2], (batch_size,), 0, 4),
        jnp.log(uniform[0] * 0.9 + 0.05),
        uniform[1],
        uniform[2] - 0.5,
        uniform[1] + uniform[2] - 0.5,
        jnp.ones(batch_size, bool),
    )
    perms = jax.vmap(lambda k: jax.random.permutation(k, batch_size))(jax.random.split(keys[3], args.update_epochs))

    # Everything lives on a one-device mesh from the start, as in the script: an input that changes
    # placement between calls would be compiled for again inside the timed iterations.
    mesh = Mesh(np.array(jax.devices()[:1]), ("devices",))
    train_state, obs, batch, perms = jax.device_put(
        (train_state, obs, batch, perms), NamedSharding(mesh, PartitionSpec())
    )
    sharded = lambda f, num_inputs: jax.jit(
        jax.shard_map(
            f, mesh=mesh, in_specs=(PartitionSpec(),) * num_inputs, out_specs=PartitionSpec(), check_vma=False
        )
    )
    update_all = sharded(partial(module.update_epochs, agent=agent, tx=tx, args=args, axis_name="devices"), 4)
    update = lambda train_state: update_all(train_state, batch, perms, args.learning_rate)[0]

    def one_iteration(train_state):
        jax.block_until_ready(forwards(train_state.params, obs, keys[0]))
        return jax.block_until_ready(update(train_state))

    train_state = one_iteration(train_state)  # compile and warm up
    start = time.perf_counter()
    for _ in range(repeats):
        train_state = one_iteration(train_state)
    return (time.perf_counter() - start) / repeats


class Configuration(NamedTuple):
    """One way to run a script: with torchrun's processes and --env-split for the torchrun script, on a
    number of XLA devices for the JAX script (None where the script has no such choice)."""

    script: str
    processes: int = 1
    env_split: str | None = None
    xla_devices: int | None = None


def configurations(scripts: list[str], xla_devices: Sequence[int] = (1,)) -> list[Configuration]:
    """The configurations of each script, in the order of `scripts`: the torchrun script with 1 process, then
    with 2 and each --env-split; the JAX script on each of `xla_devices`."""
    found = []
    for script in scripts:
        if script == TORCHRUN_SCRIPT:
            found += [
                Configuration(script, 1, "even"),
                Configuration(script, 2, "even"),
                Configuration(script, 2, "measured"),
            ]
        elif script == JAX_SCRIPT:
            found += [Configuration(script, xla_devices=n) for n in xla_devices]
        else:
            found.append(Configuration(script))
    return found


def label(configuration: Configuration) -> str:
    script, processes, env_split, xla_devices = configuration
    if script == TORCHRUN_SCRIPT:
        return f"{script} x{processes}" + (f", {env_split} split" if processes > 1 else "")
    if xla_devices is not None:
        return f"{script}, {xla_devices} XLA device{'s' if xla_devices > 1 else ''}"
    return script


def real_run(
    configuration: Configuration, env_id: str, num_envs: int, num_steps: int, total_timesteps: int, precision: str
) -> tuple[list[str], dict]:
    """The command line and the environment of a configuration's training run."""
    script, processes, env_split, xla_devices = configuration
    launcher = [TORCHRUN, "--standalone", f"--nproc-per-node={processes}"] if processes > 1 else [sys.executable]
    command = [*launcher, os.path.join(REPO_ROOT, "cleanrl", f"{script}.py"), "--env-id", env_id]
    command += ["--local-num-envs" if script == TORCHRUN_SCRIPT else "--num-envs", str(num_envs)]
    command += ["--num-steps", str(num_steps), "--total-timesteps", str(total_timesteps)]
    command += ["--mixed-precision", precision]
    if env_split is not None:
        command += ["--env-split", env_split]
    if env_split == "measured":  # the default --split-every (10) would not move the split within a 10-iteration run
        command += ["--split-every", str(SPLIT_EVERY)]
    environment = dict(os.environ)
    if xla_devices is not None and xla_devices > 1:  # XLA:CPU makes this many devices of the host's cores
        flag = f"--xla_force_host_platform_device_count={xla_devices}"
        environment["XLA_FLAGS"] = f"{environment.get('XLA_FLAGS', '')} {flag}".strip()
    return command, environment


def measure_real(
    configuration: Configuration,
    env_id: str,
    num_envs: int,
    num_steps: int,
    iterations: int,
    precision: str,
    seconds: float | None = None,
):
    """The configuration's training run: (the SPS it logged last, its steady SPS after the first iteration).

    With `seconds`, the run has a budget it cannot finish and is interrupted after that long; the
    iterations its TensorBoard writer had flushed by then are the measurement. Under torchrun each
    process has `num_envs` environments; the JAX script splits `num_envs` over its XLA devices.
    """
    processes, xla_devices = configuration.processes, configuration.xla_devices
    total_timesteps = processes * num_envs * num_steps * (iterations if seconds is None else 10**6)
    command, environment = real_run(configuration, env_id, num_envs, num_steps, total_timesteps, precision)
    with tempfile.TemporaryDirectory() as workdir:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=workdir, env=environment
        )
        try:
            stdout, stderr = process.communicate(timeout=seconds)
            if process.returncode != 0:
                sys.exit(f"error: {' '.join(command)} failed:\n{stderr[-2000:]}")
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGINT)
            try:
                stdout, _ = process.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # stuck in native code: the events on disk will do
                process.kill()
                stdout, _ = process.communicate()
        (run_dir,) = os.listdir(os.path.join(workdir, "runs"))
        events = scalars(os.path.join(workdir, "runs", run_dir), "charts/SPS")
    if xla_devices is not None and xla_devices > 1:
        # The forced count makes CPU devices only: on a GPU the script runs on the GPUs it finds.
        had = re.search(r"^(\d+) (\w+) device\(s\)", stdout, re.MULTILINE)
        if had is None or int(had[1]) != xla_devices:
            devices = f"{had[1]} {had[2]}" if had else "an unknown number of"
            print(f"{label(configuration)} {precision}: left out, the run had {devices} device(s)")
            return float("nan"), float("nan")
    if len(events) < 2:
        print(f"{label(configuration)} {precision}: {len(events)} iterations logged, too few; give it more --seconds")
        return float("nan"), float("nan")
    return events[-1].value, steady_sps(events)


def summarize(
    samples: dict,
    scripts: list[str],
    precisions: list[str],
    batch_size: int,
    num_steps: int,
    num_envs: int,
    xla_devices: Sequence[int] = (1,),
) -> list[dict]:
    """One row per configuration and precision: the medians over the rounds of what was measured (None for
    what was not). samples: (script, precision or None, "env" or "nn") and (configuration, precision,
    "reported" or "steady") -> one value per round. The env-only limit is the script's (the same envs in
    every configuration of one script); the serial bound holds for one process on one device only."""
    median = lambda *key: statistics.median(samples[key]) if key in samples else None
    rows = []
    for configuration in configurations(scripts, xla_devices):
        script = configuration.script
        env_seconds = median(script, None, "env")
        one_device = configuration.processes == 1 and configuration.xla_devices in (None, 1)
        for precision in precisions:
            nn_seconds = median(script, precision, "nn")
            steady = median(configuration, precision, "steady")
            measured = env_seconds is not None and nn_seconds is not None and one_device
            bound = batch_size / (num_steps * env_seconds + nn_seconds) if measured else None
            rows.append(
                {
                    "script": script,
                    "processes": configuration.processes,
                    "env_split": configuration.env_split,
                    "xla_devices": configuration.xla_devices,
                    "precision": PRECISION_NAMES[precision],
                    "env_ms_per_step": None if env_seconds is None else env_seconds * 1e3,
                    "env_only_sps": None if env_seconds is None else num_envs / env_seconds,
                    "nn_s_per_iteration": nn_seconds if one_device else None,
                    "bound_sps": bound,
                    "logged_sps": median(configuration, precision, "reported"),
                    "steady_sps": steady,
                    "steady_sps_per_round": samples[(configuration, precision, "steady")],
                    "fraction_of_bound": None if bound is None else steady / bound,
                }
            )
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=SCRIPTS, choices=SCRIPTS + [TORCHRUN_SCRIPT])
    parser.add_argument("--precisions", nargs="+", default=["none", "bf16"], choices=["none", "bf16"])
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=10, help="iterations of each real run (at least 3)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions of every measurement")
    parser.add_argument("--seconds", type=float, help="train for this long in each real run instead of --iterations")
    parser.add_argument("--real-only", action="store_true", help="only the real runs (the only ones fit for a GPU)")
    parser.add_argument(
        "--xla-devices",
        nargs="+",
        type=int,
        default=[1],
        help="the JAX script's real runs, one on each of these numbers of XLA devices (on CPU, forced with "
        "XLA_FLAGS); each must divide --num-envs",
    )
    parser.add_argument(
        "--json",
        help="also write the table's rows, each round's steady SPS and the set-up to this "
        "file (for `benchmark/plot.py throughput`)",
    )
    cli = parser.parse_args()
    if cli.rounds < 1:
        sys.exit("error: --rounds must be at least 1")
    if cli.json and not os.path.isdir(os.path.dirname(os.path.abspath(cli.json))):
        sys.exit(f"error: --json {cli.json}: its folder does not exist")  # found now, not after the runs
    if cli.iterations < 3:
        sys.exit("error: --iterations must be at least 3 (the steady SPS leaves the first one out)")
    if JAX_SCRIPT in cli.scripts and any(n < 1 or cli.num_envs % n for n in cli.xla_devices):
        sys.exit(
            f"error: --xla-devices {' '.join(map(str, cli.xla_devices))}: each must divide --num-envs {cli.num_envs}"
        )

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus, {cli.rounds} rounds")
    samples = {}  # see summarize: (script or configuration, precision or None, quantity) -> one value per round
    record = lambda key, value: samples.setdefault(key, []).append(value)
    for round_index in range(cli.rounds):
        for script in cli.scripts:
            bounds = not cli.real_only and script != TORCHRUN_SCRIPT
            if bounds:
                env_seconds = in_fresh_process(measure_env, script, cli.env_id, cli.num_envs, cli.num_steps * 2)
                record((script, None, "env"), env_seconds)
            for precision in cli.precisions:
                if bounds:
                    nn_seconds = in_fresh_process(measure_nn, script, cli.num_envs, cli.num_steps, precision)
                    record((script, precision, "nn"), nn_seconds)
                for configuration in configurations([script], cli.xla_devices):
                    reported, steady = measure_real(
                        configuration, cli.env_id, cli.num_envs, cli.num_steps, cli.iterations, precision, cli.seconds
                    )
                    record((configuration, precision, "reported"), reported)
                    record((configuration, precision, "steady"), steady)
                    print(
                        f"round {round_index + 1}: {label(configuration)} {precision}: {steady:.0f} steady SPS",
                        flush=True,
                    )

    batch_size = cli.num_envs * cli.num_steps
    rows = summarize(samples, cli.scripts, cli.precisions, batch_size, cli.num_steps, cli.num_envs, cli.xla_devices)
    print(
        f"\n{'configuration':<48}{'precision':<10}{'env ms/step':>12}{'nn s/iter':>10}{'bound SPS':>10}"
        f"{'logged SPS':>11}{'steady SPS':>11}{'fraction':>9}"
    )
    number = lambda value, width, digits: f"{'-':>{width}}" if value is None else f"{value:>{width}.{digits}f}"
    configuration_of = lambda row: Configuration(row["script"], row["processes"], row["env_split"], row["xla_devices"])
    for row in rows:
        print(
            f"{label(configuration_of(row)):<48}{row['precision']:<10}{number(row['env_ms_per_step'], 12, 2)}"
            f"{number(row['nn_s_per_iteration'], 10, 2)}{number(row['bound_sps'], 10, 0)}"
            f"{number(row['logged_sps'], 11, 0)}{number(row['steady_sps'], 11, 0)}"
            f"{number(row['fraction_of_bound'], 9, 2)}"
        )
    print()
    steady = {(configuration_of(row), row["precision"]): row["steady_sps"] for row in rows}
    for configuration in configurations(cli.scripts, cli.xla_devices):
        if ("none" in cli.precisions) and ("bf16" in cli.precisions):
            ratio = steady[configuration, "bf16"] / steady[configuration, "fp32"]
            print(f"{label(configuration)}: bf16 / fp32 steady SPS = {ratio:.2f}x")
    if "ppo_atari" in cli.scripts and "none" in cli.precisions:
        reference = steady[Configuration("ppo_atari"), "fp32"]
        for (configuration, precision), value in steady.items():
            if configuration.script != "ppo_atari":
                print(f"{label(configuration)} {precision} / ppo_atari fp32 steady SPS = {value / reference:.2f}x")
    if cli.json:
        setup = {
            "env_id": cli.env_id,
            "num_envs": cli.num_envs,
            "num_steps": cli.num_steps,
            "rounds": cli.rounds,
            "iterations": None if cli.seconds else cli.iterations,
            "seconds": cli.seconds,
            "real_only": cli.real_only,
            "split_every": SPLIT_EVERY if TORCHRUN_SCRIPT in cli.scripts else None,
            "cpus": os.cpu_count(),
            "cpu": cpu_model(),  # with its vector level, on which the bf16 bars depend
            "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d %H:%M"),
        }
        with open(cli.json, "w") as f:
            json.dump({"setup": setup, "rows": rows}, f, indent=1)
        print(f"wrote {cli.json}")


if __name__ == "__main__":
    main()
