"""Gradient averaging of data-parallel training, two schemes against the number of processes: the time of
one average of the Nature CNN's gradient (1,686,693 fp32 parameters, 6.7 MB) and the bytes the busiest
process sends and receives.

    python benchmark/allreduce.py --processes 2 4 8 16 --json benchmark/results/allreduce.json
    python benchmark/plot.py allreduce benchmark/results/allreduce.json --out-dir docs/img
    python benchmark/allreduce.py --backend nccl --processes 2 4 8   # one GPU per process
    python benchmark/allreduce.py --hosts /tmp/hosts --processes 2 4 8 --rate 1gbit 100mbit --repeats 5 --warmup 1

The two schemes, both ending with every process holding the mean of all processes' gradients:
  ring     torch.distributed.all_reduce (sum) then a division: gloo's ring all-reduce on CPU tensors,
           NCCL's all-reduce on GPUs (set NCCL_ALGO=Ring to keep NCCL from choosing another algorithm).
           Each process sends and receives 2 (N - 1) / N of the gradient, whatever N.
  central  every process sends its gradient to rank 0 (point-to-point sends; rank 0 posts its N - 1
           receives at once with batch_isend_irecv), rank 0 adds them up, divides, and sends the mean
           back to each process. Rank 0 receives and sends (N - 1) gradients: its traffic grows with N.
The bytes in the table are computed from these algorithms, not measured.

The tool starts N worker processes itself (this file with --worker), on 127.0.0.1, each with one thread,
so every byte goes over loopback TCP between processes of one machine: the traffic pattern of a cluster,
not a cluster (no network card, no switch, and on a machine with fewer cores than processes, the
processes take turns on the cores). For each N it first checks that both schemes give the plain mean of
the processes' gradients, then times --repeats rounds after --warmup rounds, the schemes interleaved so
that a change of load hits both alike. A round's time is the slowest process's (from a barrier to the
end of its own call); the table gives the median over the rounds, the JSON each round's too (rounds_ms).
Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) `--worker` runs as one of torchrun's
processes, e.g. over real machines.

--hosts ROOT puts each process on a host of its own: for each count N, a cluster of N hosts of
benchmark/hosts.py (network namespaces on one bridge, each host with its own address, name and link;
needs root), one worker per host, gloo over the hosts' links (GLOO_SOCKET_IFNAME=eth0), with --rate
capping every link both ways (tbf), one series per rate. Each worker also reads its host's transmit
counter (eth0's tx_bytes, what Cluster.bytes_sent reads) around every timed average: the bytes each host
sent per average, measured (TCP/IP headers and acknowledgements included), beside the computed ones; and
the tool records what each host sent over the whole run (Cluster.bytes_sent). Still one machine: the
hosts share its cores, and the links are the kernel's, capped, with no latency of their own.

Bad input is one line `error: ...` and a non-zero exit. Docs: docs/distributed.md#ring-against-central-averaging
"""

import argparse
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmark.run import cpu_model  # noqa: E402  (the runner's logs name the CPU alike)

SCHEMES = ("ring", "central")
# "Ring-style aggregation cuts communication by 60%": where the central scheme costs 60% more than the ring.
CLAIM_RATIO = 1.6


def nature_cnn_parameters(actions: int = 4) -> int:
    """Parameters of the PPO Atari scripts' Agent: the Nature CNN (3 convolutions, a 512-unit layer on the
    7x7x64 features), the actor head (512 -> actions) and the critic head (512 -> 1), weights and biases."""
    convolutions = [(4, 32, 8), (32, 64, 4), (64, 64, 3)]  # (in channels, out channels, kernel size)
    total = sum(c_in * c_out * k * k + c_out for c_in, c_out, k in convolutions)
    total += 64 * 7 * 7 * 512 + 512
    return total + 512 * actions + actions + 512 + 1


NATURE_CNN_PARAMETERS = nature_cnn_parameters()


def fail(message: str):
    sys.exit(f"error: {message}")


class Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(f"{message} (see --help)")


def busiest_traffic(scheme: str, processes: int, size_bytes: int) -> tuple[float, float]:
    """(bytes sent, bytes received) by the busiest process in one average of `size_bytes` over `processes`,
    from the algorithm: the ring's reduce-scatter then all-gather, N - 1 steps each of one N-th of the buffer,
    in both directions at once; the central scheme's rank 0, which receives and sends N - 1 whole buffers."""
    if scheme == "ring":
        each_way = 2 * (processes - 1) / processes * size_bytes
    elif scheme == "central":
        each_way = (processes - 1) * size_bytes
    else:
        raise ValueError(f"unknown scheme {scheme!r}")
    return each_way, each_way


