"""ppo_atari_multigpu.py across hosts that each have their own address, name and disk (benchmark/hosts.py),
under faults: a host lost (kill -9 of every process on it), a host that joins, a link cut. The rendezvous
is torch's c10d store on a host of its own (node3), so it outlives every training host; no filesystem is
shared, so each training host keeps the whole run (events, checkpoints) on its own disk.
Docs: docs/cluster.md."""

import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
from running import REPO_ROOT, Output, read_scalars, wait_for

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
SCRIPT = os.path.join(REPO_ROOT, "cleanrl", "ppo_atari_multigpu.py")
# The rendezvous host's whole job: torch's TCPStore, serving the c10d rendezvous of every training host.
RENDEZVOUS = (
    "import time, torch.distributed as dist; "
    "store = dist.TCPStore('0.0.0.0', 29400, is_master=True, wait_for_workers=False); time.sleep(3600)"
)
ITERATION = 4 * 32  # 4 envs x 32 steps: the job's batch, whatever its world size
ENVIRONMENT = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
PER_ITERATION_TAGS = ["charts/learning_rate", "losses/value_loss", "losses/policy_loss", "charts/world_size"]


def elastic_job(iterations: int, *extra: str, max_restarts: int = 3) -> list[str]:
    """The docs' elastic command for every training host, at a tiny budget: 1 to 2 nodes of one process."""
    return [
        *(TORCHRUN, "--nnodes=1:2", "--nproc-per-node=1", "--rdzv-backend=c10d", "--rdzv-endpoint=node3:29400"),
        *(
            "--rdzv-id=cluster-test",
            "--rdzv-conf=last_call_timeout=1,read_timeout=300",
            f"--max-restarts={max_restarts}",
        ),
        *("--monitor-interval=0.5", SCRIPT, "--num-envs", "4", "--num-steps", "32", "--num-minibatches", "2"),
        *("--update-epochs", "1", "--total-timesteps", str(iterations * ITERATION), "--checkpoint-every", "2"),
        *("--resume", "auto", *extra),
    ]


class Job:
    """The training hosts' torchrun launches on a cluster whose node3 serves the rendezvous."""

    def __init__(self, cluster):
        self.cluster, self.launches, self.outputs = cluster, {}, {}
        self.store = cluster.popen(3, [sys.executable, "-c", RENDEZVOUS])

    def start(self, host: int, command: list[str]):
        environment = {**os.environ, **ENVIRONMENT}
        pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment)
        self.launches[host] = self.cluster.popen(host, command, **pipes)
        self.outputs[host] = Output(self.launches[host])

    def text(self, host: int) -> str:
        return self.outputs[host].text

    def wait_for(self, condition, hosts: list[int], timeout: float = 240):
        wait_for(condition, [self.launches[h] for h in hosts], [self.outputs[h] for h in self.outputs], timeout)

    def finish(self, host: int, timeout: float = 300) -> str:
        self.launches[host].wait(timeout=timeout)
        self.outputs[host].reader.join(timeout=10)
        return self.text(host)


@pytest.fixture
def job(make_hosts):
    cluster = make_hosts(3)
    job = Job(cluster)
    yield job  # make_hosts kills every process of every host afterwards


def run_events(disk: str) -> dict:
    (run_dir,) = [os.path.join(disk, "runs", name) for name in os.listdir(os.path.join(disk, "runs"))]
    return read_scalars(run_dir)


def assert_every_step_logged_once(disk: str, iterations: int) -> dict:
    scalars = run_events(disk)
    for tag in PER_ITERATION_TAGS:
        assert [step for step, _ in scalars[tag]] == [ITERATION * i for i in range(1, iterations + 1)], tag
    game_steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert len(set(game_steps)) == len(game_steps) > 0
    learning_rates = [value for _, value in scalars["charts/learning_rate"]]
    np.testing.assert_allclose(learning_rates, [2.5e-4 * (1 - i / iterations) for i in range(iterations)], rtol=1e-6)
    return scalars


