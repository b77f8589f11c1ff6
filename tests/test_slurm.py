"""benchmark/run.py --slurm and benchmark/tune.py --slurm against a real single-node Slurm cluster
(slurmctld, slurmd and munged on localhost, started by tests/services.py): the array jobs are
submitted with the real sbatch, their tasks run cleanrl/ppo.py, and the logs, the runs and the study
are where they should be. (tests/test_run.py checks the rendered script with a fake sbatch.)"""

import os
import re
import subprocess
import sys

import optuna
import pytest
from optuna.trial import TrialState
from running import REPO_ROOT, run_tool
from services import slurm_cluster, slurm_missing, wait_for_slurm_jobs

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

PPO = f"{sys.executable} {os.path.join(REPO_ROOT, 'cleanrl', 'ppo.py')}"
# Each array task gets one of the node's cores and a little memory: two tasks run at once.
RESOURCES = ["--cpus-per-task", "1", "--mem", "500M", "--time", "10:00"]


@pytest.fixture(scope="module")
def slurm():
    if reason := slurm_missing():
        pytest.skip(reason)
    with slurm_cluster() as environment:
        yield environment


def submitted_job(output: str) -> str:
    match = re.search(r"^Submitted batch job (\d+)$", output, re.M)
    assert match, output
    return match[1]


def test_run_py_submits_an_array_job_whose_tasks_train_each_seed(slurm, tmp_path):
    result = run_tool(
        "run.py",
        "--env-ids",
        "CartPole-v1",
        "--seeds",
        "1",
        "2",
        "--slurm",
        "--job-name",
        "study",
        *RESOURCES,
        "--command",
        f"{PPO} --total-timesteps 1024",
        cwd=tmp_path,
        env=slurm,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    job = submitted_job(result.stdout)
    wait_for_slurm_jobs(slurm, timeout=180)
    for task, seed in enumerate((1, 2)):
        out = (tmp_path / "logs" / f"study-{job}_{task}.out").read_text()
        assert out.startswith(f"task {task}: CartPole-v1__ppo__{seed} (OMP_NUM_THREADS=1"), out
        log = (tmp_path / "logs" / f"CartPole-v1__ppo__{seed}.log").read_text()
        assert log.startswith(f"# {PPO} --total-timesteps 1024 --env-id CartPole-v1 --seed {seed}\n")
        assert "finished 2 iterations, 1024 steps" in log, log
        (run_dir,) = (tmp_path / "runs").glob(f"CartPole-v1__ppo__{seed}__*")
        assert list(run_dir.glob("events.out.tfevents*"))


def test_tune_py_submits_tuners_that_share_one_study_through_a_journal_file(slurm, tmp_path):
    journal = tmp_path / "tune.journal"
    result = run_tool(
        "tune.py",
        "--command",
        f"{PPO} --total-timesteps 1024",
        "--env-ids",
        "CartPole-v1",
        "--param",
        "learning-rate=log:1e-4:1e-2",
        "--param",
        "num-minibatches=choice:2,4",
        "--n-trials",
        "2",
        "--pruner",
        "none",
        "--window",
        "10",
        "--read-interval",
        "1",
        "--storage",
        f"journal:{journal}",
        "--slurm",
        "--array-tasks",
        "2",
        *RESOURCES,
        cwd=tmp_path,
        env=slurm,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "#SBATCH --array=0-1\n" in result.stdout and "tune.py --study-name ppo-CartPole-v1 --storage" in result.stdout
    )
    job = submitted_job(result.stdout)
    wait_for_slurm_jobs(slurm, timeout=240)

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    trials = optuna.load_study(study_name="ppo-CartPole-v1", storage=storage).get_trials()
    assert sum(trial.state == TrialState.COMPLETE for trial in trials) >= 2, [trial.state for trial in trials]
    outputs = [(tmp_path / "logs" / f"ppo-CartPole-v1-tuner{task}.log").read_text() for task in (0, 1)]
    started = [int(n) for output in outputs for n in re.findall(r"\] trial (\d+) started", output)]
    assert sorted(started) == [trial.number for trial in trials], "every trial ran once, in one of the tuners"
    assert all(started_in for started_in in (re.findall(r"trial \d+ started", output) for output in outputs)), (
        "both array tasks ran trials"
    )
    for trial in trials:
        (run_dir,) = (tmp_path / "runs").glob(f"CartPole-v1__ppo-CartPole-v1-trial{trial.number}__1__*")
        assert list(run_dir.glob("events.out.tfevents*"))
    assert (tmp_path / "logs" / f"tune-ppo-CartPole-v1-{job}_0.out").exists()


def test_the_jax_script_under_srun_with_two_tasks_trains_one_job_of_two_processes(slurm, tmp_path):
    # No coordinator flag: JAX reads the coordinator and each process's place from Slurm's variables.
    script = os.path.join(REPO_ROOT, "cleanrl", "ppo_atari_envpool_xla_jax_scan.py")
    short = ["--num-envs", "2", "--num-steps", "32", "--total-timesteps", "128", "--progress-interval", "0"]
    srun = ["srun", "--ntasks", "2", "--cpus-per-task", "1", "--time", "10:00", "--label"]
    result = subprocess.run(
        [*srun, sys.executable, script, *short],
        cwd=tmp_path,
        env={**os.environ, **slurm, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0: 2 cpu device(s) on 2 process(es): 2 envs (1 per device)" in result.stdout, result.stdout
    digests = dict(re.findall(r"^(\d): process \1: parameters sha256 per device (\w+)$", result.stdout, re.M))
    assert set(digests) == {"0", "1"} and digests["0"] == digests["1"], result.stdout
    assert len(list((tmp_path / "runs").iterdir())) == 1  # one job, logged by process 0
