"""benchmark/tune.py, the Optuna tuner, on real trials of cleanrl/ppo.py (CartPole, 2,048 steps each): a
tiny study on 2 local workers whose median pruner must stop a deliberately bad trial, its results,
continuing it, bad input; and two tuners sharing one study through a real PostgreSQL server, one of
them SIGKILLed in the middle of a trial (tests/services.py starts the server). Then, in a few seconds each,
trials of a stand-in script whose returns are known (tests/fake_train.py --score): the objective and its
reports (seeds, window, steps, normalization), failed and killed runs, the pruner's warm-up and budget, the
sampled values on the command line, the array tasks' seeds and options, SIGHUP and SIGKILL of the tuner."""

import json
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time

import optuna
import pytest
import sqlalchemy
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState
from running import (
    FAKE_TRAIN,
    REPO_ROOT,
    assert_user_error,
    is_alive,
    read_scalars,
    run_tool,
    subprocess_environment,
)
from services import postgresql_missing, postgresql_server

# RetryHeartbeatStaleTrialCallback and its helpers are "experimental" in Optuna (since 2.8).
pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")

PPO = f"{sys.executable} {os.path.join(REPO_ROOT, 'cleanrl', 'ppo.py')}"
DQN = f"{sys.executable} {os.path.join(REPO_ROOT, 'cleanrl', 'dqn.py')}"
TINY = f"{PPO} --total-timesteps 2048"  # 4 iterations of 4 envs x 128 steps: a few seconds with start-up
# Fast reads of the runs' events, no periodic status lines, and the returns of the last 20 games.
QUICK = ["--window", "20", "--report-every", "512", "--read-interval", "1", "--status-interval", "1000"]
# The study's runs are longer (32 iterations): a run writes its events in blocks, and a run of 4
# iterations on a fast machine ends before the tuner can read its second report. Trials 0 and 1 learn;
# trial 2 has learning rate 0 and stays at random play's 22 or so: once the good trials are complete, the
# median pruner must stop it at one of its first reports, long before its end. The pruner waits for both
# good trials (--pruner-startup-trials 2): they run at once, and had it started after one, the trial
# finishing second would be pruned wherever its best report so far trails the other's at that step.
PRUNABLE = f"{PPO} --total-timesteps 16384"
STUDY = [
    "--command", PRUNABLE,
    *"--env-ids CartPole-v1 --param learning-rate=float:0:0.01 --pruner-startup-trials 2 --workers 2".split(),
    *"--enqueue learning-rate=0.0025 --enqueue learning-rate=0.003 --enqueue learning-rate=0".split(),
    *QUICK,
]  # fmt: skip


def tuner(*args: str, cwd, timeout: int = 300, env: dict | None = None):
    return run_tool("tune.py", *args, cwd=cwd, timeout=timeout, env=env)


def load_study(cwd, name: str = "ppo-CartPole-v1", storage: str | None = None) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage or f"sqlite:///{cwd}/tune/optuna.db")


def started_trials(output: str) -> list[int]:
    return [int(number) for number in re.findall(r"\] trial (\d+) started", output)]