def crossing(points: list[tuple[int, float]], target: float = CLAIM_RATIO) -> float | None:
    """The process count at which the ratio central / ring first reaches `target`, interpolated linearly
    in log2(processes) between the two measured counts around it; the smallest count when the ratio is
    already there; None when no measured count reaches it."""
    points = sorted(points)
    if not points:
        return None
    if points[0][1] >= target:
        return float(points[0][0])
    for (n0, r0), (n1, r1) in zip(points, points[1:]):
        if r0 < target <= r1:
            fraction = (target - r0) / (r1 - r0)
            return float(2 ** (math.log2(n0) + fraction * (math.log2(n1) - math.log2(n0))))
    return None


def rank_gradient(rank: int, numel: int):
    """The gradient that process `rank` averages: fixed random values, so that the mean can be recomputed."""
    import torch

    generator = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(numel, generator=generator)


# ---------------------------------------------------------------------------------------------
# One worker process
# ---------------------------------------------------------------------------------------------
def ring_average(tensor, world_size: int):
    import torch.distributed as dist

    dist.all_reduce(tensor)
    tensor /= world_size


def central_average(tensor, world_size: int, rank: int, inbox: list):
    """Every process sends its tensor to rank 0, which adds them up, divides, and sends the mean back."""
    import torch.distributed as dist

    if rank == 0:
        receives = [dist.P2POp(dist.irecv, inbox[peer - 1], peer) for peer in range(1, world_size)]
        for work in dist.batch_isend_irecv(receives):
            work.wait()
        for received in inbox:
            tensor += received
        tensor /= world_size
        sends = [dist.P2POp(dist.isend, tensor, peer) for peer in range(1, world_size)]
        for work in dist.batch_isend_irecv(sends):
            work.wait()
    else:  # batches of one: every point-to-point call of the scheme goes through batch_isend_irecv, as rank 0's
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, tensor, 0)]):
            work.wait()
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, tensor, 0)]):
            work.wait()


def transmitted(counter: str | None) -> int:
    """The bytes a network interface has sent, from its counter in /sys (0 without one)."""
    if not counter:
        return 0
    with open(counter) as f:
        return int(f.read())


def worker(cli):
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cpu")
    if cli.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
        torch.cuda.set_device(device)
    dist.init_process_group(cli.backend, timeout=datetime.timedelta(seconds=cli.timeout))
    synchronize = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    gradient = rank_gradient(rank, cli.numel).to(device)
    tensor = torch.empty_like(gradient)
    inbox = [torch.empty_like(gradient) for _ in range(world_size - 1)] if rank == 0 else []
    averages = {
        "ring": lambda: ring_average(tensor, world_size),
        "central": lambda: central_average(tensor, world_size, rank, inbox),
    }

    # Correctness first: each scheme against the plain mean, summed here one process's gradient at a time.
    expected = torch.zeros(cli.numel, dtype=torch.float64)
    for other in range(world_size):
        expected += rank_gradient(other, cli.numel).double()
    expected = (expected / world_size).to(device)
    errors = {}
    for scheme in SCHEMES:
        tensor.copy_(gradient)
        averages[scheme]()
        synchronize()
        if cli.save_dir:
            torch.save(tensor.cpu(), os.path.join(cli.save_dir, f"{scheme}-{world_size}-rank{rank}.pt"))
        error = (tensor.double() - expected).abs().max().reshape(1)
        dist.all_reduce(error, op=dist.ReduceOp.MAX)
        errors[scheme] = error.item()

    # Timing: rounds of both schemes, interleaved; a round's time is its slowest process's. With
    # --tx-counter, also the bytes this process's host sent in each timed average: from before its call to
    # after the next barrier, by when every byte of the average has reached its peer (a queue on a capped
    # link may still hold some when the call returns); the barrier's own bytes are a few hundred.
    times = torch.zeros(len(SCHEMES), cli.warmup + cli.repeats, dtype=torch.float64)
    sent = torch.zeros(len(SCHEMES), world_size, dtype=torch.float64)
    for round_index in range(cli.warmup + cli.repeats):
        for s, scheme in enumerate(SCHEMES):
            tensor.copy_(gradient)
            synchronize()
            dist.barrier()
            counted = transmitted(cli.tx_counter)
            started = time.perf_counter()
            averages[scheme]()
            synchronize()
            times[s, round_index] = time.perf_counter() - started
            if cli.tx_counter:
                dist.barrier()
                if round_index >= cli.warmup:
                    sent[s, rank] += (transmitted(cli.tx_counter) - counted) / cli.repeats
    times, sent = times.to(device), sent.to(device)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    dist.all_reduce(sent)  # each process filled its own column
    times, sent = times.cpu()[:, cli.warmup :], sent.cpu()
    if rank == 0:
        result = {
            scheme: {
                "median_ms": statistics.median(times[s].tolist()) * 1e3,
                "min_ms": times[s].min().item() * 1e3,
                "max_ms": times[s].max().item() * 1e3,
                "rounds_ms": [seconds * 1e3 for seconds in times[s].tolist()],
                "max_abs_error": errors[scheme],
                **({"sent_bytes_per_process": sent[s].tolist()} if cli.tx_counter else {}),
            }
            for s, scheme in enumerate(SCHEMES)
        }
        print("RESULT " + json.dumps(result), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# The launcher
# ---------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_command(cli, tx_counter: str | None = None) -> list[str]:
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", cli.backend]
    command += ["--numel", str(cli.numel), "--repeats", str(cli.repeats), "--warmup", str(cli.warmup)]
    command += ["--timeout", str(cli.timeout)]
    command += ["--save-dir", cli.save_dir] if cli.save_dir else []
    return command + (["--tx-counter", tx_counter] if tx_counter else [])


def run_processes(processes: int, cli) -> dict:
    """Starts `processes` workers on this machine; returns rank 0's result."""
    port = str(free_port())

    def start(rank, log):
        env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(processes)}
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1")
        return subprocess.Popen(worker_command(cli), env=env, stdout=log, stderr=subprocess.STDOUT)

    return run_workers(processes, cli, start)


