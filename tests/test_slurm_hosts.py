"""Slurm across hosts: slurmctld on node1, and on every host of benchmark/hosts.py's cluster in a box its own
munged (one key) and slurmd (tests/services.py slurm_on_hosts), each host with its own address, name and
disk, and no shared filesystem. The jobs are submitted on node1 with the real sbatch: the project's
multi-node template (benchmark/slurm_multinode.sh) trains one ppo_atari_multigpu.py run on two nodes; the
runner's and the tuner's array tasks land on both nodes and keep their logs and runs on the node that ran
them, the tuners sharing one study on a PostgreSQL server on node1; a job that loses a node is requeued on
the others and resumes from its checkpoint."""

import contextlib
import os
import re
import sys
import time

import pytest
from running import REPO_ROOT, read_scalars
from services import (
    local_folder,
    postgresql_missing,
    postgresql_server,
    slurm_on_hosts,
    slurm_on_hosts_missing,
    wait_for_slurm_jobs,
)

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

MULTINODE = os.path.join("benchmark", "slurm_multinode.sh")  # submitted from the checkout, as its header says
PPO = f"{sys.executable} {os.path.join(REPO_ROOT, 'cleanrl', 'ppo.py')}"
RUN_PY, TUNE_PY = (os.path.join(REPO_ROOT, "benchmark", tool) for tool in ("run.py", "tune.py"))
# Every host has one core in slurm.conf: two array tasks of one core each land on two nodes.
RESOURCES = ["--cpus-per-task", "1", "--mem", "500M", "--time", "10:00"]
# A job's processes inherit the sbatch call's environment: the venv's programs (torchrun), one thread each.
JOB_ENVIRONMENT = {
    "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}",
    "OMP_NUM_THREADS": "1",
    "WANDB_MODE": "offline",
}
# ppo_atari_multigpu.py, small: each process plays 2 envs x 32 steps per iteration, two processes 128 steps.
SMALL = ["--local-num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
ITERATION = 128


@pytest.fixture
def slurm_hosts(make_hosts):
    """slurm_hosts(n, **options) -> a SlurmOnHosts on n new hosts (options: slurm.conf settings), stopped after."""
    if reason := slurm_on_hosts_missing():
        pytest.skip(reason)
    with contextlib.ExitStack() as stack:
        yield lambda n, **options: stack.enter_context(slurm_on_hosts(make_hosts(n), **options))


def submitted_job(result) -> str:
    match = re.search(r"^Submitted batch job (\d+)$", result.stdout, re.M)
    assert match, result.stdout + result.stderr
    return match[1]


def on_which_host(slurm, path: str) -> int:
    """The one host whose disk holds `path` (a path under local_folder, as the jobs see it)."""
    relative = os.path.relpath(path, local_folder(slurm.cluster))
    holders = [
        i for i in range(1, slurm.cluster.n + 1) if os.path.exists(os.path.join(slurm.cluster.disk(i), relative))
    ]
    assert len(holders) == 1, f"{relative} on hosts {holders}"
    return holders[0]


def on_disk(slurm, host: int, path: str) -> str:
    """`path` (as the jobs see it, under local_folder) where the test finds it: on host I's disk."""
    return os.path.join(slurm.cluster.disk(host), os.path.relpath(path, local_folder(slurm.cluster)))


def text_of(path: str) -> str:
    return open(path).read() if os.path.exists(path) else ""


def test_the_multinode_template_trains_one_run_on_two_nodes_with_equal_parameters(slurm_hosts):
    slurm = slurm_hosts(2)
    work = local_folder(slurm.cluster)  # one path on every node, each node's own disk
    args = [*SMALL, "--total-timesteps", str(3 * ITERATION), "--progress-interval", "0"]
    submit = slurm.run(["sbatch", f"--chdir={work}", MULTINODE, *args], cwd=REPO_ROOT, env=JOB_ENVIRONMENT)
    job = submitted_job(submit)
    wait_for_slurm_jobs(slurm.environment, timeout=180, run=slurm.run, logs=slurm.logs)

    output = open(on_disk(slurm, 1, f"{work}/slurm-{job}.out")).read()  # the batch script ran on the first node
    assert f"job {job}, start 1: nodes node[1-2], rendezvous node1:29400" in output, output
    assert "finished 3 iterations, 384 steps" in output, output
    digests = dict(re.findall(r"^rank (\d): played \d+ games, parameters sha256 (\w+)$", output, re.M))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], output
    for host in (1, 2):  # each host's slurmd started one torchrun of the job's step
        assert f"launch task StepId={job}.0 request" in slurm.log(host), slurm.log(host)
    (run_dir,) = os.listdir(on_disk(slurm, 1, f"{work}/runs"))
    scalars = read_scalars(on_disk(slurm, 1, f"{work}/runs/{run_dir}"))
    assert [step for step, _ in scalars["charts/SPS"]] == [ITERATION, 2 * ITERATION, 3 * ITERATION]