# ---------------------------------------------------------------------------------------------
# A tiny study on two local workers
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_study(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("tiny_study")
    result = tuner(*STUDY, "--n-trials", "3", cwd=cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    return cwd, result.stdout


def test_a_tiny_study_completes_the_good_trials_and_prunes_the_bad_one(tiny_study):
    cwd, output = tiny_study
    trials = load_study(cwd).get_trials()
    assert [trial.params["learning-rate"] for trial in trials] == [0.0025, 0.003, 0.0]
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED]
    assert all(trial.value > 35 for trial in trials[:2]), [trial.value for trial in trials]
    assert trials[2].value < 25, "a pruned trial's value is its last report: random play"
    assert "trial 2 pruned at step" in output


def test_two_trials_ran_at_once_each_with_its_share_of_the_cores(tiny_study):
    cwd, output = tiny_study
    assert started_trials(output) == [0, 1, 2]
    # trials 0 and 1 both started before either ended
    assert output.index("trial 1 started") < output.index("trial 0 complete")
    threads = max(1, len(os.sched_getaffinity(0)) // 2)
    log = (cwd / "logs" / "CartPole-v1__ppo-CartPole-v1-trial0__1.log").read_text()
    assert log.startswith(
        f"# {PRUNABLE} --learning-rate 0.0025 --exp-name ppo-CartPole-v1-trial0 --env-id CartPole-v1 "
        f"--seed 1\n# OMP_NUM_THREADS={threads}, started "
    )
    assert log.splitlines()[-1].startswith("# exit 0 after "), "the runner's exit line ends the log"


def test_the_pruned_trial_was_stopped_midway_and_its_run_is_kept_and_marked(tiny_study):
    cwd, _ = tiny_study
    log = (cwd / "logs" / "CartPole-v1__ppo-CartPole-v1-trial2__1.log").read_text()
    assert "KeyboardInterrupt" in log, "stopped like a Ctrl-C"
    assert "finished 32 iterations" not in log, "it did not run to its end"
    assert re.search(r"# pruned by benchmark/tune.py at step \d+ \(trial 2 of ppo-CartPole-v1\)\n$", log)
    (run_dir,) = (cwd / "runs").glob("CartPole-v1__ppo-CartPole-v1-trial2__1__*")
    assert (run_dir / "PRUNED").read_text().startswith("pruned by benchmark/tune.py at step ")
    assert list(run_dir.glob("events.out.tfevents*")), "the run's events are kept"


def test_the_results_give_the_best_trials_the_command_and_optunas_figures(tiny_study):
    cwd, output = tiny_study
    results = (cwd / "tune" / "ppo-CartPole-v1" / "results.md").read_text()
    assert results in output
    assert "2 complete, 1 pruned, 0 failed" in results
    rows = [line for line in results.splitlines() if re.match(r"\| \d+ \|", line)]
    trials = load_study(cwd).get_trials()
    best = max(trials[:2], key=lambda trial: trial.value)
    assert rows[0].startswith(f"| {best.number} | {best.value:.4g} ± 0 | {best.params['learning-rate']:.4g} |")
    assert len(rows) == 2, "the pruned trial has no row"
    assert (
        f"python benchmark/run.py --env-ids CartPole-v1 --seeds 1 --command '{PRUNABLE} --learning-rate "
        f"{best.params['learning-rate']}'"
    ) in results
    for figure in ("optimization_history", "param_importances", "parallel_coordinate", "intermediate_values"):
        png = cwd / "tune" / "ppo-CartPole-v1" / f"{figure}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", figure
    assert f"optuna-dashboard sqlite:///{cwd}/tune/optuna.db" in output


def test_the_same_command_again_continues_the_study_and_runs_no_trial_twice(tiny_study):
    cwd, _ = tiny_study
    logs = {path.name: path.read_text() for path in (cwd / "logs").glob("*.log")}
    again = tuner(*STUDY, "--n-trials", "3", cwd=cwd)
    assert again.returncode == 0, again.stderr
    assert started_trials(again.stdout) == [] and "the study has 3 finished trials" in again.stdout
    more = tuner(*STUDY, "--n-trials", "4", cwd=cwd)
    assert more.returncode == 0, more.stderr
    assert started_trials(more.stdout) == [3], "the enqueued trials are not queued again"
    trials = load_study(cwd).get_trials()
    assert len(trials) == 4 and trials[3].state in (TrialState.COMPLETE, TrialState.PRUNED)
    assert {path.name: path.read_text() for path in (cwd / "logs").glob("*.log") if path.name in logs} == logs


def test_a_study_is_not_continued_with_another_command(tiny_study):
    cwd, _ = tiny_study
    other = [*STUDY, "--n-trials", "5"]
    other[other.index("--env-ids") - 1] = f"{PRUNABLE} --num-envs 2"
    assert_user_error(
        tuner(*other, cwd=cwd),
        "study ppo-CartPole-v1 was made with another command",
        "give this search its own --study-name",
    )


def test_report_prints_the_results_of_a_study_without_running_anything(tiny_study):
    cwd, _ = tiny_study
    result = tuner("--report", "--study-name", "ppo-CartPole-v1", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "# Study ppo-CartPole-v1" in result.stdout and "| trial |" in result.stdout


def first_run_started(process: subprocess.Popen, study: str = "ppo-CartPole-v1") -> tuple[int, int, str]:
    """Reads a tuner's output until its first run has started: (trial number, the run's pid, what it read)."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if match := re.search(rf"started CartPole-v1__{study}-trial(\d+)__1 \(pid (\d+),", line):
            return int(match[1]), int(match[2]), "".join(lines)
    raise AssertionError("".join(lines))


def tuner_with_a_long_run(cwd) -> tuple[subprocess.Popen, int]:
    """A tuner of one trial whose run trains long (minutes: a loaded machine may take 25 s to see it start), 2 s
    after the run started: (the tuner, the run's pid)."""
    process = start_tuner(
        "--command", f"{PPO} --total-timesteps 1000000", "--env-ids", "CartPole-v1",
        "--param", "learning-rate=log:1e-4:1e-2", "--n-trials", "1", *QUICK, cwd=cwd,
    )  # fmt: skip
    _, run_pid, _ = first_run_started(process)
    time.sleep(2)
    return process, run_pid


def test_sigterm_stops_the_runs_cleanly_and_queues_the_trial_again(tmp_path):
    process, run_pid = tuner_with_a_long_run(tmp_path)
    process.send_signal(signal.SIGTERM)  # a scheduler's stop, a kill: as Ctrl-C
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    assert output.strip().splitlines()[-1] == "error: interrupted: stopped trial(s) 0 (failed, and queued to run again)"
    assert not is_alive(run_pid)
    assert "KeyboardInterrupt" in (tmp_path / "logs" / "CartPole-v1__ppo-CartPole-v1-trial0__1.log").read_text()
    trials = load_study(tmp_path).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.WAITING]
    assert trials[1].params == trials[0].params, "the same command again runs it first"


def test_a_second_sigterm_while_the_runs_stop_still_stops_them_and_records_the_trial(tmp_path):
    # The second signal comes while the first one's stop waits for the run to exit: at SIGTERM's default
    # action it killed the tuner there, leaving the trial RUNNING and nothing queued.
    process, run_pid = tuner_with_a_long_run(tmp_path)
    process.send_signal(signal.SIGTERM)
    time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 130, output
    assert not is_alive(run_pid)
    assert [trial.state for trial in load_study(tmp_path).get_trials()] == [TrialState.FAIL, TrialState.WAITING]


def test_interrupted_trials_are_queued_once_say_so_and_never_make_the_tuner_give_up(tmp_path):
    # Three tuners, each stopped by SIGTERM once its trial's run has started, then a fourth left to finish:
    # trial 0 is queued again as trial 1; trial 1, a retry, is not; trial 2 is queued again as trial 3.
    # Three failed trials, none of them a failure of the command: the last tuner runs trial 3.
    arguments = ["--command", TINY, "--env-ids", "CartPole-v1", "--param", "learning-rate=log:1e-4:1e-2"]
    arguments += ["--n-trials", "1", "--pruner", "none", *QUICK]
    messages = []
    for _ in range(3):
        process = start_tuner(*arguments, cwd=tmp_path)
        first_run_started(process)
        time.sleep(1)  # the tuner has started the run; now it holds the trial as one of its own
        process.send_signal(signal.SIGTERM)
        output = process.communicate(timeout=120)[0]
        assert process.returncode == 130, output
        messages.append(output.strip().splitlines()[-1])
    assert messages == [
        "error: interrupted: stopped trial(s) 0 (failed, and queued to run again)",
        "error: interrupted: stopped trial(s) 1 (failed; a retry of trial 0, not queued again)",
        "error: interrupted: stopped trial(s) 2 (failed, and queued to run again)",
    ]
    last = tuner(*arguments, cwd=tmp_path)
    assert last.returncode == 0, last.stdout + last.stderr
    assert started_trials(last.stdout) == [3] and "trial 3 started (a retry of trial 2)" in last.stdout
    trials = load_study(tmp_path).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL] * 3 + [TrialState.COMPLETE]
    assert trials[3].params == trials[2].params


def test_a_trial_is_scored_from_its_own_run_not_from_an_earlier_study_of_the_same_name(tmp_path):
    # The same study name in two storages, in one folder: the second study's trial 0 has the run names of
    # the first's, and starts while the first's run directory and log are there.
    arguments = ["--command", TINY, "--env-ids", "CartPole-v1", "--param", "learning-rate=float:0:0.01"]
    arguments += ["--n-trials", "1", "--pruner", "none", *QUICK]
    studies = []
    for storage, learning_rate in (("first.db", "0.01"), ("second.db", "0")):
        result = tuner(
            *arguments, "--storage", f"sqlite:///{storage}", "--enqueue", f"learning-rate={learning_rate}", cwd=tmp_path
        )
        assert result.returncode == 0, result.stdout + result.stderr
        studies.append(load_study(tmp_path, storage=f"sqlite:///{tmp_path}/{storage}"))
    first, second = (study.get_trials()[0] for study in studies)
    assert second.params["learning-rate"] == 0.0 and first.params["learning-rate"] == 0.01
    (first_dir,), (second_dir,) = first.user_attrs["run_dirs"], second.user_attrs["run_dirs"]
    assert second_dir != first_dir, "the second study's trial took the first study's run"
    returns = [value for _, value in read_scalars(str(tmp_path / second_dir))["charts/episodic_return"]]
    assert second.value == pytest.approx(sum(returns[-20:]) / len(returns[-20:]))
    # the first study's log is kept beside the second's
    (kept,) = (tmp_path / "logs").glob("CartPole-v1__ppo-CartPole-v1-trial0__1__*.log")
    assert kept.read_text().startswith(f"# {TINY} --learning-rate 0.01 --exp-name ")
    log = (tmp_path / "logs" / "CartPole-v1__ppo-CartPole-v1-trial0__1.log").read_text()
    assert log.startswith(f"# {TINY} --learning-rate 0.0 --exp-name ")


def test_a_trial_that_trained_its_whole_budget_is_not_pruned_while_its_evaluation_runs(tmp_path):
    # Trial 0 learns; trial 1 plays at random (epsilon 1), far below trial 0 at the report of their last
    # step, 6,000. Trial 1's evaluation (--save-model, 4,000 episodes) keeps its process alive for
    # seconds after that step: the pruner must not stop a run that has trained its budget.
    command = f"{DQN} --total-timesteps 6000 --learning-starts 500 --learning-rate 0.001 --save-model"
    command += " --eval-episodes 4000 --eval-epsilon 1"
    result = tuner(
        "--command", command, "--env-ids", "CartPole-v1", "--param", "end-e=float:0:1",
        "--enqueue", "end-e=0.05", "--enqueue", "end-e=1", "--n-trials", "2", "--pruner-startup-trials", "1",
        *QUICK, "--report-every", "6000", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load_study(tmp_path, name="dqn-CartPole-v1").get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE], result.stdout
    assert trials[1].value < trials[0].value, "a trial the pruner would have stopped at step 6,000"
    assert list(trials[1].intermediate_values) == [6000], "the last step is reported all the same"
    log = (tmp_path / "logs" / "CartPole-v1__dqn-CartPole-v1-trial1__1.log").read_text()
    assert "over 4000 episodes" in log and log.splitlines()[-1].startswith("# exit 0 after ")


def test_a_trial_failed_by_another_tuner_is_dropped_at_its_next_heartbeat_in_a_journal(tune, tmp_path):
    # Another tuner found no heartbeat of trial 0 within its grace period (this one stalled: a suspended
    # machine, a slow shared filesystem), failed it and queued it again; here its grace period is 0. The
    # journal refuses this tuner's next heartbeat of the finished trial: the tuner must stop the trial's run,
    # let the trial go and run the retry. No report comes before that heartbeat: the only one is at the end.
    journal = f"journal:{tmp_path / 'tune.journal'}"
    process = start_tuner(
        "--command", f"{PPO} --total-timesteps 16384", "--env-ids", "CartPole-v1", "--storage", journal,
        "--param", "learning-rate=log:1e-4:1e-2", "--n-trials", "1", "--pruner", "none", "--heartbeat-interval", "1",
        *QUICK, "--report-every", "16384", cwd=tmp_path,
    )  # fmt: skip
    trial, _, _ = first_run_started(process)
    other_tuner = optuna.load_study(study_name="ppo-CartPole-v1", storage=tune.open_storage(journal, 0))
    optuna.storages.fail_stale_trials(other_tuner)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 0 and "Traceback" not in output, output
    assert trial == 0 and "trial 0 was failed by another tuner" in output
    assert "trial 1 started (a retry of trial 0)" in output
    trials = optuna.load_study(study_name="ppo-CartPole-v1", storage=tune.open_storage(journal, 60)).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    log = (tmp_path / "logs" / "CartPole-v1__ppo-CartPole-v1-trial0__1.log").read_text()
    assert "KeyboardInterrupt" in log and "finished 32 iterations" not in log, "trial 0's run was stopped"


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
BASE = ["--command", TINY, "--env-ids", "CartPole-v1"]


@pytest.fixture(scope="module")
def tune():
    """benchmark/tune.py imported in this process: the checks run here without a process each."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmark"))
    import tune

    return tune


def assert_fails_with(function, *fragments: str):
    """function() stops with a one-line `error: ...` naming the problem (what the shell gets as stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        function()
    message = exit_info.value.code
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        ([*BASE, "--param", "learning-rate=log:0:1e-3"], "a log range needs LOW > 0"),
        ([*BASE, "--param", "learning-rate=float:1e-3:1e-5"], "LOW must be below HIGH"),
        ([*BASE, "--param", "learning-rate=uniform:1:2"], "unknown kind 'uniform'"),
        ([*BASE, "--param", "learning-rate=float:a:1"], "'a' is not a number"),
        ([*BASE, "--param", "num-minibatches=choice:4,4"], "the choices must be distinct"),
        ([*BASE, "--param", "learning-rate"], "use NAME=float:LOW:HIGH"),
        ([*BASE, "--param", "learning-rate=log:1e-5:1e-3", "--n-trials", "0"], "--n-trials must be at least 1"),
        ([*BASE], "no --param"),
        (
            [*BASE, "--param", "learning-rate=log:1e-5:1e-3", "--storage", "postgresql://nobody@127.0.0.1:1/none"],
            "cannot reach the storage postgresql://nobody@127.0.0.1:1/none",
        ),
        (
            [*BASE, "--param", "learning-rate=log:1e-5:1e-3", "--storage", "postgresql://me:secret@127.0.0.1:1/none"],
            "cannot reach the storage postgresql://me:***@127.0.0.1:1/none",
        ),
        ([*BASE, "--param", "learning-rate=log:1e-5:1e-3", "--slurm"], "SQLite does not lock reliably"),
        (
            ["--command", f"{TINY} --seed 3", "--env-ids", "CartPole-v1", "--param", "ent-coef=float:0:0.1"],
            "--command sets --seed",
        ),
        (
            [*BASE, "Acrobot-v1", "--param", "ent-coef=float:0:0.1"],
            "CartPole-v1 needs --score-range CartPole-v1=LOW:HIGH",
        ),
        ([*BASE, "--param", "ent-coef=float:0:0.1", "--score-range", "CartPole-v1=500:0"], "LOW must be below HIGH"),
        # --n-trials 1: without its check, a case goes on to run one trial (not 20) here
        ([*BASE, "--param", "learning-rate=float:0:inf", "--n-trials", "1"], "'inf' is not a finite number"),
        ([*BASE, "--param", "learning-rate=float:nan:1", "--n-trials", "1"], "'nan' is not a finite number"),
        (
            [*BASE, "--param", "ent-coef=float:0:0.1", "--score-range", "CartPole-v1=0:inf", "--n-trials", "1"],
            "'inf' is not a finite number",
        ),
        (
            [*BASE, "--param", "num-envs=int:1:4", "--enqueue", "num-envs=2.7", "--n-trials", "1"],
            "--enqueue 'num-envs=2.7': --param num-envs takes whole numbers",
        ),
        (
            [*BASE, "--param", "num-envs=int:2:8:2", "--enqueue", "num-envs=3", "--n-trials", "1"],
            "3 is not on the grid of --param num-envs (2 + k x 2)",
        ),
        (
            [*BASE, "--param", "ent-coef=float:0:0.1:0.025", "--enqueue", "ent-coef=0.03", "--n-trials", "1"],
            "0.03 is not on the grid of --param ent-coef (0 + k x 0.025)",
        ),
        (
            [*BASE, "--param", "ent-coef=float:0:0.1", "--enqueue", "ent-coef=0.5", "--n-trials", "1"],
            "0.5 is outside the range of --param ent-coef",
        ),
        (
            [*BASE, "--param", "num-minibatches=choice:2,4", "--enqueue", "num-minibatches=3", "--n-trials", "1"],
            "3 is not one of the choices of --param num-minibatches",
        ),
        (["--report", "--study-name", "nope"], "no study nope in sqlite:///tune/optuna.db"),
    ],
)
def test_bad_input_is_a_one_line_error_before_any_trial(tune, monkeypatch, tmp_path, arguments, fragment):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["tune.py", *arguments])
    assert_fails_with(tune.main, fragment)
    assert not (tmp_path / "logs").exists(), "no trial started"