# Inside a host of benchmark/hosts.py: its one link's transmit counter, the one Cluster.bytes_sent reads.
HOST_TX_COUNTER = "/sys/class/net/eth0/statistics/tx_bytes"


def run_on_hosts(processes: int, cli, rate: str | None) -> tuple[dict, list[int]]:
    """One worker on each host of a new cluster of `processes` hosts (benchmark/hosts.py: network namespaces
    on one bridge, each host with its own address and link, every link capped at `rate` both ways), gloo over
    those links; returns rank 0's result and what each host sent over the whole run (Cluster.bytes_sent)."""
    from benchmark.hosts import Cluster

    with Cluster(processes, os.path.join(cli.hosts, f"allreduce-{processes}-hosts")) as cluster:
        cluster.limit(rate)
        before = [cluster.bytes_sent(i) for i in range(1, processes + 1)]

        def start(rank, log):
            env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(processes)}
            env.update(MASTER_ADDR="node1", MASTER_PORT="29500", GLOO_SOCKET_IFNAME="eth0", OMP_NUM_THREADS="1")
            command = worker_command(cli, HOST_TX_COUNTER)
            return cluster.popen(rank + 1, command, env=env, stdout=log, stderr=subprocess.STDOUT)

        result = run_workers(processes, cli, start)
        return result, [cluster.bytes_sent(i) - before[i - 1] for i in range(1, processes + 1)]


def run_workers(processes: int, cli, start) -> dict:
    """Starts the workers (`start(rank, log)` -> a Popen), waits for them; returns rank 0's result."""
    workers = []
    logs = []
    try:
        for rank in range(processes):
            log = tempfile.TemporaryFile(mode="w+")
            workers.append(start(rank, log))
            logs.append(log)
        # Until all have exited, or one has failed (the others would wait for it until --timeout).
        deadline = time.monotonic() + cli.timeout + 60
        while any(p.poll() is None for p in workers) and not any(p.poll() for p in workers):
            if time.monotonic() > deadline:
                fail(f"{processes} processes did not finish within {cli.timeout + 60} s")
            time.sleep(0.1)
    finally:
        for process in workers:
            if process.poll() is None:
                process.kill()
                process.wait()
    outputs = []
    for log in logs:
        log.seek(0)
        outputs.append(log.read())
        log.close()
    # The first process that failed by itself, before those stopped here because of it (killed: negative).
    failed = sorted((p.returncode < 0, rank) for rank, p in enumerate(workers) if p.returncode != 0)
    if failed:
        rank = failed[0][1]
        lines = [line for line in outputs[rank].strip().splitlines() if line.strip()]
        fail(
            f"{processes} processes: rank {rank} exited with {workers[rank].returncode}: "
            f"{lines[-1] if lines else 'no output'}"
        )
    results = [line for line in outputs[0].splitlines() if line.startswith("RESULT ")]
    if not results:
        fail(f"{processes} processes: rank 0 printed no result")
    return json.loads(results[0][len("RESULT ") :])


def format_bytes(count: float) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 1e5 else f"{count / 1e3:.1f} kB"


