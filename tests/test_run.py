"""benchmark/run.py, the experiment runner, on a fake training script (tests/fake_train.py) that
prints the scripts' progress lines in a fraction of a second: local workers, logs, status output,
failures, threads, Ctrl-C, and the Slurm array script."""

import os
import platform
import pty
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest
from running import FAKE_TRAIN, REPO_ROOT, assert_user_error, is_alive, run_tool, subprocess_environment

FAKE = f"{sys.executable} {FAKE_TRAIN}"
CORES = len(os.sched_getaffinity(0))
# /proc/cpuinfo flags, widest first, and the names the runner gives them in a log's header
WIDEST_FIRST = [("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")]


def runner(*args: str, cwd, env: dict | None = None):
    if "--slurm" in args and env is None:
        # The rendering checks: a fake sbatch that submits nothing, whether or not this machine has Slurm
        # (tests/test_slurm.py submits to a real cluster).
        bin_dir = fake_sbatch(cwd / "fake-bin", 'echo "Submitted batch job 0"')
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    return run_tool("run.py", *args, cwd=cwd, env=env)


def fake_sbatch(folder, body: str) -> str:
    """A folder holding an executable `sbatch` that runs the shell line `body`."""
    folder.mkdir(exist_ok=True)
    (folder / "sbatch").write_text(f"#!/bin/sh\n{body}\n")
    (folder / "sbatch").chmod(0o755)
    return str(folder)


def start_runner(*args: str, cwd, stdout=subprocess.PIPE, ignored_signals=(), terminal=None):
    # The runner gets a terminal's SIGINT and SIGHUP whatever this process inherited (pytest started
    # in the background by a script ignores SIGINT): set in a small launcher that then execs the
    # runner, which keeps them (a preexec_fn would fork this multithreaded process). With `terminal`
    # (a pty's end), the runner leads a session of its own with that terminal as its controlling
    # terminal, as in a terminal window: closing the other end sends it the kernel's SIGHUP.
    dispositions = {
        int(number): "SIG_IGN" if number in ignored_signals else "SIG_DFL" for number in (signal.SIGINT, signal.SIGHUP)
    }
    launcher = (
        "import fcntl, os, signal, sys, termios\n"
        f"for number, disposition in {dispositions!r}.items():\n"
        "    signal.signal(number, getattr(signal, disposition))\n"
        f"if {terminal is not None}:\n"
        "    fcntl.ioctl(1, termios.TIOCSCTTY, 0)\n"
        "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
    )
    return subprocess.Popen(
        [sys.executable, "-c", launcher, os.path.join(REPO_ROOT, "benchmark", "run.py"), *args],
        cwd=cwd,
        env=subprocess_environment(),
        stdout=stdout if terminal is None else terminal,
        stderr=subprocess.PIPE if terminal is None else terminal,
        text=True,
        start_new_session=terminal is not None,
    )