def world_sizes(scalars: dict) -> list[int]:
    """charts/world_size, each run of equal values once: [1, 2, 1] for a job that grew, then shrank."""
    sizes = [int(value) for _, value in scalars["charts/world_size"]]
    return [size for i, size in enumerate(sizes) if i == 0 or size != sizes[i - 1]]


def checkpoints_written(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^checkpoint runs/\S+/iteration-(\d+)\.pt$", text, re.M)]


def test_a_joining_host_gets_the_run_and_finishes_it_when_the_rank_0_host_is_lost(job):
    iterations = 80
    job.start(1, elastic_job(iterations))
    job.wait_for(lambda: checkpoints_written(job.text(1)), [1])
    job.start(2, elastic_job(iterations))  # an empty disk: it gets node1's checkpoint and events
    # node2 writes node1's checkpoint when it joins, then checkpoints of the job of two: wait for one of those
    job.wait_for(lambda: len(checkpoints_written(job.text(2))) >= 2, [1, 2])
    newest_before = max(checkpoints_written(job.text(1)))
    lost_at = time.time()
    job.cluster.kill(1)  # every process of the rank-0 host, as a power cut
    job.wait_for(lambda: "world size 1:" in job.text(2), [2])  # node2, rank 0 now, describes the new job
    recovered_in = time.time() - lost_at
    text = job.finish(2)
    assert job.launches[2].returncode == 0, text
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in text
    # node2 resumed from its own copy of the job's newest checkpoint: at most --checkpoint-every (2) iterations twice
    resumed = [int(s.replace(",", "")) for s in re.findall(r"the job resumes at step ([\d,]+)", text)]
    assert resumed[-1] >= newest_before * ITERATION, (resumed, newest_before)
    scalars = assert_every_step_logged_once(job.cluster.disk(2), iterations)
    assert world_sizes(scalars) == [1, 2, 1]
    assert recovered_in < 60, recovered_in
    print(f"rank-0 host lost after iteration {newest_before}: node2 trained alone {recovered_in:.1f} s later")


def test_the_job_goes_on_without_a_lost_host_that_is_not_rank_0(job):
    iterations = 30
    for host in (1, 2):
        job.start(host, elastic_job(iterations))
    job.wait_for(lambda: checkpoints_written(job.text(2)), [1, 2])
    job.cluster.kill(2)
    text = job.finish(1)
    assert job.launches[1].returncode == 0, text
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in text
    scalars = assert_every_step_logged_once(job.cluster.disk(1), iterations)
    assert world_sizes(scalars) == [2, 1]


def test_the_same_command_on_a_surviving_host_resumes_the_run(job):
    """The whole job lost (node1's processes and node2's launcher): the same command, run again on node2,
    resumes the run from node2's own disk instead of starting a new one."""
    iterations = 20
    for host in (1, 2):
        job.start(host, elastic_job(iterations))
    job.wait_for(lambda: checkpoints_written(job.text(2)), [1, 2])
    job.cluster.kill(1)
    job.cluster.kill(2)
    newest = max(checkpoints_written(job.finish(2)))
    job.start(2, elastic_job(iterations))
    text = job.finish(2)
    assert job.launches[2].returncode == 0, text
    assert f"the job resumes at step {newest * ITERATION:,}" in text, text
    assert_every_step_logged_once(job.cluster.disk(2), iterations)


def test_a_job_waits_through_a_link_cut_shorter_than_its_collective_timeout(job):
    """node2's link cut for 60 s, under the default --collective-timeout (120 s): both nodes wait in their
    collective calls and go on, with no restart; every step once."""
    iterations = 24
    for host in (1, 2):
        job.start(host, elastic_job(iterations))
    job.wait_for(lambda: checkpoints_written(job.text(2)), [1, 2])
    job.cluster.cut(2)
    time.sleep(60)
    job.cluster.mend(2)
    text, text2 = job.finish(1), job.finish(2)
    assert job.launches[1].returncode == 0 and job.launches[2].returncode == 0, f"{text}\n--- node2:\n{text2}"
    assert text.count("world size 2:") == 1 and "world size 1:" not in text, text  # no restart
    scalars = assert_every_step_logged_once(job.cluster.disk(1), iterations)
    assert world_sizes(scalars) == [2]


def test_a_host_cut_off_longer_than_the_timeout_is_dropped_and_the_job_goes_on(job):
    iterations = 40
    for host in (1, 2):
        job.start(host, elastic_job(iterations, "--collective-timeout", "15"))
    job.wait_for(lambda: checkpoints_written(job.text(2)), [1, 2])
    cut_at = time.time()
    job.cluster.cut(2)
    job.wait_for(lambda: "world size 1:" in job.text(1), [1], timeout=120)
    dropped_in = time.time() - cut_at
    time.sleep(max(0.0, 45 - dropped_in))
    job.cluster.mend(2)  # it may come back and join again: the job goes on either way
    text = job.finish(1)
    assert job.launches[1].returncode == 0, text
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in text
    assert_every_step_logged_once(job.cluster.disk(1), iterations)
    assert 15 <= dropped_in < 15 + 45, dropped_in
    print(f"a host cut off for 45 s under --collective-timeout 15: the job went on without it {dropped_in:.1f} s later")


# ---------------------------------------------------------------------------------------------
# Bad input across hosts: nothing hangs. The article's scenario-2 lines (a static rendezvous on node1).
# ---------------------------------------------------------------------------------------------
def static_job(node_rank: int, master: str = "node1", port: int = 29500, timeout: int = 10) -> list[str]:
    """`torchrun --nnodes=2 ... --master-addr=node1`, torchrun's own rendezvous bounded by --rdzv-conf timeout."""
    return [
        *(TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}", f"--master-addr={master}"),
        *(f"--master-port={port}", f"--rdzv-conf=timeout={timeout}", SCRIPT, "--local-num-envs", "2"),
        *("--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1", "--total-timesteps", "1024"),
    ]


def test_a_disk_that_cannot_be_written_stops_every_node_with_one_line_naming_host_and_folder(job):
    with open(os.path.join(job.cluster.disk(2), "runs"), "w"):  # a file where node2's runs/ should be
        pass
    for host in (1, 2):
        job.start(host, static_job(host - 1))
    outputs = [job.finish(host, timeout=120) for host in (1, 2)]
    assert job.launches[1].returncode != 0 and job.launches[2].returncode != 0, outputs
    errors = re.findall(r"^error: .*$", "".join(outputs), re.M)
    assert errors == [f"error: node2: cannot write the run to {job.cluster.disk(2)}/runs: File exists"], outputs


@pytest.mark.parametrize(
    "fault, last_line",
    [
        ("a master address that does not resolve", "trying to connect to (nowhere, 29500)"),
        ("a port already in use", "port: 29500, useIpv6: false, code: -98, name: EADDRINUSE"),
        ("a host that never arrives", "waiting for clients. 1/2 clients joined."),
    ],
)
def test_torchrun_gives_up_on_a_bad_rendezvous_within_its_timeout(job, fault, last_line):
    """These fail in torchrun itself, before the script runs: its traceback ends with a line naming the
    address, within about twice --rdzv-conf timeout (docs/cluster.md gives the bounds)."""
    if fault.startswith("a port"):
        blocker = "import socket, time; s = socket.create_server(('0.0.0.0', 29500)); time.sleep(600)"
        job.cluster.popen(1, [sys.executable, "-c", blocker])
        time.sleep(1)
    host, command = (2, static_job(1, master="nowhere")) if "resolve" in fault else (1, static_job(0))
    started = time.time()
    job.start(host, command)
    text = job.finish(host, timeout=120)
    assert job.launches[host].returncode != 0
    assert last_line in text.strip().splitlines()[-1], text[-3000:]
    assert time.time() - started < 2 * 10 + 30