@pytest.fixture(scope="module")
def ppo_flags(tune):
    return tune.script_flags(TINY.split())


@pytest.mark.parametrize(
    "param, fragment",
    [
        ("learning-rat=log:1e-5:1e-3", "cleanrl/ppo.py has no flag --learning-rat (see python cleanrl/ppo.py --help)"),
        ("num-minibatches=float:1:8", "--num-minibatches takes an integer"),
        ("norm-adv=float:0:1", "--norm-adv is a boolean flag; use norm-adv=choice:true,false"),
        ("norm-adv=choice:yes,no", "its choices are true and false"),
        ("seed=int:1:9", "the tuner sets --seed itself"),
        ("total-timesteps=int:1000:2000", "--command sets --total-timesteps too"),
    ],
)
def test_a_parameter_is_checked_against_the_flags_of_the_scripts_help(tune, ppo_flags, param, fragment):
    assert_fails_with(
        lambda: tune.check_params([tune.parse_param(param)], ppo_flags, TINY.split(), "cleanrl/ppo.py"), fragment
    )


def test_the_scripts_help_gives_each_flags_type_and_default(ppo_flags):
    assert (ppo_flags["learning-rate"].kind, ppo_flags["learning-rate"].default) == ("float", "0.00025")
    assert (ppo_flags["num-minibatches"].kind, ppo_flags["total-timesteps"].default) == ("int", "500000")
    assert ppo_flags["norm-adv"].kind == "bool" and ppo_flags["target-kl"].kind == "float"


