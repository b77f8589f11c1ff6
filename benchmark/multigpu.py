"""Benchmark of cleanrl/ppo_atari_multigpu.py on one CPU machine (gloo): one command, two small tables.

    python benchmark/multigpu.py                 # both parts, about 6 minutes on 2 quiet cores
    python benchmark/multigpu.py --part sps      # only the training throughput
    python benchmark/multigpu.py --part sync     # only the gradient-sync comparison
    python benchmark/multigpu.py --part split    # --env-split measured against even (not in "all"), ~12 minutes

1. Training throughput (SPS, environment steps per second of the whole job) with the default
   hyperparameters (8 envs per process, 128 steps, 4 epochs of 4 minibatches), in fp32 and bf16:
   one process pinned to one core with one thread, one process on two cores (two threads), two
   processes under torchrun each pinned to its own core with one thread, and ppo_atari.py itself
   on two cores for reference. Each process runs 8 envs, so two processes do twice the work of one
   per iteration: their SPS over the single-core SPS is the scaling (ideal 2.0). SPS is measured
   between the first and the last iteration's log (start-up and the first iteration excluded).
2. Gradient sync: two pinned one-thread processes run the real minibatch update (the script's Agent
   and ppo_loss, 256 samples per process, the default share) with each way of averaging gradients:
   none (the baseline: no communication at all), one flat all-reduce (the script's), one all-reduce
   per parameter, and DistributedDataParallel with 25 MB (one bucket) and 1 MB buckets (overlapped
   with backward). Communication share = time in the collective calls / update time (for DDP, whose
   all-reduces run inside backward(): (update time - baseline) / update time). Then the bare
   collectives on the flat gradient: ring all-reduce against reduce-to-rank-0 plus broadcast.
3. Processes of unequal speed (`--part split`): two processes pinned to a core each, with and
   without a CPU-bound competitor pinned to the second core (which then runs rank 1 at about half
   speed), each with `--env-split even` and `--env-split measured` (measured every 5 iterations),
   interleaved in rounds. 16 environments x 64 steps (the default batch of 1,024 steps): with the
   split's granularity of one environment, 8 environments would bound the gain at 4 / 3 = 1.33x
   (the best split of 8 for speeds 2:1 is 5 + 3). Steady SPS over the second half of each run, after
   the split has settled.
Other processes on the machine distort all of it: each table says how much of the CPUs they used
meanwhile. Figures taken with more than a few percent are figures of a loaded machine.
"""

import argparse
import copy
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO_ROOT, "cleanrl", "ppo_atari_multigpu.py")
SINGLE_SCRIPT = os.path.join(REPO_ROOT, "cleanrl", "ppo_atari.py")
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
CORES = sorted(os.sched_getaffinity(0))[:2]
SINGLE_CORE = "1 process, 1 core, 1 thread"
sys.path.insert(0, REPO_ROOT)
from benchmark import events  # noqa: E402


def pinned_torchrun(*command: str) -> list[str]:
    """Two torchrun processes, process LOCAL_RANK pinned to the LOCAL_RANK-th core of this machine."""
    pin = f'exec taskset -c "$(echo {" ".join(map(str, CORES))} | cut -d" " -f$((LOCAL_RANK + 1)))" "$@"'
    return [TORCHRUN, "--standalone", "--nproc-per-node=2", "--no-python", "sh", "-c", pin, "sh", *command]


class OtherLoad:
    """The share of the machine's CPU time that processes other than this benchmark's used while it ran:
    all busy CPU time (/proc/stat) minus the CPU time of the benchmark's finished child processes."""

    def __enter__(self):
        self.started, self.busy, self.children = time.time(), self._busy(), self._children()
        return self

    def __exit__(self, *exc):
        elapsed = time.time() - self.started
        other = (self._busy() - self.busy) - (self._children() - self.children)
        self.share = max(0.0, other / (elapsed * os.cpu_count()))

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            user, nice, system, idle, iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _children() -> float:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        return usage.ru_utime + usage.ru_stime


# ---------------------------------------------------------------------------------------------
# 1. Training throughput
# ---------------------------------------------------------------------------------------------
def steady_sps(run_dir: str, skip: float = 0.0) -> float:
    """Steps per second between the logs of the first iteration (or of the first after the `skip`
    fraction of the run) and the last."""
    return events.steady_sps(events.scalars(run_dir, "charts/SPS"), skip=skip)


