"""What a slow network does to data-parallel PPO: ppo_atari_multigpu.py on 2 hosts of benchmark/hosts.py (one
process each, the article's scenario-2 lines: a static rendezvous on node1), every link capped both ways by
`tc ... tbf` at each rate in turn, steady steps per second from rank 0's TensorBoard events.

    python benchmark/capped_links.py --rates none 1gbit 100mbit --json benchmark/results/capped_links.json

Each minibatch step all-reduces the Nature CNN's gradient (6.75 MB); with 2 processes gloo's ring sends and
receives one gradient per host per step, 16 steps an iteration at the default sizes: 108 MB a host an
iteration. The hosts share this machine's cores: a simulated network, not a cluster. Needs root.
Docs: docs/cluster.md#slow-links
"""

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.events import scalars, steady_sps  # noqa: E402
from benchmark.hosts import Cluster, hosts_missing  # noqa: E402
from benchmark.run import cpu_model  # noqa: E402

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


def measure(rate: str, iterations: int, root: str) -> dict:
    """One run of `iterations` at the default sizes (8 envs x 128 steps, 4 epochs x 4 minibatches) on 2 fresh
    hosts; steady SPS from the second iteration's event on, and the bytes each host sent."""
    os.makedirs(root, exist_ok=True)
    with Cluster(2, tempfile.mkdtemp(prefix=f"{rate}-", dir=root)) as cluster:
        if rate != "none":
            cluster.limit(rate)
        launches = []
        for host in (1, 2):
            command = [TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={host - 1}"]
            command += [
                "--master-addr=node1",
                "--master-port=29500",
                os.path.join(REPO_ROOT, "cleanrl", "ppo_atari_multigpu.py"),
            ]
            command += ["--local-num-envs", "4", "--total-timesteps", str(iterations * 1024)]
            environment = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
            launches.append(
                cluster.popen(
                    host, command, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        outputs = [launch.communicate(timeout=3600)[0] for launch in launches]
        if any(launch.returncode != 0 for launch in launches):
            raise SystemExit(f"error: the run at {rate} failed:\n{outputs[0][-2000:]}")
        (run_dir,) = glob.glob(os.path.join(cluster.disk(1), "runs", "*"))
        sps = steady_sps(scalars(run_dir, "charts/SPS"), from_step=2048)
        sent = [cluster.bytes_sent(host) for host in (1, 2)]
    shutil.rmtree(cluster.root, ignore_errors=True)
    return {"rate": rate, "steady_sps": round(sps, 1), "bytes_sent_per_host": sent, "iterations": iterations}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", nargs="+", default=["none", "1gbit", "100mbit"], help="tbf rates; none: no cap")
    parser.add_argument("--iterations", type=int, default=6, help="iterations of each run (the first is left out)")
    parser.add_argument("--root", default="/tmp/capped-links", help="the hosts' disks")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if reason := hosts_missing():
        raise SystemExit(f"error: cannot make hosts here: {reason}")
    if args.iterations < 3:
        raise SystemExit(f"error: --iterations must be at least 3 (the first is left out), got {args.iterations}")
    results = []
    print(f"| link cap | steady SPS | MB sent per host per iteration |  ({cpu_model()}, 2 hosts, 1 process each)")
    print("|---|---|---|")
    for rate in args.rates:
        result = measure(rate, args.iterations, args.root)
        results.append(result)
        per_iteration = max(result["bytes_sent_per_host"]) / args.iterations / 1e6
        print(f"| {rate} | {result['steady_sps']} | {per_iteration:.0f} |", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_model(), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