def report(setup: dict, series: dict, network: str) -> str:
    """The tables of one series (every process count on one network) as markdown."""
    hosts = "sent_bytes_per_process" in series["rows"][0]  # measured on each host's link
    lines = [
        f"{setup['backend']} over {network}, {setup['numel']:,} fp32 parameters "
        f"({format_bytes(setup['bytes'])}), median of {setup['repeats']} rounds after {setup['warmup']}; "
        f"{setup['cpus']} CPUs ({setup['cpu']}){', ' + setup['gpu'] if setup.get('gpu') else ''}, "
        f"torch {setup['torch']}, {setup['date']}",
        "one machine: the traffic pattern of a cluster, not a cluster",
        "",
    ]
    if hosts:
        lines += [
            "| hosts | scheme | median time per average | busiest host sends (computed) | (measured) "
            "| each host sends (measured) |",
            "|-|-|-|-|-|-|",
        ]
    else:
        lines += [
            "| processes | scheme | median time per average | busiest process sends | receives (computed) |",
            "|-|-|-|-|-|",
        ]
    for row in series["rows"]:
        line = f"| {row['processes']} | {row['scheme']} | {row['median_ms']:.2f} ms | "
        line += f"{format_bytes(row['busiest_sent_bytes'])} | "
        if hosts:
            each = " / ".join(format_bytes(b) for b in row["sent_bytes_per_process"])
            lines.append(line + f"{format_bytes(max(row['sent_bytes_per_process']))} | {each} |")
        else:
            lines.append(line + f"{format_bytes(row['busiest_received_bytes'])} |")
    lines += [
        "",
        "| processes | central / ring, time (measured) | central / ring, busiest process's bytes (computed) |"
        + (" (measured) |" if hosts else ""),
        "|-|-|-|" + ("-|" if hosts else ""),
    ]
    for point in series["central_over_ring"]:
        measured = f" {point['measured_bytes_ratio']:.2f} |" if hosts else ""
        lines.append(f"| {point['processes']} | {point['time_ratio']:.2f} | {point['bytes_ratio']:.2f} |{measured}")
    at = series["central_60_percent_more_at"]
    lines.append("")
    if at is None:
        lines.append(f"the central scheme never costs {CLAIM_RATIO - 1:.0%} more time than the ring here")
    else:
        lines.append(
            f"the central scheme costs {CLAIM_RATIO - 1:.0%} more time than the ring from about {at:.1f} "
            "processes on (interpolated in log2 of the count)"
        )
    lines.append(f"by the bytes of the busiest process (N / 2): from {2 * CLAIM_RATIO:.1f} processes on")
    return "\n".join(lines)


def measure(counts: list[int], size: int, run) -> dict:
    """Both schemes at each process count: `run(processes)` -> (rank 0's result, each host's bytes sent over
    the whole run or None). Returns the series: rows, central over ring, and where it reaches 1.6."""
    series = {"rows": [], "central_over_ring": []}
    for processes in counts:
        started = time.time()
        measured, run_bytes = run(processes)
        for scheme in SCHEMES:
            if measured[scheme]["max_abs_error"] > 1e-4:
                fail(
                    f"{processes} processes: the {scheme} average differs from the plain mean by "
                    f"{measured[scheme]['max_abs_error']:.3g}"
                )
            sent, received = busiest_traffic(scheme, processes, size)
            row = {"processes": processes, "scheme": scheme, **measured[scheme]}
            series["rows"].append(row | {"busiest_sent_bytes": sent, "busiest_received_bytes": received})
        ring_sent, central_sent = (busiest_traffic(scheme, processes, size)[0] for scheme in SCHEMES)
        point = {
            "processes": processes,
            "time_ratio": measured["central"]["median_ms"] / measured["ring"]["median_ms"],
            "bytes_ratio": central_sent / ring_sent,
        }
        if run_bytes is not None:
            busiest = {scheme: max(measured[scheme]["sent_bytes_per_process"]) for scheme in SCHEMES}
            point.update(measured_bytes_ratio=busiest["central"] / busiest["ring"], run_bytes_sent_per_host=run_bytes)
        series["central_over_ring"].append(point)
        print(
            f"  {processes} processes: ring {measured['ring']['median_ms']:.2f} ms, central "
            f"{measured['central']['median_ms']:.2f} ms ({time.time() - started:.0f} s)",
            file=sys.stderr,
            flush=True,
        )
    series["central_60_percent_more_at"] = crossing(
        [(point["processes"], point["time_ratio"]) for point in series["central_over_ring"]]
    )
    return series