def measure_sps(iterations: int) -> list[dict]:
    configurations = [
        (SINGLE_CORE, 1, ["taskset", "-c", str(CORES[0])], {"OMP_NUM_THREADS": "1"}, SCRIPT),
        ("1 process, 2 cores, 2 threads", 1, [], {"OMP_NUM_THREADS": "2"}, SCRIPT),
        ("2 processes, 1 core + 1 thread each", 2, None, {"OMP_NUM_THREADS": "1"}, SCRIPT),
        ("ppo_atari.py, 2 cores, 2 threads", 1, [], {"OMP_NUM_THREADS": "2"}, SINGLE_SCRIPT),
    ]
    rows = []
    for precision in ("none", "bf16"):
        for name, processes, prefix, env, script in configurations:
            total = iterations * 8 * 128 * processes
            envs_flag = "--num-envs" if script == SINGLE_SCRIPT else "--local-num-envs"
            arguments = [envs_flag, "8", "--total-timesteps", str(total), "--mixed-precision", precision]
            command = (
                pinned_torchrun(sys.executable, script, *arguments)
                if prefix is None
                else [*prefix, sys.executable, script, *arguments]
            )
            cwd = tempfile.mkdtemp(prefix="benchmark-multigpu-")
            with OtherLoad() as other:
                result = subprocess.run(
                    command, cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True, timeout=1800
                )
            if result.returncode != 0:
                sys.exit(f"error: {name} failed:\n{result.stderr[-2000:]}")
            run_dir = os.path.join(cwd, "runs", os.listdir(os.path.join(cwd, "runs"))[0])
            rows.append(
                {"configuration": name, "precision": precision, "sps": steady_sps(run_dir), "other_load": other.share}
            )
            shutil.rmtree(cwd)
            print(
                f"  {precision:4} {name}: {rows[-1]['sps']:.0f} SPS, other processes used {other.share:.0%} "
                "of the CPUs",
                file=sys.stderr,
                flush=True,
            )
    return rows


# ---------------------------------------------------------------------------------------------
# 3. Processes of unequal speed: --env-split measured against even
# ---------------------------------------------------------------------------------------------
def measure_split(rounds: int, iterations: int) -> list[dict]:
    rows = []
    for round_number in range(1, rounds + 1):
        for load in ("competitor on core 2", "quiet"):
            for split in ("even", "measured"):
                arguments = [
                    "--num-envs",
                    "16",
                    "--num-steps",
                    "64",
                    "--total-timesteps",
                    str(iterations * 1024),
                    "--env-split",
                    split,
                    "--split-every",
                    "5",
                ]
                cwd = tempfile.mkdtemp(prefix="benchmark-split-")
                competitor = None
                if load != "quiet":
                    competitor = subprocess.Popen(
                        ["taskset", "-c", str(CORES[1]), sys.executable, "-c", "while True: pass"]
                    )
                try:
                    result = subprocess.run(
                        pinned_torchrun(sys.executable, SCRIPT, *arguments),
                        cwd=cwd,
                        env={**os.environ, "OMP_NUM_THREADS": "1"},
                        capture_output=True,
                        text=True,
                        timeout=1800,
                    )
                finally:
                    if competitor is not None:
                        competitor.kill()
                        competitor.wait()
                if result.returncode != 0:
                    sys.exit(f"error: {split} ({load}) failed:\n{result.stderr[-2000:]}")
                run_dir = os.path.join(cwd, "runs", os.listdir(os.path.join(cwd, "runs"))[0])
                changes = [
                    line.split(": ", 1)[1].split(":")[0]
                    for line in result.stdout.splitlines()
                    if line.startswith("iteration ") and ": env split " in line
                ]
                rows.append(
                    {
                        "round": round_number,
                        "load": load,
                        "split": split,
                        "sps": steady_sps(run_dir, skip=0.5),
                        "changes": changes,
                    }
                )
                shutil.rmtree(cwd)
                print(
                    f"  round {round_number}, {load}, {split}: {rows[-1]['sps']:.0f} SPS"
                    f"{' (' + '; '.join(changes) + ')' if changes else ''}",
                    file=sys.stderr,
                    flush=True,
                )
    return rows