def test_an_unknown_flag_stops_the_tuner_with_one_line_before_any_trial(tmp_path):
    result = tuner(*BASE, "--param", "learning-rate=log:1e-5:1e-3", "--param", "clip-coeff=float:0.1:0.3", cwd=tmp_path)
    assert_user_error(result, "cleanrl/ppo.py has no flag --clip-coeff")
    assert not (tmp_path / "logs").exists()


# ---------------------------------------------------------------------------------------------
# Two tuners, one study, a real PostgreSQL server
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def postgresql():
    if reason := postgresql_missing():
        pytest.skip(reason)
    with postgresql_server() as url:
        yield url


def start_tuner(*args: str, cwd) -> subprocess.Popen:
    """The tuner as a terminal starts it: SIGHUP at its default even where the tests run under nohup (the
    tuner keeps nohup's SIG_IGN, by design, and would never see the SIGHUP test's signal)."""
    return subprocess.Popen(
        [sys.executable, os.path.join(REPO_ROOT, "benchmark", "tune.py"), *args],
        cwd=cwd,
        env=subprocess_environment(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL),
    )


def test_a_tuner_killed_mid_trial_has_its_trial_failed_and_retried_by_the_others(postgresql, tmp_path):
    shared = [
        "--command", f"{PPO} --total-timesteps 1024", "--storage", postgresql,
        *"--env-ids CartPole-v1 --param learning-rate=log:1e-4:1e-2 --param num-minibatches=choice:2,4,8".split(),
        *"--n-trials 2 --heartbeat-interval 3 --pruner none".split(),
        *QUICK,
    ]  # fmt: skip
    killed = start_tuner(*shared, cwd=tmp_path)
    killed_trial, killed_run, killed_output = first_run_started(killed)
    time.sleep(1)  # its run is starting (a second of a few): the trial is running
    killed.kill()  # SIGKILL: no chance to tell the study anything
    killed.wait()
    other = start_tuner(*shared, cwd=tmp_path)
    deadline = time.time() + 10
    while is_alive(killed_run) and time.time() < deadline:
        time.sleep(0.1)
    assert not is_alive(killed_run), "the killed tuner's run got SIGKILL with it"
    restarted = start_tuner(*shared, cwd=tmp_path)  # the same command again, beside the other
    outputs = [process.communicate(timeout=300)[0] for process in (other, restarted)]
    assert [other.returncode, restarted.returncode] == [0, 0], outputs

    trials = optuna.load_study(study_name="ppo-CartPole-v1", storage=postgresql).get_trials()
    assert trials[killed_trial].state == TrialState.FAIL
    retries = [
        trial for trial in trials if RetryHeartbeatStaleTrialCallback.retried_trial_number(trial) == killed_trial
    ]
    assert len(retries) == 1 and retries[0].state == TrialState.COMPLETE, (killed_output, *outputs)
    assert retries[0].params == trials[killed_trial].params
    assert sum(trial.state == TrialState.COMPLETE for trial in trials) >= 2
    # every trial ran in one tuner, once
    started = started_trials(killed_output) + [number for output in outputs for number in started_trials(output)]
    assert sorted(started) == sorted(set(started)) == [trial.number for trial in trials]
    assert all(trial.state in (TrialState.COMPLETE, TrialState.FAIL) for trial in trials)


def test_a_stop_signal_while_a_trial_starts_stops_that_trial_too(postgresql, tmp_path):
    # The signal comes after the trial is in the study and before its runs are: here the tuner waits on a lock
    # that another connection holds on the trials' attributes, which it writes next. That trial used to stay
    # RUNNING, with no retry queued and the tuner saying it stopped none.
    optuna.create_study(storage=postgresql, study_name="tables")  # the schema, to lock a table of it
    engine = sqlalchemy.create_engine(postgresql)
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sqlalchemy.text("LOCK TABLE trial_user_attributes IN EXCLUSIVE MODE"))
        process = start_tuner(
            "--command", f"{PPO} --total-timesteps 100000", "--storage", postgresql, "--study-name", "held",
            *"--env-ids CartPole-v1 --param learning-rate=log:1e-4:1e-2 --n-trials 1".split(), *QUICK, cwd=tmp_path,
        )  # fmt: skip
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        deadline = time.time() + 60
        while watcher.execute(sqlalchemy.text(waiting)).scalar() == 0:
            assert process.poll() is None and time.time() < deadline, "the tuner never waited on the lock"
            watcher.rollback()  # a transaction sees one snapshot of pg_stat_activity
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        holder.rollback()  # the lock goes
        output = process.communicate(timeout=120)[0]
    engine.dispose()
    assert process.returncode == 130, output
    assert output.strip().splitlines()[-1] == "error: interrupted: stopped trial(s) 0 (failed, and queued to run again)"
    trials = optuna.load_study(study_name="held", storage=postgresql).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.WAITING]