def test_run_py_array_tasks_run_on_both_nodes_and_keep_their_logs_and_runs_there(slurm_hosts):
    slurm = slurm_hosts(2)
    study = os.path.join(local_folder(slurm.cluster), "study")
    # No shared filesystem: the submit folder and its log folder are made on every node before submitting
    # (Slurm opens each task's --output there before the task starts).
    made = slurm.run(["srun", "--nodes=2", "--ntasks-per-node=1", "mkdir", "-p", f"{study}/logs"])
    assert made.returncode == 0, made.stderr
    command = f"{PPO} --total-timesteps 1024"
    runner = [sys.executable, RUN_PY, "--env-ids", "CartPole-v1", "--seeds", "1", "2", "--slurm", "--job-name", "study"]
    job = submitted_job(slurm.run([*runner, *RESOURCES, "--command", command], cwd=study, env=JOB_ENVIRONMENT))
    wait_for_slurm_jobs(slurm.environment, timeout=180, run=slurm.run, logs=slurm.logs)

    hosts = []
    for task, seed in enumerate((1, 2)):
        hosts.append(on_which_host(slurm, f"{study}/logs/study-{job}_{task}.out"))
        out = open(on_disk(slurm, hosts[-1], f"{study}/logs/study-{job}_{task}.out")).read()
        log_path = f"{study}/logs/CartPole-v1__ppo__{seed}.log"
        assert out.startswith(f"task {task}: CartPole-v1__ppo__{seed} (OMP_NUM_THREADS=1, output in {log_path} on ")
        assert out.splitlines()[0].endswith(f" on node{hosts[-1]})"), out  # the task names its host
        assert on_which_host(slurm, log_path) == hosts[-1]
        assert "finished 2 iterations, 1024 steps" in open(on_disk(slurm, hosts[-1], log_path)).read()
        (run_dir,) = os.listdir(on_disk(slurm, hosts[-1], f"{study}/runs"))
        assert run_dir.startswith(f"CartPole-v1__ppo__{seed}__")
    assert sorted(hosts) == [1, 2], "one task on each node"