# ---------------------------------------------------------------------------------------------
# 2. Gradient sync (the worker runs under torchrun)
# ---------------------------------------------------------------------------------------------
def sync_worker(updates: int, minibatch: int):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel

    import cleanrl.ppo_atari_multigpu as multigpu

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    agent = multigpu.Agent(4).to(memory_format=torch.channels_last)
    for tensor in agent.state_dict().values():
        dist.broadcast(tensor, src=0)
    args = multigpu.Args()
    obs = torch.randint(0, 256, (minibatch, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (minibatch,))
    logprobs, advantages, returns, values = torch.randn(4, minibatch)

    class Forward(nn.Module):  # DistributedDataParallel syncs the gradients of what its forward() computed
        def __init__(self, agent):
            super().__init__()
            self.agent = agent

        def forward(self, obs, actions):
            return self.agent.get_action_and_value(obs, actions)

    def per_parameter(model):
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad /= world_size

    in_collectives = [0.0]  # seconds spent in the collective calls of the update being timed

    def timed(function):
        def wrapper(*args):
            started = time.perf_counter()
            result = function(*args)
            in_collectives[0] += time.perf_counter() - started
            return result

        return wrapper

    local_mean_std = lambda x: (x.mean(), x.std())
    global_mean_std = timed(multigpu.global_mean_std)
    methods = {}  # name: (forward, parameters, gradient sync, advantage statistics)
    for name in ("none", "flat all-reduce", "per-parameter all-reduce"):
        model = copy.deepcopy(agent)
        sync = {
            "none": lambda model: None,
            "flat all-reduce": timed(lambda model: multigpu.average_gradients(model, world_size, 1 / world_size)),
            "per-parameter all-reduce": timed(per_parameter),
        }[name]
        methods[name] = (model.get_action_and_value, model, sync, local_mean_std if name == "none" else global_mean_std)
    for name, bucket_mb in (("DDP, 25 MB buckets", 25), ("DDP, 1 MB buckets", 1)):
        model = DistributedDataParallel(Forward(copy.deepcopy(agent)), bucket_cap_mb=bucket_mb)
        methods[name] = (model, model, lambda model: None, global_mean_std)

    results = {}
    for precision in ("none", "bf16"):
        optimizers = {name: torch.optim.Adam(m[1].parameters(), lr=1e-5, eps=1e-5) for name, m in methods.items()}
        times = {name: [] for name in methods}
        collective_times = {name: [] for name in methods}
        for repetition in range(updates + 3):
            for name, (forward, model, sync, mean_std) in methods.items():  # interleaved: load drifts hit all alike
                multigpu.global_mean_std = mean_std
                dist.barrier()
                in_collectives[0] = 0.0
                started = time.perf_counter()
                with torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16"):
                    _, newlogprob, entropy, newvalue = forward(obs, actions)
                loss, _ = multigpu.ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)
                optimizers[name].zero_grad(set_to_none=True)
                loss.backward()
                sync(model)
                nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizers[name].step()
                if repetition >= 3:  # warm-up excluded
                    times[name].append(time.perf_counter() - started)
                    collective_times[name].append(in_collectives[0])
        results[precision] = {
            name: (statistics.median(times[name]) * 1e3, statistics.median(collective_times[name]) * 1e3)
            for name in methods
        }

    # The bare collectives on the flat gradient (6.7 MB fp32)
    flat = torch.cat([p.detach().reshape(-1) for p in agent.parameters()])
    collectives = {"ring all-reduce": [], "reduce to rank 0 + broadcast": []}
    for _ in range(updates + 3):
        for name in collectives:
            dist.barrier()
            started = time.perf_counter()
            if name == "ring all-reduce":
                dist.all_reduce(flat)
            else:
                dist.reduce(flat, dst=0)
                dist.broadcast(flat, src=0)
            collectives[name].append(time.perf_counter() - started)
    results["collectives"] = {name: statistics.median(t[3:]) * 1e3 for name, t in collectives.items()}
    results["gradient_mb"] = flat.numel() * 4 / 1e6
    if rank == 0:
        print("RESULT " + json.dumps(results), flush=True)
    dist.destroy_process_group()