def wait_for_files(folder, count: int, timeout: float = 60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(os.listdir(folder)) >= count:
            return
        time.sleep(0.1)
    raise AssertionError(f"{folder} holds {os.listdir(folder)} after {timeout} s, expected {count} files")


def pids_in(folder) -> list[int]:
    return [int(name[: -len(".pid")]) for name in os.listdir(folder)]


# ---------------------------------------------------------------------------------------------
# Local runs
# ---------------------------------------------------------------------------------------------
def test_every_env_id_and_seed_runs_once_with_its_flags_appended(tmp_path):
    result = runner(
        "--env-ids", "Pong", "ALE/Breakout-v5", "--seeds", "1", "2", "--workers", "2", "--command", FAKE, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    logs = sorted(os.listdir(tmp_path / "logs"))
    assert logs == [f"{env}__fake_train__{seed}.log" for env in ("ALE_Breakout-v5", "Pong") for seed in (1, 2)] + [
        "locks"
    ]
    for env_id, seed in [("Pong", 1), ("Pong", 2), ("ALE/Breakout-v5", 1), ("ALE/Breakout-v5", 2)]:
        log = (tmp_path / "logs" / f"{env_id.replace('/', '_')}__fake_train__{seed}.log").read_text()
        assert f"--env-id {env_id} --seed {seed}" in log.splitlines()[0], "the log starts with the command"
        assert f"env {env_id} seed {seed} " in log, "the run got its env id and seed"
        assert f"mean return of the last 3 games {seed + 0.3:.2f}" in log, "stdout and stderr are in the log"


def test_failed_runs_are_all_named_in_one_error_line_and_the_exit_is_non_zero(tmp_path):
    result = runner(
        "--env-ids",
        "Pong",
        "Qbert",
        "--seeds",
        "1",
        "2",
        "3",
        "--workers",
        "2",
        "--command",
        f"{FAKE} --fail-seeds 2 3",
        cwd=tmp_path,
    )
    assert_user_error(result, "4 of 6 runs failed")
    error_line = result.stderr.strip().splitlines()[-1]
    failed = [f"{env}__fake_train__{seed}" for env in ("Pong", "Qbert") for seed in (2, 3)]
    assert all(f"{name} (exit 1, logs/{name}.log)" in error_line for name in failed), error_line
    assert "__1 " not in error_line and "__1(" not in error_line, "the runs that succeeded are not named"


def test_a_run_killed_by_a_signal_fails(tmp_path):
    # an out-of-memory kill or a segfault ends the script without an exit status of its own
    (tmp_path / "killed.py").write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    result = runner("--env-ids", "Pong", "--command", f"{sys.executable} killed.py", cwd=tmp_path)
    assert_user_error(result, "1 of 1 runs failed: Pong__killed__1 (exit -9, logs/Pong__killed__1.log)")
    assert (tmp_path / "logs" / "Pong__killed__1.log").read_text().splitlines()[-1].startswith("# exit -9 after ")


def test_a_run_started_again_replaces_its_earlier_log(tmp_path):
    for _ in range(2):
        assert runner("--env-ids", "Pong", "--command", FAKE, cwd=tmp_path).returncode == 0
    log = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()
    assert log.startswith(f"# {FAKE} --env-id Pong --seed 1\n") and log.count("# exit 0 after ") == 1


def test_one_worker_runs_one_run_at_a_time(tmp_path):
    result = runner("--env-ids", "Pong", "--seeds", "1", "2", "--workers", "1", "--command", FAKE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    events = re.findall(r"^\[[\d:]+\] (started|done) (\S+)", result.stdout, re.MULTILINE)
    assert events == [
        ("started", "Pong__fake_train__1"),
        ("done", "Pong__fake_train__1"),
        ("started", "Pong__fake_train__2"),
        ("done", "Pong__fake_train__2"),
    ]


def test_off_a_terminal_progress_comes_as_plain_lines_with_the_latest_sps_and_return(tmp_path):
    result = runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "2",
        "--workers",
        "2",
        "--status-interval",
        "0.3",
        "--command",
        f"{FAKE} --iterations 4 --sleep 0.4",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout, "no terminal control codes in a log file"
    assert re.search(r"^\[\d\d:\d\d:\d\d\] started Pong__fake_train__1 \(pid \d+", result.stdout, re.M)
    # A progress line while the runs were going, and the last one each run printed at the end.
    assert re.search(r"running Pong__fake_train__2 \S+: steps [\d,]+/4,000, 20\d SPS, return 2\.\d0", result.stdout)
    assert "done Pong__fake_train__1 after" in result.stdout
    final_table = result.stdout.strip().splitlines()[-3:]
    assert final_table[0].split() == ["run", "state", "elapsed", "steps", "SPS", "return"]
    assert final_table[1].split()[:2] == ["Pong__fake_train__1", "done"]
    assert final_table[1].split()[3:] == ["4,000/4,000", "104", "1.40"]
    assert final_table[2].split()[3:] == ["4,000/4,000", "204", "2.40"]


def test_on_a_terminal_a_status_table_is_redrawn_in_place(tmp_path):
    controller, terminal = pty.openpty()
    process = start_runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "2",
        "3",
        "--workers",
        "2",
        "--command",
        f"{FAKE} --sleep 0.6",
        cwd=tmp_path,
        stdout=terminal,
    )
    os.close(terminal)
    output = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # the runner closed the terminal
            break
        if not chunk:
            break
        output += chunk
    assert process.wait(timeout=60) == 0, process.stderr.read()
    text = output.decode()
    assert "\x1b[5F\x1b[J" in text, "the table of 3 runs, a header and a count line is redrawn in place"
    tables = text.split("\x1b[5F\x1b[J")
    assert any(re.search(r"Pong__fake_train__3\s+queued", t) and re.search(r"__1\s+running", t) for t in tables)
    assert re.search(r"Pong__fake_train__3\s+done\s+\S+\s+3,000/3,000\s+303\s+3\.30", tables[-1])
    assert "3 done" in tables[-1]


@pytest.mark.skipif(not os.path.exists("/proc/self/autogroup"), reason="no sched_autogroup: nice alone ranks a run")
def test_a_niced_runner_gives_its_runs_session_the_same_niceness(tmp_path):
    # Each run has a session of its own, and with sched_autogroup the kernel shares the cores between
    # sessions first: a run niced only as a process would take a full share from everything else.
    script = tmp_path / "autogroup.py"
    script.write_text("import os\nprint(open('/proc/self/autogroup').read().strip(), 'process nice', os.nice(0))\n")
    command = ["nice", "-n", "7", sys.executable, os.path.join(REPO_ROOT, "benchmark", "run.py")]
    command += ["--env-ids", "Pong", "--seeds", "1", "--command", f"{sys.executable} {script}"]
    result = subprocess.run(command, cwd=tmp_path, env=subprocess_environment(None), capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    log = (tmp_path / "logs" / "Pong__autogroup__1.log").read_text()
    assert re.search(r"^/autogroup-\d+ nice 7 process nice 7$", log, re.M), log


def test_each_run_gets_cores_divided_by_workers_threads(tmp_path):
    for workers in (1, 2):
        result = runner(
            "--env-ids",
            "Pong",
            "--seeds",
            "1",
            "--workers",
            str(workers),
            "--log-dir",
            f"w{workers}",
            "--command",
            FAKE,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
        log = (tmp_path / f"w{workers}" / "Pong__fake_train__1.log").read_text()
        assert f"OMP_NUM_THREADS={max(1, CORES // workers)}\n" in log
        # the header names the machine: a study's runs can span machines, and their SPS compare within one
        assert re.search(
            rf"^# OMP_NUM_THREADS={max(1, CORES // workers)}, started .* on {re.escape(platform.node())}, ", log, re.M
        )


def test_the_log_header_names_the_cpu_with_its_widest_vector_instructions(tmp_path):
    # "AMD EPYC" alone names machines with AVX2 only and with AVX-512 BF16, whose speeds differ several-fold
    result = runner("--env-ids", "Pong", "--seeds", "1", "--command", FAKE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    header = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text().splitlines()[1]
    with open("/proc/cpuinfo") as f:
        flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    widest = next((name for flag, name in WIDEST_FIRST if flag in flags), None)
    assert header.endswith(f" ({widest}), {os.cpu_count()} cpus" if widest else f"{os.cpu_count()} cpus"), header


def test_a_torchrun_command_divides_the_threads_by_its_processes_per_node(tmp_path):
    result = runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--dry-run",
        "--command",
        "torchrun --standalone --nproc-per-node=2 cleanrl/ppo_atari_multigpu.py",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"OMP_NUM_THREADS={max(1, CORES // 2)} torchrun")


def test_more_workers_than_cores_still_give_each_run_one_thread(tmp_path):
    args = ("--env-ids", "Pong", "--workers", str(CORES + 1), "--dry-run", "--command", FAKE)
    result = runner(*args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"OMP_NUM_THREADS=1 {FAKE}")


def test_a_thread_count_in_the_command_overrides_the_runners(tmp_path):
    result = runner("--env-ids", "Pong", "--seeds", "1", "--command", f"OMP_NUM_THREADS=7 {FAKE}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "OMP_NUM_THREADS=7\n" in (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()


def test_dry_run_prints_every_command_and_runs_nothing(tmp_path):
    result = runner(
        "--env-ids",
        "Pong",
        "Qbert",
        "--seeds",
        "1",
        "2",
        "--dry-run",
        "--command",
        f"{FAKE} --sleep 100",
        "python cleanrl/ppo_atari.py --total-timesteps 1000",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 8
    assert lines[0].endswith(f"{FAKE} --sleep 100 --env-id Pong --seed 1  > logs/Pong__fake_train__1.log")
    assert lines[7].endswith(
        "cleanrl/ppo_atari.py --total-timesteps 1000 --env-id Qbert --seed 2  > logs/Qbert__ppo_atari__2.log"
    )
    assert not (tmp_path / "logs").exists()


def test_skip_done_runs_only_what_did_not_finish_and_sets_cut_off_attempts_aside(tmp_path):
    command = f"{FAKE} --tensorboard"
    assert runner("--env-ids", "Pong", "--seeds", "1", "--command", command, cwd=tmp_path).returncode == 0
    assert runner(
        "--env-ids", "Pong", "--seeds", "2", "--command", f"{command} --fail-seeds 2", cwd=tmp_path
    ).returncode
    # an attempt of seed 3 that was cut off (a killed session): a run directory and a log without an exit line
    (tmp_path / "runs" / "Pong__fake_train__3__1700000000").mkdir()
    (tmp_path / "logs" / "Pong__fake_train__3.log").write_text(f"# {command} --env-id Pong --seed 3\n10 steps\n")
    seed_1_log = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()
    assert seed_1_log.splitlines()[-1].startswith("# exit 0 after ")

    again = runner("--env-ids", "Pong", "--seeds", "1", "2", "3", "--skip-done", "--command", command, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert "skipping 1 run(s) done earlier: Pong__fake_train__1" in again.stdout
    assert (tmp_path / "logs" / "Pong__fake_train__1.log").read_text() == seed_1_log, "a done run is not run again"
    # seed 2 failed (and with another command), seed 3 was cut off: both run again, their earlier
    # attempts kept aside, so that runs/ holds one directory per seed
    runs = sorted(os.listdir(tmp_path / "runs"))
    assert [name.rsplit("__", 1)[0] for name in runs] == [f"Pong__fake_train__{seed}" for seed in (1, 2, 3)]
    aside = sorted(os.listdir(tmp_path / "logs" / "incomplete_runs"))
    assert [name.rsplit("__", 1)[0] for name in aside] == ["Pong__fake_train__2", "Pong__fake_train__3"]
    assert aside[1] == "Pong__fake_train__3__1700000000"
    assert "set aside the unfinished attempt logs/incomplete_runs/Pong__fake_train__3__1700000000" in again.stdout
    for seed in (2, 3):
        assert (tmp_path / "logs" / f"Pong__fake_train__{seed}.log").read_text().splitlines()[-1].startswith("# exit 0")

    # a different command is another run, even where the names agree
    dry = runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "--skip-done",
        "--dry-run",
        "--command",
        f"{command} --iterations 5",
        cwd=tmp_path,
    )
    assert "# done earlier" not in dry.stdout and "--iterations 5 --env-id Pong --seed 1" in dry.stdout
    dry = runner("--env-ids", "Pong", "--seeds", "1", "--skip-done", "--dry-run", "--command", command, cwd=tmp_path)
    assert dry.stdout.startswith("# done earlier, skipped:")


def test_skip_done_runs_again_a_run_that_failed_with_the_same_command(tmp_path):
    command = f"{FAKE} --fail-seeds 1"
    assert runner("--env-ids", "Pong", "--command", command, cwd=tmp_path).returncode == 1
    dry = runner("--env-ids", "Pong", "--skip-done", "--dry-run", "--command", command, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "# done earlier" not in dry.stdout and f"{command} --env-id Pong --seed 1  > " in dry.stdout


def test_skip_done_dry_run_prints_a_done_run_as_skipped_only(tmp_path):
    assert runner("--env-ids", "Pong", "--command", FAKE, cwd=tmp_path).returncode == 0
    dry = runner("--env-ids", "Pong", "--skip-done", "--dry-run", "--command", FAKE, cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == [f"# done earlier, skipped: {FAKE} --env-id Pong --seed 1"]


def test_skip_done_leaves_the_directory_of_a_run_that_resumes_itself(tmp_path):
    # a script with --resume auto goes on from the checkpoint in its run directory: moving it would restart the run
    (tmp_path / "runs" / "Pong__fake_train__1__1700000000").mkdir(parents=True)
    command = f"{FAKE} --resume auto"
    cut_off = (
        f"# {command} --env-id Pong --seed 1\n# OMP_NUM_THREADS=2, started 2026-12-01 10:00:00\ncheckpoint at 400\n"
    )
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "Pong__fake_train__1.log").write_text(cut_off)
    result = runner("--env-ids", "Pong", "--skip-done", "--command", command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "runs" / "Pong__fake_train__1__1700000000").is_dir()
    assert not (tmp_path / "logs" / "incomplete_runs").exists()
    # its log holds both attempts, and counts as done
    log = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()
    assert log.startswith(cut_off) and log.count(f"# {command} --env-id Pong --seed 1\n") == 2
    assert log.splitlines()[-1].startswith("# exit 0 after ")
    again = runner("--env-ids", "Pong", "--skip-done", "--command", command, cwd=tmp_path)
    assert "skipping 1 run(s) done earlier" in again.stdout


def test_skip_done_compares_a_resumed_runs_last_command(tmp_path):
    # Each attempt of a run with --resume adds its header to the log; a flag that resuming allows (here
    # --iterations, for --checkpoint-every) was changed once, and the changed command finished.
    command = f"{FAKE} --resume auto"
    assert runner("--env-ids", "Pong", "--command", f"{command} --iterations 2", cwd=tmp_path).returncode == 0
    changed = runner("--env-ids", "Pong", "--skip-done", "--command", f"{command} --iterations 3", cwd=tmp_path)
    assert changed.returncode == 0 and "skipping" not in changed.stdout, "another command: run again"
    log = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()
    again = runner("--env-ids", "Pong", "--skip-done", "--command", f"{command} --iterations 3", cwd=tmp_path)
    assert "skipping 1 run(s) done earlier: Pong__fake_train__1" in again.stdout
    assert (tmp_path / "logs" / "Pong__fake_train__1.log").read_text() == log
    dry = runner(
        "--env-ids", "Pong", "--skip-done", "--dry-run", "--command", f"{command} --iterations 2", cwd=tmp_path
    )
    assert "# done earlier" not in dry.stdout, "the command of before is not the one that finished last"


@pytest.mark.parametrize(
    "arguments, fragment",
    [
        (["--workers", "0", "--command", FAKE], "--workers must be at least 1"),
        (["--command", f"{FAKE} --seed 3"], "--command already has --seed"),
        (["--command", f"{FAKE} --env-id=Qbert"], "--command already has --env-id"),
        (["--command", FAKE, FAKE], "give each --command its own --exp-name"),
        (["--seeds", "1", "2", "1", "--command", FAKE], "--seeds gives seed 1 twice"),
        (["--env-ids", "Pong", "Qbert", "Pong", "--command", FAKE], "--env-ids gives Pong twice"),
        (["--env-ids", "ALE/Pong-v5", "ALE_Pong-v5", "--command", FAKE], "ALE/Pong-v5 and ALE_Pong-v5 would name"),
        (["--command", "python 'unbalanced"], "cannot parse --command"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, arguments, fragment):
    assert_user_error(runner("--env-ids", "Pong", *arguments, cwd=tmp_path), fragment)


def test_two_commands_with_their_own_exp_names_both_run(tmp_path):
    result = runner(
        "--env-ids", "Pong", "--command", f"{FAKE} --exp-name a", f"{FAKE} --exp-name b", "--dry-run", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "logs/Pong__a__1.log" in result.stdout and "logs/Pong__b__1.log" in result.stdout


# ---------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------
def interrupt_and_check_nothing_is_left(process, pid_dir, expected_processes: int, signal_number=signal.SIGINT):
    wait_for_files(pid_dir, expected_processes)
    pids = pids_in(pid_dir)
    assert all(is_alive(pid) for pid in pids)
    started = time.time()
    process.send_signal(signal_number)
    try:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 130, stderr
        assert [pid for pid in pids if is_alive(pid)] == [], "every process the runs started is gone"
    finally:  # a failing test leaves nothing behind either
        for pid in filter(is_alive, pids):
            os.kill(pid, signal.SIGKILL)
    return stderr, time.time() - started


def test_ctrl_c_stops_every_run_and_every_process_they_started(tmp_path):
    # Each fake run starts a helper in a session of its own, as torchrun does with its workers:
    # stopping the run's process group alone would leave the helpers behind.
    (tmp_path / "pids").mkdir()
    process = start_runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "2",
        "3",
        "--workers",
        "2",
        "--command",
        f"{FAKE} --sleep 100 --pid-dir pids --spawn-helper",
        cwd=tmp_path,
    )
    stderr, _ = interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 4)
    assert stderr.strip().splitlines()[-1] == (
        "error: interrupted: stopped Pong__fake_train__1, Pong__fake_train__2, 1 not started"
    )
    assert not (tmp_path / "logs" / "Pong__fake_train__3.log").exists()


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_scheduler_or_a_closed_terminal_stops_the_runs_as_ctrl_c_does(tmp_path, signal_number):
    (tmp_path / "pids").mkdir()
    process = start_runner(
        "--env-ids", "Pong", "--command", f"{FAKE} --sleep 100 --pid-dir pids --spawn-helper", cwd=tmp_path
    )
    stderr, _ = interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 2, signal_number)
    assert stderr.strip().splitlines()[-1] == "error: interrupted: stopped Pong__fake_train__1"


def test_under_nohup_a_closed_terminal_leaves_the_runs_running(tmp_path):
    (tmp_path / "pids").mkdir()
    process = start_runner(
        "--env-ids",
        "Pong",
        "--command",
        f"{FAKE} --sleep 100 --pid-dir pids",
        cwd=tmp_path,
        ignored_signals=(signal.SIGHUP,),
    )
    wait_for_files(tmp_path / "pids", 1)
    process.send_signal(signal.SIGHUP)
    time.sleep(1)
    assert process.poll() is None and all(is_alive(pid) for pid in pids_in(tmp_path / "pids"))
    interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 1)


def test_a_runner_started_in_the_background_still_stops_its_runs_with_ctrl_c(tmp_path):
    # `nohup bash study.sh &` starts the runner with SIGINT ignored; its runs must not inherit that,
    # or they only die by SIGKILL at the stop timeout (30 s here), their last lines unwritten.
    (tmp_path / "pids").mkdir()
    process = start_runner(
        "--env-ids",
        "Pong",
        "--command",
        f"{FAKE} --sleep 100 --pid-dir pids",
        cwd=tmp_path,
        ignored_signals=(signal.SIGINT, signal.SIGHUP),
    )
    _, seconds = interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 1, signal.SIGTERM)
    assert seconds < 10, "the run was killed at the stop timeout instead of stopping on SIGINT"
    assert "KeyboardInterrupt" in (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()


def test_a_run_that_ignores_ctrl_c_is_killed_after_the_stop_timeout(tmp_path):
    (tmp_path / "pids").mkdir()
    process = start_runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "--stop-timeout",
        "1",
        "--command",
        f"{FAKE} --sleep 100 --pid-dir pids --spawn-helper --ignore-sigint",
        cwd=tmp_path,
    )
    _, seconds = interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 2)
    assert seconds < 10


def test_a_run_that_outlived_its_runner_is_not_started_twice(tmp_path):
    (tmp_path / "pids").mkdir()
    arguments = ("--env-ids", "Pong", "--skip-done", "--command", f"{FAKE} --sleep 100 --pid-dir pids --tensorboard")
    killed = start_runner(*arguments, cwd=tmp_path)
    wait_for_files(tmp_path / "pids", 1)
    (orphan,) = pids_in(tmp_path / "pids")
    try:
        killed.kill()  # SIGKILL: no chance to stop its run, which goes on in its own session
        killed.communicate(timeout=60)
        assert is_alive(orphan)
        (attempt,) = os.listdir(tmp_path / "runs")
        again = runner(*arguments, cwd=tmp_path)
        assert_user_error(again, "still running from an earlier runner: Pong__fake_train__1")
        assert os.listdir(tmp_path / "runs") == [attempt], "the live run's directory stays where it is"
    finally:
        os.kill(orphan, signal.SIGKILL)
    deadline = time.time() + 30
    while is_alive(orphan) and time.time() < deadline:
        time.sleep(0.1)
    # once it is gone, the run is started again
    again = runner("--env-ids", "Pong", "--skip-done", "--command", f"{FAKE} --tensorboard", cwd=tmp_path)
    assert again.returncode == 0, again.stderr


def test_a_closed_terminal_stops_the_runs_though_the_runner_can_write_to_it_no_more(tmp_path):
    # A terminal window closed: the kernel sends SIGHUP, and every write to the terminal fails (EIO) from
    # then on, the runner's "stopping ..." line among them; a run slow to stop must still get its SIGKILL.
    (tmp_path / "pids").mkdir()
    controller, terminal = pty.openpty()
    command = f"{FAKE} --sleep 100 --pid-dir pids --spawn-helper --ignore-sigint"
    process = start_runner(
        "--env-ids", "Pong", "--stop-timeout", "1", "--command", command, cwd=tmp_path, terminal=terminal
    )
    os.close(terminal)
    try:
        deadline = time.time() + 60
        while len(os.listdir(tmp_path / "pids")) < 2 and time.time() < deadline:
            os.read(controller, 65536)  # the status table, as a terminal shows it
        pids = pids_in(tmp_path / "pids")
        assert len(pids) == 2 and all(is_alive(pid) for pid in pids)
        time.sleep(1.5)  # a table drawn: the next message erases it first
    finally:
        os.close(controller)
    try:
        assert process.wait(timeout=60) == 130, "stopped as after Ctrl-C, not ended by a write's OSError"
        assert [pid for pid in pids if is_alive(pid)] == [], "every process the run started is gone"
    finally:
        for pid in filter(is_alive, pids):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_second_sigterm_or_sighup_while_the_runs_stop_kills_them_as_a_second_ctrl_c_does(tmp_path, signal_number):
    # Stopping waits up to --stop-timeout for a run that ignores SIGINT; the second signal ends the wait
    # (at its default action it killed the runner, and the run went on).
    (tmp_path / "pids").mkdir()
    command = f"{FAKE} --sleep 100 --pid-dir pids --spawn-helper --ignore-sigint"
    process = start_runner("--env-ids", "Pong", "--stop-timeout", "60", "--command", command, cwd=tmp_path)
    wait_for_files(tmp_path / "pids", 2)
    process.send_signal(signal_number)
    while "stopping 1 running run(s)" not in (line := process.stdout.readline()) and line:
        pass
    stderr, seconds = interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 2, signal_number)
    assert seconds < 30, "killed at once, not at the stop timeout"
    assert stderr.strip().splitlines()[-1] == "error: interrupted: stopped Pong__fake_train__1"


def test_a_second_ctrl_c_right_after_the_first_still_kills_every_run(tmp_path):
    # A double tap: the second SIGINT comes while the first is still sending SIGINT to the runs. If the two
    # arrive before the runner takes the first, they are one: the runs are then killed at the stop timeout.
    (tmp_path / "pids").mkdir()
    command = f"{FAKE} --sleep 100 --pid-dir pids --ignore-sigint"
    process = start_runner(
        "--env-ids",
        "Pong",
        "Qbert",
        "--seeds",
        "1",
        "2",
        "--workers",
        "4",
        "--stop-timeout",
        "5",
        "--command",
        command,
        cwd=tmp_path,
    )
    wait_for_files(tmp_path / "pids", 4)
    time.sleep(0.3)
    process.send_signal(signal.SIGINT)
    time.sleep(0.001)
    interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 4)


@pytest.mark.skipif(shutil.which("torchrun", path=os.path.dirname(sys.executable)) is None, reason="no torchrun")
def test_ctrl_c_stops_a_torchrun_run_and_its_workers(tmp_path):
    (tmp_path / "pids").mkdir()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    process = start_runner(
        "--env-ids",
        "Pong",
        "--seeds",
        "1",
        "--command",
        f"{torchrun} --standalone --nproc-per-node=2 {FAKE_TRAIN} --sleep 100 --pid-dir pids",
        cwd=tmp_path,
    )
    interrupt_and_check_nothing_is_left(process, tmp_path / "pids", 2)


# ---------------------------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------------------------
SLURM_ARGS = [
    "--env-ids",
    "Pong",
    "ALE/Breakout-v5",
    "--seeds",
    "1",
    "2",
    "3",
    "--slurm",
    "--job-name",
    "study",
    "--partition",
    "cpu",
    "--cpus-per-task",
    "4",
    "--gpus",
    "1",
    "--time",
    "2:00:00",
    "--mem",
    "8G",
]


def sbatch_options(script: str) -> dict[str, str]:
    return dict(line[len("#SBATCH --") :].split("=", 1) for line in script.splitlines() if line.startswith("#SBATCH"))


def test_slurm_script_asks_for_one_array_task_per_env_and_seed_with_the_resources(tmp_path):
    result = runner(*SLURM_ARGS, "--workers", "2", "--command", FAKE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    script = (tmp_path / "logs" / "study.sbatch").read_text()
    assert script in result.stdout, "the script is printed"
    assert script.startswith("#!/bin/bash\n")
    assert sbatch_options(script) == {
        "job-name": "study",
        "array": "0-5%2",
        "cpus-per-task": "4",
        "time": "2:00:00",
        "mem": "8G",
        "output": str(tmp_path / "logs" / "study-%A_%a.out"),
        "partition": "cpu",
        "gpus": "1",
    }
    assert "{{" not in script
    assert subprocess.run(["bash", "-n", str(tmp_path / "logs" / "study.sbatch")]).returncode == 0


def test_slurm_script_without_partition_gpus_or_worker_cap_leaves_them_out(tmp_path):
    result = runner("--env-ids", "Pong", "--seeds", "1", "2", "--slurm", "--command", FAKE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    options = sbatch_options((tmp_path / "logs" / "cleanrl.sbatch").read_text())
    assert options["array"] == "0-1"
    assert "partition" not in options and "gpus" not in options


@pytest.mark.parametrize("task", range(6))
def test_slurm_array_task_k_runs_the_kth_command_into_its_own_log(tmp_path, task):
    result = runner(*SLURM_ARGS, "--command", f"{FAKE} --iterations 1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    env_id, seed = ["Pong", "ALE/Breakout-v5"][task // 3], [1, 2, 3][task % 3]
    name = f"{env_id.replace('/', '_')}__fake_train__{seed}"
    script = tmp_path / "logs" / "study.sbatch"
    # Run the task the way Slurm would, from elsewhere: the script goes back to the submit folder.
    environment = {**os.environ, "SLURM_ARRAY_TASK_ID": str(task), "SLURM_CPUS_PER_TASK": "4"}
    task_run = subprocess.run(["bash", str(script)], cwd="/", env=environment, capture_output=True, text=True)
    assert task_run.returncode == 0, task_run.stderr
    assert task_run.stdout.startswith(f"task {task}: {name} (OMP_NUM_THREADS=4")
    log = (tmp_path / "logs" / f"{name}.log").read_text()
    assert f"env {env_id} seed {seed} OMP_NUM_THREADS=4\n" in log
    assert f"# {FAKE} --iterations 1 --env-id {shlex.quote(env_id)} --seed {seed}\n" == log.splitlines(True)[0]


def test_a_slurm_task_of_a_torchrun_command_divides_its_cores_by_the_processes_per_node(tmp_path):
    command = f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node=2 {FAKE_TRAIN} --iterations 1"
    assert runner("--env-ids", "Pong", "--slurm", "--command", command, cwd=tmp_path).returncode == 0
    environment = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_CPUS_PER_TASK": "4"}
    task_run = subprocess.run(
        ["bash", str(tmp_path / "logs" / "cleanrl.sbatch")], env=environment, capture_output=True, text=True
    )
    assert task_run.stdout.startswith("task 0: Pong__fake_train__1 (OMP_NUM_THREADS=2,"), task_run.stdout


@pytest.mark.parametrize("resumes", [True, False], ids=["--resume", "no --resume"])
def test_a_resubmitted_slurm_task_keeps_the_log_of_a_run_that_resumes_itself(tmp_path, resumes):
    # as local runs do: a run with --resume goes on from its checkpoint, its earlier attempts' log kept
    command = f"{FAKE} --iterations 1" + (" --resume auto" if resumes else "")
    assert runner("--env-ids", "Pong", "--slurm", "--command", command, cwd=tmp_path).returncode == 0
    environment = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_CPUS_PER_TASK": "1"}
    for _ in range(2):
        task_run = subprocess.run(
            ["bash", str(tmp_path / "logs" / "cleanrl.sbatch")], env=environment, capture_output=True, text=True
        )
        assert task_run.returncode == 0, task_run.stderr
    log = (tmp_path / "logs" / "Pong__fake_train__1.log").read_text()
    assert log.count(f"# {command} --env-id Pong --seed 1\n") == (2 if resumes else 1)
    assert log.count("env Pong seed 1 ") == (2 if resumes else 1)


def test_slurm_task_of_a_failing_run_fails(tmp_path):
    runner("--env-ids", "Pong", "--seeds", "2", "--slurm", "--command", f"{FAKE} --fail-seeds 2", cwd=tmp_path)
    environment = {**os.environ, "SLURM_ARRAY_TASK_ID": "0", "SLURM_CPUS_PER_TASK": "1"}
    task_run = subprocess.run(
        ["bash", str(tmp_path / "logs" / "cleanrl.sbatch")], env=environment, capture_output=True, text=True
    )
    assert task_run.returncode == 1


def test_slurm_submits_with_sbatch_when_it_is_on_path(tmp_path):
    bin_dir = fake_sbatch(tmp_path / "bin", f'echo "$@" > {tmp_path}/sbatch-args\necho "Submitted batch job 42"')
    result = runner(
        "--env-ids", "Pong", "--slurm", "--command", FAKE, cwd=tmp_path, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    )
    assert result.returncode == 0, result.stderr
    assert "Submitted batch job 42" in result.stdout
    assert (tmp_path / "sbatch-args").read_text().strip() == os.path.join("logs", "cleanrl.sbatch")


def test_slurm_without_sbatch_writes_the_script_and_says_how_to_submit_it(tmp_path):
    # a PATH without sbatch, whether or not this machine has Slurm (the runner needs nothing else from it)
    result = runner("--env-ids", "Pong", "--slurm", "--command", FAKE, cwd=tmp_path, env={"PATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "sbatch is not on PATH: submit it on the cluster with `sbatch logs/cleanrl.sbatch`" in result.stdout


def test_slurm_dry_run_prints_the_script_and_writes_nothing(tmp_path):
    result = runner("--env-ids", "Pong", "--slurm", "--dry-run", "--command", FAKE, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "#SBATCH --array=0-0" in result.stdout
    assert not (tmp_path / "logs").exists()