def main():
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--processes",
        type=int,
        nargs="+",
        default=[2, 4, 8, 16],
        help="process counts to measure, each 2 or more (default: 2 4 8 16)",
    )
    parser.add_argument(
        "--backend",
        choices=["gloo", "nccl"],
        default="gloo",
        help="gloo: CPU tensors; nccl: one GPU per process (default: gloo)",
    )
    parser.add_argument(
        "--numel",
        type=int,
        default=NATURE_CNN_PARAMETERS,
        help=f"fp32 values averaged (default: {NATURE_CNN_PARAMETERS:,}, the Nature CNN's parameters)",
    )
    parser.add_argument("--repeats", type=int, default=30, help="timed rounds per scheme and count (default: 30)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default: 3)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds one process count may take (default: 600)")
    parser.add_argument("--json", help="also write the results to this JSON file (for benchmark/plot.py allreduce)")
    parser.add_argument("--save-dir", help="write each process's averaged tensor of the correctness check here")
    parser.add_argument(
        "--hosts",
        metavar="ROOT",
        help="run each process on a host of its own: a benchmark/hosts.py cluster per count, its disks in ROOT "
        "(needs root), gloo over the hosts' links",
    )
    parser.add_argument(
        "--rate",
        nargs="+",
        help="with --hosts: cap every host's link at each of these rates in turn, both ways (e.g. 1gbit 100mbit; "
        "default: no cap)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--tx-counter", help=argparse.SUPPRESS)  # a worker's host's transmit counter in /sys
    cli = parser.parse_args()
    if cli.numel < 1 or cli.repeats < 1 or cli.warmup < 0 or cli.timeout < 1:
        fail("--numel, --repeats and --timeout must be positive, --warmup 0 or more")
    if cli.worker:
        return worker(cli)
    if any(n < 2 for n in cli.processes):
        fail(
            f"--processes {' '.join(map(str, cli.processes))}: each count must be 2 or more "
            "(an average needs 2 processes)"
        )
    if cli.save_dir and not os.path.isdir(cli.save_dir):
        fail(f"--save-dir {cli.save_dir}: no such folder")
    if cli.json and not os.path.isdir(os.path.dirname(os.path.abspath(cli.json))):
        fail(f"--json {cli.json}: its folder does not exist")
    if cli.rate and not cli.hosts:
        fail("--rate caps the links of --hosts: add --hosts ROOT")
    if cli.hosts:
        from benchmark.hosts import burst_bytes, hosts_missing

        if cli.backend != "gloo":
            fail("--hosts runs gloo over the hosts' links: leave --backend at gloo")
        if reason := hosts_missing():
            fail(f"--hosts: cannot make hosts here: {reason}")
        for rate in cli.rate or []:
            try:
                burst_bytes(rate)
            except ValueError as error:
                fail(f"--rate: {error}")

    import torch

    gpu = None
    if cli.backend == "nccl":
        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if max(cli.processes) > gpus:
            fail(f"--backend nccl runs one process per GPU: {max(cli.processes)} processes, {gpus} GPU(s) here")
        gpu = f"{gpus} x {torch.cuda.get_device_name(0)}"
    size = cli.numel * 4
    transport = "loopback (127.0.0.1), one machine" if cli.backend == "gloo" else "NCCL within one machine"
    if cli.hosts:
        transport = "a host each: network namespaces on one bridge (benchmark/hosts.py), one machine"
    setup = {
        "backend": cli.backend,
        "transport": transport,
        "numel": cli.numel,
        "bytes": size,
        "repeats": cli.repeats,
        "warmup": cli.warmup,
        "cpus": os.cpu_count(),
        "cpu": cpu_model(),
        "gpu": gpu,
        "torch": torch.__version__,
        "nccl_algo": os.environ.get("NCCL_ALGO"),
        "date": time.strftime("%Y-%m-%d"),
    }
    counts = sorted(set(cli.processes))
    if not cli.hosts:
        results = {"setup": setup, **measure(counts, size, lambda processes: (run_processes(processes, cli), None))}
        print(report(setup, results, transport))
    else:  # one series per link rate
        results = {"setup": setup, "networks": []}
        for rate in cli.rate or [None]:
            print(f"links capped at {rate}" if rate else "links not capped", file=sys.stderr, flush=True)
            series = measure(counts, size, lambda processes: run_on_hosts(processes, cli, rate))
            results["networks"].append({"rate": rate, **series})
            network = f"hosts' links capped at {rate} both ways" if rate else "hosts' links, no cap"
            print(report(setup, series, network) + "\n")
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump(results, f, indent=1)
        print(f"wrote {cli.json}")


if __name__ == "__main__":
    main()