def measure_sync(updates: int, minibatch: int) -> dict:
    command = pinned_torchrun(
        sys.executable,
        os.path.abspath(__file__),
        "--sync-worker",
        "--updates",
        str(updates),
        "--minibatch",
        str(minibatch),
    )
    environment = {**os.environ, "OMP_NUM_THREADS": "1"}
    with OtherLoad() as other:
        result = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=1800)
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    if result.returncode != 0 or not lines:
        sys.exit(f"error: the sync benchmark failed:\n{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return {**json.loads(lines[0][len("RESULT ") :]), "other_load": other.share}


# ---------------------------------------------------------------------------------------------
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["all", "sps", "sync", "split"], default="all")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of the split comparison (default 2)")
    parser.add_argument(
        "--iterations",
        type=int,
        default=8,
        help="training iterations per SPS run (default 8; the split comparison runs 3 times as many)",
    )
    parser.add_argument("--updates", type=int, default=20, help="timed minibatch updates per sync method (default 20)")
    parser.add_argument("--minibatch", type=int, default=256, help="samples per process per minibatch (default 256)")
    parser.add_argument("--sync-worker", action="store_true", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.sync_worker:
        return sync_worker(options.updates, options.minibatch)
    if len(CORES) < 2 or shutil.which("taskset") is None:
        sys.exit("error: the benchmark pins processes to 2 cores with taskset: it needs both")

    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)
    print("(figures measured while other processes use the CPUs are figures of a loaded machine)", flush=True)
    if options.part in ("all", "sps"):
        rows = measure_sps(options.iterations)
        single_core = {row["precision"]: row["sps"] for row in rows if row["configuration"] == SINGLE_CORE}
        print(
            "\n| configuration | precision | SPS | vs 1 process on 1 core | CPU used by other processes |\n|-|-|-|-|-|"
        )
        for row in rows:
            print(
                f"| {row['configuration']} | {'fp32' if row['precision'] == 'none' else 'bf16'} | {row['sps']:.0f} | "
                f"{row['sps'] / single_core[row['precision']]:.2f}x | {row['other_load']:.0%} |"
            )
    if options.part in ("all", "sync"):
        results = measure_sync(options.updates, options.minibatch)
        for precision in ("none", "bf16"):
            times = results[precision]
            baseline = times["none"][0]
            print(
                f"\n| gradient sync, {'fp32' if precision == 'none' else 'bf16'}, {options.minibatch} samples per "
                "process | update ms | minus no-sync update ms | ms in collective calls | communication share |"
                "\n|-|-|-|-|-|"
            )
            for name, (milliseconds, collective) in times.items():
                # DDP's all-reduces run inside backward(): only the difference to the baseline shows them.
                communication = milliseconds - baseline if name.startswith("DDP") else collective
                print(
                    f"| {name} | {milliseconds:.1f} | {milliseconds - baseline:+.1f} | "
                    f"{'(inside backward)' if name.startswith('DDP') else f'{collective:.1f}'} | "
                    f"{communication / milliseconds:.1%} |"
                )
        collectives = results["collectives"]
        ring, naive = collectives["ring all-reduce"], collectives["reduce to rank 0 + broadcast"]
        print(f"\n| collective on the {results['gradient_mb']:.1f} MB flat gradient, 2 processes | ms |\n|-|-|")
        for name, milliseconds in collectives.items():
            print(f"| {name} | {milliseconds:.2f} |")
        saving = 1 - ring / naive
        print(f"\nring all-reduce: {abs(saving):.0%} {'less' if saving >= 0 else 'more'} time than reduce + broadcast")
        print(f"other processes used {results['other_load']:.0%} of the CPUs during the sync measurement")
    if options.part == "split":
        rows = measure_split(options.rounds, 3 * options.iterations)
        print("\n| round | load | --env-split | steady SPS | measured / even | split changes |\n|-|-|-|-|-|-|")
        for row in rows:
            even = next(
                r["sps"]
                for r in rows
                if r["round"] == row["round"] and r["load"] == row["load"] and r["split"] == "even"
            )
            print(
                f"| {row['round']} | {row['load']} | {row['split']} | {row['sps']:.0f} | {row['sps'] / even:.2f}x | "
                f"{'; '.join(row['changes']) or '-'} |"
            )
        for load in ("competitor on core 2", "quiet"):
            ratio = lambda split: statistics.median(r["sps"] for r in rows if r["load"] == load and r["split"] == split)
            print(f"{load}: measured / even = {ratio('measured') / ratio('even'):.2f}x (medians over the rounds)")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