def test_tune_py_tuners_on_both_nodes_share_one_study_on_node1s_postgresql(slurm_hosts):
    if reason := postgresql_missing():
        pytest.skip(reason)
    slurm = slurm_hosts(2)
    study = os.path.join(local_folder(slurm.cluster), "study")
    assert slurm.run(["srun", "--nodes=2", "--ntasks-per-node=1", "mkdir", "-p", f"{study}/logs"]).returncode == 0
    with postgresql_server(slurm.cluster) as url:
        assert url.startswith("postgresql://postgres@node1:")
        tuner = [
            *(sys.executable, TUNE_PY, "--command", f"{PPO} --total-timesteps 1024", "--env-ids", "CartPole-v1"),
            *("--param", "learning-rate=log:1e-4:1e-2", "--n-trials", "2", "--pruner", "none"),
            *("--window", "10", "--read-interval", "1", "--storage", url, "--slurm", "--array-tasks", "2"),
        ]
        job = submitted_job(slurm.run([*tuner, *RESOURCES], cwd=study, env=JOB_ENVIRONMENT))
        wait_for_slurm_jobs(slurm.environment, timeout=240, run=slurm.run, logs=slurm.logs)
        # the study as every node sees it: from node1, through the server
        study_of = f"optuna.load_study(study_name='ppo-CartPole-v1', storage='{url}')"
        show = f"import optuna; print([trial.state.name for trial in {study_of}.trials])"
        states = slurm.run([sys.executable, "-c", show])
        assert states.stdout.strip() == "['COMPLETE', 'COMPLETE']", states.stdout + states.stderr

    hosts, started = [], []
    for task in (0, 1):
        hosts.append(on_which_host(slurm, f"{study}/logs/tune-ppo-CartPole-v1-{job}_{task}.out"))
        out = open(on_disk(slurm, hosts[-1], f"{study}/logs/tune-ppo-CartPole-v1-{job}_{task}.out")).read()
        assert out.splitlines()[0].endswith(f" on node{hosts[-1]})"), out
        output = open(on_disk(slurm, hosts[-1], f"{study}/logs/ppo-CartPole-v1-tuner{task}.log")).read()
        started.append([int(n) for n in re.findall(r"\] trial (\d+) started", output)])
        for trial in started[-1]:  # each trial's run on the node of the tuner that ran it
            runs = os.listdir(on_disk(slurm, hosts[-1], f"{study}/runs"))
            assert any(run.startswith(f"CartPole-v1__ppo-CartPole-v1-trial{trial}__1__") for run in runs), runs
    assert sorted(hosts) == [1, 2], "one tuner on each node"
    assert sorted(started[0] + started[1]) == [0, 1] and all(started), started


def test_a_job_that_loses_a_node_is_requeued_on_the_others_and_resumes_from_its_checkpoint(slurm_hosts):
    # Slurm marks a node DOWN after SlurmdTimeout without an answer and requeues its jobs; a requeued job
    # starts again after cred_expire. Three hosts: the 2-node job restarts on node1 and node3.
    slurm = slurm_hosts(3, SlurmdTimeout=10, cred_expire=10, KillWait=5)
    work = local_folder(slurm.cluster)
    iterations = 8
    args = [*SMALL, "--total-timesteps", str(iterations * ITERATION), "--checkpoint-every", "2"]
    submit = ["sbatch", f"--chdir={work}", MULTINODE, *args, "--progress-interval", "0"]
    job = submitted_job(slurm.run(submit, cwd=REPO_ROOT, env=JOB_ENVIRONMENT))
    output_path = on_disk(slurm, 1, f"{work}/slurm-{job}.out")
    deadline = time.time() + 120
    while not re.search(r"^checkpoint .*iteration-0*2\.pt$", text_of(output_path), re.M):
        assert time.time() < deadline, text_of(output_path)
        time.sleep(0.5)
    slurm.cluster.kill(2)  # a power cut: node2's slurmd, munged, torchrun and worker
    wait_for_slurm_jobs(slurm.environment, timeout=240, run=slurm.run, logs=slurm.logs)

    output = open(output_path).read()
    first, second = output.split(f"job {job}, start 2: ")
    assert f"job {job}, start 1: nodes node[1-2]" in first
    assert second.startswith("nodes node[1,3]"), second
    resumed = re.search(r"^the job resumes at step ([\d,]+)", second, re.M)
    newest = max(int(n) for n in re.findall(r"^checkpoint .*iteration-(\d+)\.pt$", first, re.M))
    # at most --checkpoint-every iterations done twice
    assert resumed and int(resumed[1].replace(",", "")) == newest * ITERATION, second
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in second, second
    digests = set(re.findall(r"parameters sha256 (\w+)$", second, re.M))
    assert len(digests) == 1, second
    (run_dir,) = os.listdir(on_disk(slurm, 1, f"{work}/runs"))  # node1, in both starts, keeps the run's events
    steps = [step for step, _ in read_scalars(on_disk(slurm, 1, f"{work}/runs/{run_dir}"))["charts/SPS"]]
    assert steps == [ITERATION * (i + 1) for i in range(iterations)], steps