def test_aws_batch_is_one_array_job_of_tuners_of_the_study(postgresql):
    # --dry-run: the SubmitJob request, checked against botocore's model of it; the study is made first.
    # Run from the repository root, as the image's /app: the script's path in --command is relative.
    result = tuner(
        "--aws-batch", "--array-tasks", "3", "--dry-run", "--storage", postgresql, "--study-name", "batch",
        "--command", "python cleanrl/ppo.py --total-timesteps 2048", "--env-ids", "CartPole-v1", "--seeds", "1", "2",
        "--param", "learning-rate=log:1e-4:1e-2", "--n-trials", "12", cwd=REPO_ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    request = json.loads(result.stdout.splitlines()[0])
    assert request["arrayProperties"] == {"size": 3} and request["jobQueue"] == "cleanrl-queue"
    command = request["containerOverrides"]["command"]
    assert command[:6] == ["python", "benchmark/tune.py", "--study-name", "batch", "--storage", postgresql]
    assert shlex.join(command[6:]) == (
        "--command 'python cleanrl/ppo.py --total-timesteps 2048' --env-ids CartPole-v1 --seeds 1 2 "
        "--param learning-rate=log:1e-4:1e-2 --n-trials 12 --report-every 204"
    )
    assert optuna.load_study(study_name="batch", storage=postgresql).user_attrs["seeds"] == [1, 2]


def test_the_docs_arguments_table_names_every_flag_of_the_tuner(tune):
    flags = {
        flag
        for action in tune.make_parser()._actions
        for flag in action.option_strings
        if flag.startswith("--") and flag != "--help"
    }
    with open(os.path.join(REPO_ROOT, "docs", "tuning.md")) as f:
        table = f.read().split("## Arguments", 1)[1].split("\n## ", 1)[0]
    rows = {
        flag
        for line in table.splitlines()
        if line.startswith("| `")
        for flag in re.findall(r"`(--[\w-]+)`", line.split(" | ")[0])
    }
    assert sorted(flags - rows) == [], "docs/tuning.md's Arguments table lacks these flags"
    assert sorted(rows - flags) == [], "docs/tuning.md's Arguments table names flags the tuner does not have"


# ---------------------------------------------------------------------------------------------
# Trials of a stand-in script with known returns (tests/fake_train.py --score), a few seconds each
# ---------------------------------------------------------------------------------------------
# The fake's k-th game ends at step 250 x k with the return score x seed + k; an iteration is 1,000 steps.
FAKE = f"{sys.executable} {FAKE_TRAIN}"
FAKE_STUDY = "fake-train-CartPole-v1"
FAKE_QUICK = ["--window", "5", "--report-every", "1000", "--read-interval", "0.2", "--status-interval", "1000"]


def mean_of_last_games(cwd, run_dir: str, until: float = math.inf, window: int = 5) -> float:
    """A run's mean return of its last `window` games ended by step `until`, from its events."""
    games = read_scalars(str(cwd / run_dir))["charts/episodic_return"]
    returns = [value for step, value in games if step <= until][-window:]
    return sum(returns) / len(returns)


def test_the_objective_and_its_reports_are_the_mean_over_seeds_of_each_runs_last_games(tmp_path):
    # Seeds 1 and 2 of the trial return different games (10 x seed + k): the objective is the mean of the two
    # runs' means of their last 5 games, and each report the same of the games ended by its step.
    result = tuner(
        "--command", f"{FAKE} --total-timesteps 3000", "--env-ids", "CartPole-v1", "--seeds", "1", "2",
        "--param", "score=float:0:100", "--enqueue", "score=10", "--n-trials", "1", "--pruner", "none", *FAKE_QUICK,
        cwd=tmp_path, env={"SLURM_CPUS_PER_TASK": "8"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    (trial,) = load_study(tmp_path, FAKE_STUDY).get_trials()
    run_dirs = trial.user_attrs["run_dirs"]
    assert [run_dir.rsplit("__", 1)[0] for run_dir in run_dirs] == [
        f"runs/CartPole-v1__{FAKE_STUDY}-trial0__{seed}" for seed in (1, 2)
    ], "each seed's value is read from its own run"
    per_seed = [mean_of_last_games(tmp_path, run_dir) for run_dir in run_dirs]
    assert per_seed == [20.0, 30.0]  # games 8 to 12 of 10 x seed + k
    assert trial.user_attrs["seed_values"] == per_seed and trial.user_attrs["std"] == 5.0
    assert trial.value == 25.0
    assert trial.intermediate_values == {
        step: sum(mean_of_last_games(tmp_path, run_dir, until=step) for run_dir in run_dirs) / 2
        for step in (1000, 2000, 3000)
    }
    for seed in (1, 2):  # the task's 8 cores shared by the trial's 2 runs
        log = (tmp_path / "logs" / f"CartPole-v1__{FAKE_STUDY}-trial0__{seed}.log").read_text()
        assert log.splitlines()[1].startswith("# OMP_NUM_THREADS=4, "), log


def test_the_returns_of_several_env_ids_or_of_one_with_a_range_are_normalized(tmp_path):
    # Each run's last 5 games return 20 on average. Two studies in one storage: the second's trial 0 is the
    # storage's second trial, and its runs are named by its number in the study all the same.
    same = ["--param", "score=float:0:100", "--enqueue", "score=10", "--n-trials", "1", "--pruner", "none"]
    for name, ranges in (("both", ["CartPole-v1=10:20", "Acrobot-v1=0:100"]), ("one", ["CartPole-v1=10:30"])):
        env_ids = [env_range.split("=")[0] for env_range in ranges]
        result = tuner(
            "--command", f"{FAKE} --total-timesteps 3000", "--env-ids", *env_ids, "--score-range", *ranges,
            "--study-name", name, *same, *FAKE_QUICK, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    (both,), (one,) = (load_study(tmp_path, name).get_trials() for name in ("both", "one"))
    assert both.value == pytest.approx(((20 - 10) / (20 - 10) + (20 - 0) / (100 - 0)) / 2)
    assert one.value == pytest.approx((20 - 10) / (30 - 10)), "a range given for a single env id is used"
    assert one.user_attrs["logs"] == ["logs/CartPole-v1__one-trial0__1.log"]


@pytest.mark.parametrize(
    "flags, error",
    [
        ("--fail-seeds 1", "CartPole-v1__fake-train-CartPole-v1-trial{number}__1 exited 1 (see logs/"),
        ("--kill-self", "CartPole-v1__fake-train-CartPole-v1-trial{number}__1 exited -9 (see logs/"),
        ("--game-steps 100000", "a run finished no game: raise --total-timesteps"),
    ],
)
def test_a_trial_whose_run_fails_is_killed_or_ends_no_game_fails_and_three_such_stop_the_tuner(tmp_path, flags, error):
    # A run killed by a signal (the OOM killer's SIGKILL) fails its trial as an exit status 1 does. With
    # --n-trials 1, the tuner gives up after 3 failed trials all the same.
    result = tuner(
        "--command", f"{FAKE} --total-timesteps 2000 --score 1 {flags}", "--env-ids", "CartPole-v1",
        "--param", "learning-rate=float:0:1", "--n-trials", "1", *FAKE_QUICK, cwd=tmp_path, timeout=90,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: 3 trials of study {FAKE_STUDY} failed")
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL] * 3
    assert all(error.format(number=trial.number) in trial.user_attrs["error"] for trial in trials), trials


def test_a_trial_whose_runs_have_ended_is_complete_whatever_the_pruner_says_of_its_reports(tmp_path):
    # --read-interval 1000: the tuner reads trial 1's events once its run has ended, and reports them all; trial 1
    # (score 0) trails trial 0 (score 100) at every step, and the median pruner would stop it from the first.
    result = tuner(
        "--command", f"{FAKE} --total-timesteps 3000", "--env-ids", "CartPole-v1", "--param", "score=float:0:100",
        "--enqueue", "score=100", "--enqueue", "score=0", "--n-trials", "2", "--pruner-startup-trials", "1",
        *FAKE_QUICK, "--read-interval", "1000", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE], result.stdout
    assert trials[1].value == mean_of_last_games(tmp_path, trials[1].user_attrs["run_dirs"][0]) == 10.0
    assert 1000 in trials[1].intermediate_values, "the reports were made"


@pytest.mark.parametrize("pruner", ["median", "halving"])
def test_no_trial_is_pruned_before_the_pruner_warmup_steps(tmp_path, pruner):
    # Trial 1 (score 0) trails trial 0 (score 100) from its first report. Its run takes 0.4 s per 1,000 steps
    # and the tuner reads it as it goes: it is pruned at its report of step 3,000 (median: the first past the
    # warm-up; halving: the first rung), not before, and long before its end (3.6 s later: room for a slow read).
    result = tuner(
        "--command", f"{FAKE} --total-timesteps 12000 --sleep 0.4", "--env-ids", "CartPole-v1",
        "--param", "score=float:0:100", "--enqueue", "score=100", "--enqueue", "score=0", "--n-trials", "2",
        "--pruner", pruner, "--pruner-startup-trials", "1", "--pruner-warmup-steps", "3000", *FAKE_QUICK, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.PRUNED], result.stdout
    assert "trial 1 pruned at step 3,000" in result.stdout
    assert list(trials[1].intermediate_values) == [1000, 2000, 3000]


def test_a_trial_that_trained_its_tuned_total_timesteps_is_not_pruned_while_it_evaluates(tmp_path):
    # As the dqn.py test above, with --total-timesteps a --param: trial 1 trails trial 0 at its last step, 2,000,
    # and its run goes on for 3 s after it (an evaluation); that report is recorded, not put to the pruner.
    result = tuner(
        "--command", f"{FAKE} --eval-sleep 3", "--env-ids", "CartPole-v1",
        "--param", "total-timesteps=choice:2000,3000", "score=float:0:100",
        "--enqueue", "total-timesteps=2000", "score=100", "--enqueue", "total-timesteps=2000", "score=0",
        "--n-trials", "2", "--pruner-startup-trials", "1", *FAKE_QUICK, "--report-every", "2000", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE], result.stdout
    assert trials[1].value < trials[0].value and list(trials[1].intermediate_values) == [2000]


def test_each_sampled_value_reaches_the_scripts_command_line_as_its_flag_takes_it(tmp_path):
    # A boolean, an int choice, log ranges of a float and of an int flag, a float and an int grid: the study
    # samples each from its distribution, and each trial's command has the values in the flags' types (the
    # fake's argparse refuses 3.0 for an int flag). Trial 0 is enqueued, 1 and 2 sampled.
    params = {
        "norm-adv=choice:true,false": optuna.distributions.CategoricalDistribution([True, False]),
        "game-steps=choice:250,500": optuna.distributions.CategoricalDistribution([250, 500]),
        "learning-rate=log:1e-4:1e-1": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "num-minibatches=log:1:64": optuna.distributions.IntDistribution(1, 64, log=True),
        "score=float:0:100:12.5": optuna.distributions.FloatDistribution(0, 100, step=12.5),
        "total-timesteps=int:2000:4000:1000": optuna.distributions.IntDistribution(2000, 4000, step=1000),
    }
    result = tuner(
        "--command", FAKE, "--env-ids", "CartPole-v1", "--param", *params,
        "--enqueue", "norm-adv=false", "game-steps=500", "--n-trials", "3", "--sampler", "random", "--seed", "1",
        "--pruner", "none", "--top", "2", *FAKE_QUICK, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 3, result.stdout
    rows = [line for line in result.stdout.splitlines() if re.match(r"\| \d+ \|", line)]
    best = sorted(trials, key=lambda trial: -trial.value)
    assert [int(row.split("|")[1]) for row in rows] == [trial.number for trial in best[:2]], "--top 2: the best two"
    for trial in trials:
        assert trial.distributions == {param.split("=")[0]: distribution for param, distribution in params.items()}
        values = trial.params
        assert all(isinstance(values[name], int) for name in ("game-steps", "num-minibatches", "total-timesteps"))
        arguments = ["--norm-adv" if values["norm-adv"] else "--no-norm-adv"] + [
            f"--{name} {values[name]}" for name in list(trial.distributions)[1:]
        ]
        assert trial.user_attrs["command"] == " ".join([FAKE, *arguments])
    assert trials[0].user_attrs["command"].startswith(f"{FAKE} --no-norm-adv --game-steps 500 ")


@pytest.mark.parametrize("variable", ["SLURM_ARRAY_TASK_ID", "AWS_BATCH_JOB_ARRAY_INDEX"])
def test_each_array_task_seeds_its_sampler_with_seed_plus_its_index(tmp_path, variable):
    # Task 2 of an array given --seed 3 samples what a lone tuner given --seed 5 samples: tuners of one array
    # must not all sample the same trials.
    result = tuner(
        "--command", f"{FAKE} --total-timesteps 1000", "--env-ids", "CartPole-v1",
        "--param", "score=float:0:100", "learning-rate=float:0:1", "--sampler", "random", "--seed", "3",
        "--n-trials", "1", "--pruner", "none", *FAKE_QUICK, cwd=tmp_path, env={variable: "2"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    reference = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5)).ask()
    expected = {
        "score": reference.suggest_float("score", 0, 100),
        "learning-rate": reference.suggest_float("learning-rate", 0, 1),
    }
    assert load_study(tmp_path, FAKE_STUDY).get_trials()[0].params == expected


def test_the_slurm_array_tuners_get_this_tuners_options_and_the_study_is_made_first(tune, tmp_path):
    # --dry-run prints the sbatch script: each array task's command, parsed by the tuner's own parser, has every
    # option of this one but the fan-out's. The study is made (with the Atari games' random and human scores for
    # the env id without a --score-range) and its --enqueue trial queued before the job is submitted.
    journal = f"journal:{tmp_path / 'tune.journal'}"
    study = [
        "--command", f"{FAKE} --total-timesteps 2000", "--env-ids", "BreakoutNoFrameskip-v4", "PongNoFrameskip-v4",
        "--score-range", "PongNoFrameskip-v4=-21:21", "--study-name", "atari", "--storage", journal,
        "--param", "learning-rate=log:1e-4:1e-2", "score=float:0:1", "--window", "7",
    ]  # fmt: skip
    options = [
        *study, "--seeds", "1", "2", "--n-trials", "12", "--workers", "2", "--report-every", "500",
        "--sampler", "random", "--seed", "4", "--pruner", "halving", "--pruner-startup-trials", "3",
        "--pruner-warmup-steps", "1000",
        "--enqueue", "learning-rate=0.001", "score=0.5", "--log-dir", "out/logs", "--out-dir", "out/tune",
        "--top", "4", "--status-interval", "30", "--stop-timeout", "9", "--heartbeat-interval", "20",
        "--read-interval", "2",
    ]  # fmt: skip
    fan_out = ["--slurm", "--array-tasks", "3", "--cpus-per-task", "4", "--time", "1:00:00", "--mem", "8G"]
    result = tuner(*options, *fan_out, "--dry-run", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "#SBATCH --array=0-2\n" in result.stdout
    lines = result.stdout.split("\ncommands=(\n", 1)[1].split("\n)\n", 1)[0].splitlines()
    assert len(lines) == 3 and len(set(lines)) == 1, lines
    worker = shlex.split(shlex.split(lines[0])[0])
    assert worker[:2] == [sys.executable, os.path.join(REPO_ROOT, "benchmark", "tune.py")]
    parser = tune.make_parser()
    fan_out_options = {action.dest for action in parser._action_groups[-1]._group_actions} | {"dry_run", "report"}
    this, task = vars(parser.parse_args([*options, *fan_out])), vars(parser.parse_args(worker[2:]))
    assert {name: this[name] for name in this if name not in fan_out_options} == {
        name: task[name] for name in task if name not in fan_out_options
    }
    made = optuna.load_study(study_name="atari", storage=tune.open_storage(journal, 60))
    assert made.user_attrs["score_ranges"] == {"BreakoutNoFrameskip-v4": [1.7, 30.5], "PongNoFrameskip-v4": [-21, 21]}
    assert [(trial.state, trial.system_attrs["fixed_params"]) for trial in made.get_trials()] == [
        (TrialState.WAITING, {"learning-rate": 0.001, "score": 0.5})
    ], "the --enqueue trial, queued"
    # the same study with other seeds is another search
    assert_user_error(
        tuner(*study, "--seeds", "1", *fan_out, "--dry-run", cwd=tmp_path), "study atari was made with another seeds"
    )


def fake_tuner_with_a_long_run(cwd, seconds: int = 120) -> tuple[subprocess.Popen, int]:
    """A tuner of one trial of the fake whose run would go on for `seconds`, once the run has started: (the tuner,
    the run's pid)."""
    process = start_tuner(
        "--command", f"{FAKE} --total-timesteps {seconds * 5000} --sleep 0.2 --score 1", "--env-ids", "CartPole-v1",
        "--param", "learning-rate=float:0:1", "--n-trials", "1", *FAKE_QUICK, cwd=cwd,
    )  # fmt: skip
    _, run_pid, _ = first_run_started(process, FAKE_STUDY)
    return process, run_pid


def test_sighup_of_a_closed_terminal_stops_the_runs_cleanly_and_queues_the_trial_again(tmp_path):
    process, run_pid = fake_tuner_with_a_long_run(tmp_path)
    time.sleep(1)
    process.send_signal(signal.SIGHUP)
    try:
        output = process.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired as e:  # what it had said, and who still runs: the tuner, the run
        process.kill()
        raise AssertionError(f"{e.output}\ntuner alive: {process.poll() is None}, run alive: {is_alive(run_pid)}")
    assert process.returncode == 130, output
    assert output.strip().splitlines()[-1] == "error: interrupted: stopped trial(s) 0 (failed, and queued to run again)"
    assert not is_alive(run_pid)
    assert "KeyboardInterrupt" in (tmp_path / "logs" / f"CartPole-v1__{FAKE_STUDY}-trial0__1.log").read_text()
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.WAITING]


def test_the_runs_of_a_tuner_killed_outright_die_with_it(tmp_path):
    # (SIGKILL, the OOM killer) A run whose tuner is gone could not report anything.
    process, run_pid = fake_tuner_with_a_long_run(tmp_path)
    process.kill()
    process.communicate(timeout=60)
    deadline = time.time() + 5
    while is_alive(run_pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not is_alive(run_pid), "the run got SIGKILL with its tuner"


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_no_tuner_takes_the_place_of_a_retry_that_another_one_is_queueing(tune, postgresql, tmp_path):
    # Trial 0 is a dead tuner's: running, its last heartbeat older than the grace period (2 s). The tuner that
    # fails it then queues its retry, two writes; in between, the other tuner saw neither trial 0 running nor a
    # retry, started a trial of its own in the retry's place, and the study reached --n-trials with the retry
    # left waiting. Here a lock on the trials' system attributes holds the retry's write back for 3 s; the tuners
    # write both under their lock on the study, and the other tuner waits on it. (With only a count of such trials
    # as running, this failed 3 times in 4 here: once the retry was in, both tuners counted at once, one ran it and
    # the other a new trial, as in the next test.)
    storage = tune.open_storage(postgresql, 1)
    study = optuna.create_study(study_name="queueing", storage=storage, direction="maximize")
    dead = study.ask({"score": optuna.distributions.FloatDistribution(0, 100)})
    storage.record_heartbeat(dead._trial_id)
    arguments = one_trial_of(postgresql, "queueing")
    engine = sqlalchemy.create_engine(postgresql)
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sqlalchemy.text("LOCK TABLE trial_system_attributes IN EXCLUSIVE MODE"))
        time.sleep(2)  # trial 0 is stale
        tuners = [start_tuner(*arguments, cwd=tmp_path) for _ in range(2)]
        wait_for_lock_waiters(watcher, 1, tuners, "no tuner failed trial 0")
        time.sleep(3)  # the other tuner looks at the trials every second
        holder.rollback()  # the lock goes
        outputs = [process.communicate(timeout=120)[0] for process in tuners]
    engine.dispose()
    assert_trial_0_failed_and_its_retry_completed("queueing", postgresql, tuners, outputs)


def assert_trial_0_failed_and_its_retry_completed(study_name: str, storage: str, tuners, outputs: list[str]):
    """Both tuners exited 0, and the study holds trial 0, failed, and its retry, complete: no other trial."""
    assert [process.returncode for process in tuners] == [0, 0], outputs
    trials = optuna.load_study(study_name=study_name, storage=storage).get_trials()
    assert [(trial.state, RetryHeartbeatStaleTrialCallback.retried_trial_number(trial)) for trial in trials] == [
        (TrialState.FAIL, None),
        (TrialState.COMPLETE, 0),
    ], outputs


def one_trial_of(storage: str, study_name: str) -> list[str]:
    """A tuner's arguments for a study of one trial of the stand-in script, with a heartbeat every second."""
    return [
        "--command", f"{FAKE} --total-timesteps 1000", "--env-ids", "CartPole-v1", "--param", "score=float:0:100",
        "--storage", storage, "--study-name", study_name, "--n-trials", "1", "--heartbeat-interval", "1",
        *FAKE_QUICK,
    ]  # fmt: skip


def wait_for_lock_waiters(watcher, count: int, tuners: list[subprocess.Popen], what: str):
    """Until `count` connections of the PostgreSQL server wait on a lock (a table's, or the tuners' own)."""
    waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
    deadline = time.time() + 60
    while watcher.execute(sqlalchemy.text(waiting)).scalar() < count:
        assert time.time() < deadline and all(process.poll() is None for process in tuners), what
        watcher.rollback()  # a transaction sees one snapshot of pg_stat_activity
        time.sleep(0.1)


def read_to_study_line(process: subprocess.Popen) -> str:
    """Reads a tuner's output up to the line that it prints as it starts to work on the study."""
    lines = []
    for line in process.stdout:
        lines.append(line)
        if line.startswith("study "):
            return "".join(lines)
    raise AssertionError("".join(lines))


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_two_tuners_that_count_at_once_run_the_waiting_retry_and_no_new_trial(tune, postgresql, tmp_path):
    # Trial 0 was interrupted, its retry waits, one trial to go. Both tuners count while a lock on the trials table
    # holds back the ask() that takes the retry: each saw one place free, the first took the retry, and Optuna's
    # ask(), finding it taken, gave the other a new trial, one more than --n-trials. A tuner counts and asks under
    # the tuners' lock on the study: the other waits there, then counts the retry as running.
    storage = tune.open_storage(postgresql, 1)
    study = optuna.create_study(study_name="retry-at-once", storage=storage, direction="maximize")
    interrupted = study.ask({"score": optuna.distributions.FloatDistribution(0, 100)})
    RetryHeartbeatStaleTrialCallback(max_retry=1)(study, study.tell(interrupted, state=TrialState.FAIL))
    arguments = one_trial_of(postgresql, "retry-at-once")
    engine = sqlalchemy.create_engine(postgresql)
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sqlalchemy.text("LOCK TABLE trials IN EXCLUSIVE MODE"))
        tuners = [start_tuner(*arguments, cwd=tmp_path) for _ in range(2)]
        wait_for_lock_waiters(watcher, 2, tuners, "the tuners never both waited to start a trial")
        holder.rollback()  # the lock goes
        outputs = [process.communicate(timeout=120)[0] for process in tuners]
    engine.dispose()
    assert_trial_0_failed_and_its_retry_completed("retry-at-once", postgresql, tuners, outputs)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_two_tuners_that_count_at_once_start_one_trial_in_the_last_place(tune, postgresql, tmp_path):
    # Trial 0, another process's, runs (no heartbeat: never stale) and --n-trials is 1: the tuners wait. Then it
    # fails of itself, one place is free, and both tuners count while a lock on the studies table holds back the
    # creation of the trial that each asks for: each started one, two trials in one place (the killed-tuner test
    # above failed so, 2 times in 3 on a 2-core machine: with a dead tuner's trial counted as running, its retry was
    # left waiting). Under the tuners' lock the second counts the first one's trial as running.
    storage = tune.open_storage(postgresql, 1)
    study = optuna.create_study(study_name="place-at-once", storage=storage, direction="maximize")
    other = study.ask({"score": optuna.distributions.FloatDistribution(0, 100)})
    arguments = one_trial_of(postgresql, "place-at-once")
    tuners = [start_tuner(*arguments, cwd=tmp_path) for _ in range(2)]
    lines = [read_to_study_line(process) for process in tuners]  # both at work: no more writes to the studies table
    engine = sqlalchemy.create_engine(postgresql)
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sqlalchemy.text("LOCK TABLE studies IN EXCLUSIVE MODE"))
        other.set_user_attr("error", "a run exited 1")  # failed of itself: its place is free, no retry
        study.tell(other, state=TrialState.FAIL)
        wait_for_lock_waiters(watcher, 2, tuners, "the tuners never both waited to start a trial")
        holder.rollback()  # the lock goes
        outputs = [line + process.communicate(timeout=120)[0] for line, process in zip(lines, tuners)]
    engine.dispose()
    assert [process.returncode for process in tuners] == [0, 0], outputs
    trials = optuna.load_study(study_name="place-at-once", storage=postgresql).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE], outputs


def test_a_tuner_that_starts_while_another_writes_the_studys_definition_waits_for_all_of_it(postgresql, tmp_path):
    # The first tuner of a study writes its definition (command, env ids, seeds...) one attribute at a time; a tuner
    # that read it in between found the env ids missing and stopped ("made with another env ids (None, ...)"). A
    # trigger holds the first tuner's write of the env ids until the second has looked; under the tuners' lock on
    # the study, the second waits for the whole definition.
    optuna.create_study(storage=postgresql, study_name="defined-at-once", direction="maximize")  # the tables
    arguments = [
        "--command", f"{FAKE} --total-timesteps 1000", "--env-ids", "CartPole-v1", "--param", "score=float:0:100",
        "--storage", postgresql, "--study-name", "defined-at-once", "--n-trials", "1", *FAKE_QUICK,
    ]  # fmt: skip
    engine = sqlalchemy.create_engine(postgresql)
    with engine.connect() as holder, engine.connect() as watcher:
        holder.execute(sqlalchemy.text("SELECT pg_advisory_lock(4242)"))
        holder.execute(
            sqlalchemy.text(
                "CREATE FUNCTION hold_env_ids() RETURNS trigger AS $$ BEGIN PERFORM pg_advisory_lock_shared(4242); "
                "PERFORM pg_advisory_unlock_shared(4242); RETURN NEW; END $$ LANGUAGE plpgsql; "
                "CREATE TRIGGER hold_env_ids BEFORE INSERT ON study_user_attributes FOR EACH ROW "
                "WHEN (NEW.key = 'env_ids') EXECUTE FUNCTION hold_env_ids()"
            )
        )
        holder.commit()  # the trigger, seen by all; the advisory lock is the session's and stays
        try:
            first = start_tuner(*arguments, cwd=tmp_path)
            wait_for_lock_waiters(watcher, 1, [first], "the first tuner never wrote the env ids")
            second = start_tuner(*arguments, cwd=tmp_path)
            deadline = time.time() + 60
            waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            while second.poll() is None and watcher.execute(sqlalchemy.text(waiting)).scalar() < 2:
                assert time.time() < deadline, "the second tuner neither waited nor stopped"
                watcher.rollback()  # a transaction sees one snapshot of pg_stat_activity
                time.sleep(0.1)
            holder.execute(sqlalchemy.text("SELECT pg_advisory_unlock(4242)"))
            outputs = [process.communicate(timeout=120)[0] for process in (first, second)]
        finally:
            holder.execute(sqlalchemy.text("DROP TRIGGER IF EXISTS hold_env_ids ON study_user_attributes"))
            holder.execute(sqlalchemy.text("DROP FUNCTION IF EXISTS hold_env_ids()"))
            holder.commit()
    engine.dispose()
    assert [first.returncode, second.returncode] == [0, 0], outputs
    trials = optuna.load_study(study_name="defined-at-once", storage=postgresql).get_trials()
    assert [trial.state for trial in trials] == [TrialState.COMPLETE], outputs


@pytest.mark.filterwarnings("ignore:Heartbeat of storage is supposed to be used with Study.optimize")
def test_a_trial_failed_by_another_tuner_is_dropped_at_its_next_report_in_a_database(tmp_path):
    # As the journal test above, on an RDB storage (SQLite here), which takes a finished trial's heartbeat: the
    # tuner finds its trial failed when it next reports (every 1,000 steps: 0.2 s), and lets it go.
    process, run_pid = fake_tuner_with_a_long_run(tmp_path, seconds=5)
    time.sleep(2.5)  # its heartbeat, recorded when the trial started, is older than the other tuner's grace period
    storage = optuna.storages.RDBStorage(
        f"sqlite:///{tmp_path}/tune/optuna.db",
        heartbeat_interval=1,
        grace_period=1,
        heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1),
    )
    optuna.storages.fail_stale_trials(optuna.load_study(study_name=FAKE_STUDY, storage=storage))
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 0 and "Traceback" not in output, output
    assert "trial 0 was failed by another tuner" in output and "trial 1 started (a retry of trial 0)" in output
    assert not is_alive(run_pid)
    trials = load_study(tmp_path, FAKE_STUDY).get_trials()
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert "KeyboardInterrupt" in (tmp_path / "logs" / f"CartPole-v1__{FAKE_STUDY}-trial0__1.log").read_text()
