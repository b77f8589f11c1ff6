"""Experiment runner: train one or more commands over several env ids and seeds, on a pool of local
workers or as a Slurm array job, from one command line.

    python benchmark/run.py --env-ids BreakoutNoFrameskip-v4 PongNoFrameskip-v4 --seeds 1 2 3 --workers 2 \\
        --command "python cleanrl/ppo_atari.py --total-timesteps 1000000"
    python benchmark/run.py --env-ids BreakoutNoFrameskip-v4 --seeds 1 2 --workers 1 \\
        --command "torchrun --standalone --nproc-per-node=2 cleanrl/ppo_atari_multigpu.py --local-num-envs 8"
    python benchmark/run.py ... --dry-run                  # print the commands, run nothing
    python benchmark/run.py ... --slurm --partition gpu --gpus 1 --time 12:00:00   # an sbatch array job

Every run is one command (several may be given) with `--env-id ENV --seed SEED` appended, run by
bash in the current directory, so a command may start with `VAR=value`, `taskset ...` or
`torchrun ...`. Runs go in the order command, env id, seed. A run is named like its TensorBoard
directory without the time stamp, `{env_id}__{exp_name}__{seed}` (exp_name: the command's
`--exp-name`, else the script's file name), and its stdout and stderr go to `LOG_DIR/{name}.log`
(replacing the log of an earlier run of the same name).

Threads: each run gets OMP_NUM_THREADS = usable cores // (workers * processes of the run), at least
1 (torch and the scripts' emulators size their thread pools from it); the processes of a run are
torchrun's --nproc-per-node, else 1. Under --slurm the cores are the task's --cpus-per-task. A
`OMP_NUM_THREADS=N` at the start of a command overrides it.

Progress: on a terminal a status table is redrawn every second (queued / running / done / failed,
elapsed time, and each run's latest steps, SPS and return, read from the progress and summary lines
the scripts print); off a terminal (nohup, Slurm, CI) one plain line per start and end of a run,
and the running runs' progress every --status-interval seconds. The exit status is non-zero when
a run failed, with one line naming every failed run and its log.

Ctrl-C (or SIGTERM, or the SIGHUP of a closed terminal unless the runner runs under nohup) stops the
runs cleanly: each run runs in a session of its own, the runner sends it SIGINT (torchrun passes it
to its workers), waits up to --stop-timeout seconds, then kills the run's process group and every
process the run had started, including workers that torchrun puts in sessions of their own. A
second Ctrl-C (or SIGTERM, or SIGHUP) kills them at once. A closed terminal's lost writes do not stop
the runner from stopping its runs.
Each run's processes hold LOG_DIR/locks/{name}.lock while they live: when a runner was killed outright
(SIGKILL) and its runs went on, a new runner with the same runs stops with a one-line error naming
them instead of starting them twice.

--skip-done makes a study resumable: run its command again after a crash, a reboot or the end of a
time-limited session, and only the runs that did not finish run (each run's log ends with the
runner's `# exit STATUS after ...` line); the TensorBoard directories of their cut-off attempts are
moved to LOG_DIR/incomplete_runs/ first, so that plots count every seed once. A command with
`--resume` (e.g. `--checkpoint-every N --resume auto`) goes on from its checkpoint in its own
directory instead: nothing of it is set aside, each attempt is added to its log, and the last
attempt's command is the one compared. Under --slurm too, a resubmitted task of such a command adds
to its log instead of replacing it.

--slurm renders benchmark/slurm_template.sh into LOG_DIR/{job_name}.sbatch (one array task per
command x env id x seed; --workers, when given, caps how many run at once), prints it, and submits
it with sbatch when sbatch is on PATH.
"""

import argparse
import ctypes
import fcntl
import glob
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

BENCHMARK_DIR = os.path.dirname(os.path.abspath(__file__))
SLURM_TEMPLATE = os.path.join(BENCHMARK_DIR, "slurm_template.sh")

# What the scripts print (progress lines, then the summary line): the runner shows the latest of each.
STEPS_PATTERN = re.compile(r"([\d,]+)/([\d,]+) steps")
SPS_PATTERN = re.compile(r"([\d,]+) SPS")
RETURN_PATTERNS = [re.compile(r"return \(last \d+\) (\S+)"), re.compile(r"mean return of the last \d+ \w+ (\S+)")]


def fail(message: str):
    """A user error: one line naming the problem, a non-zero exit, no traceback."""
    sys.exit(f"error: {message}")


# ---------------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    name: str
    command: str  # the shell line: the user's command with --env-id and --seed appended
    processes: int  # processes the command starts (torchrun's --nproc-per-node)
    resumes: bool = False  # the command has --resume: a restart continues the run's own directory
    state: str = "queued"  # queued, running, done, failed, stopped
    process: subprocess.Popen | None = None
    log_path: str = ""
    started: float = 0.0
    ended: float = 0.0
    returncode: int | None = None
    steps: str = "-"
    sps: str = "-"
    recent_return: str = "-"
    log_offset: int = 0
    partial_line: str = ""
    known_processes: set = field(default_factory=set)  # (pid, start time) of every process seen in the run
    lock: object = None  # LOG_DIR/locks/{name}.lock, held by the runner and by the run's processes

    def elapsed(self) -> str:
        if not self.started:
            return "-"
        seconds = int((self.ended or time.time()) - self.started)
        return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


def option_value(tokens: list[str], *names: str) -> str | None:
    """The value of `--name value` or `--name=value` in a command's tokens, for any of the names."""
    for i, token in enumerate(tokens):
        for name in names:
            if token == name and i + 1 < len(tokens):
                return tokens[i + 1]
            if token.startswith(name + "="):
                return token[len(name) + 1 :]
    return None


def exp_name_of(tokens: list[str]) -> str:
    """What the script will call the experiment: its --exp-name, else its file name (the scripts' default)."""
    name = option_value(tokens, "--exp-name", "--exp_name")
    if name:
        return name
    for token in tokens:
        if token.endswith(".py"):
            return os.path.basename(token)[: -len(".py")]
    if "-m" in tokens and tokens.index("-m") + 1 < len(tokens):  # python -m cleanrl.ppo_atari
        return tokens[tokens.index("-m") + 1].rsplit(".", 1)[-1]
    programs = [t for t in tokens if "=" not in t]
    return os.path.basename(programs[0]) if programs else "run"


def processes_of(tokens: list[str]) -> int:
    """The processes a command starts on this node: torchrun's --nproc-per-node when it is a number."""
    launchers = ("torchrun", "torch.distributed.run")
    if not any(os.path.basename(token) in launchers for token in tokens):
        return 1
    value = option_value(tokens, "--nproc-per-node", "--nproc_per_node")
    return int(value) if value and value.isdigit() and int(value) > 0 else 1


def make_runs(commands: list[str], env_ids: list[str], seeds: list[int]) -> list[Run]:
    runs = []
    for command in commands:
        try:
            tokens = shlex.split(command)
        except ValueError as error:
            fail(f"cannot parse --command {command!r}: {error}")
        if not tokens:
            fail('--command is empty; give the training command, e.g. "python cleanrl/ppo_atari.py"')
        for flag in ("--env-id", "--seed"):
            if option_value(tokens, flag) is not None or flag in tokens:
                fail(f"--command already has {flag}; remove it, the runner appends --env-id and --seed to each run")
        exp_name = exp_name_of(tokens)
        for env_id in env_ids:
            for seed in seeds:
                runs.append(
                    Run(
                        name=f"{env_id.replace('/', '_')}__{exp_name}__{seed}",
                        command=f"{command} --env-id {shlex.quote(env_id)} --seed {seed}",
                        processes=processes_of(tokens),
                        resumes=option_value(tokens, "--resume") is not None,
                    )
                )
    for seed in seeds:
        if seeds.count(seed) > 1:
            fail(f"--seeds gives seed {seed} twice; give each seed once")
    for env_id in env_ids:
        same = list(dict.fromkeys(other for other in env_ids if other.replace("/", "_") == env_id.replace("/", "_")))
        if len(same) > 1:  # a run's name and log have the env id with its "/" made "_"
            fail(f"--env-ids {' and '.join(same)} would name their runs alike ({env_id.replace('/', '_')}__...)")
        if env_ids.count(env_id) > 1:
            fail(f"--env-ids gives {env_id} twice; give each env id once")
    names = [run.name for run in runs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        fail(f"two runs would be named {duplicates[0]}: give each --command its own --exp-name")
    return runs


def threads_per_run(cores: int, workers: int, processes: int) -> int:
    return max(1, cores // (workers * processes))


# ---------------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------------
def process_table() -> dict[int, tuple[int, int]]:
    """{pid: (parent pid, start time)} of every living process (zombies left out), from /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:  # it exited meanwhile
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
        if fields[0] != "Z":
            table[int(entry)] = (int(fields[1]), int(fields[19]))
    return table


def process_tree(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of root and all its descendants: the start time tells a reused pid apart."""
    table = process_table()
    found, frontier = set(), [root]
    while frontier:
        pid = frontier.pop()
        if pid in table:
            found.add((pid, table[pid][1]))
            frontier.extend(child for child, (parent, _) in table.items() if parent == pid)
    return found


def still_alive(known: set[tuple[int, int]]) -> set[tuple[int, int]]:
    table = process_table()
    return {(pid, start) for pid, start in known if pid in table and table[pid][1] == start}


# The widest vector instructions a CPU has, best first: one model name ("AMD EPYC") covers machines
# whose fp32 speeds differ by a third and whose bf16 speeds differ several-fold.
VECTOR_LEVELS = [("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2")]


def cpu_model() -> str:
    """The CPU's model name from Linux's /proc/cpuinfo with its widest vector instructions, e.g.
    "AMD EPYC (AVX-512 BF16)", else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        model = next(line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), []))
    level = next((name for flag, name in VECTOR_LEVELS if flag in flags), None)
    return f"{model} ({level})" if level else model


def machine() -> str:
    """The host and its CPU model: a study's runs can span machines (sessions, a cluster's nodes), and
    their SPS and wall-clock times compare only within one."""
    return f"{platform.node()}, {cpu_model()}, {os.cpu_count()} cpus"


def start(run: Run, log_dir: str, threads: int, dies_with_runner: bool = False):
    """Starts the run in a session of its own, its output in LOG_DIR/{name}.log. With dies_with_runner
    (benchmark/tune.py), the run's process gets SIGKILL from Linux when the runner dies: a trial whose
    tuner was killed cannot report to its study any more, and its retry must not share the cores with it."""
    run.log_path = os.path.join(log_dir, f"{run.name}.log")
    # A run that resumes itself keeps the log of its earlier attempts (their checkpoints, a
    # traceback) and adds this one's; --skip-done reads the first and the last line.
    with open(run.log_path, "a" if run.resumes else "w") as log:
        log.write(
            f"# {run.command}\n# OMP_NUM_THREADS={threads}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
            f" on {machine()}\n"
        )
        log.flush()
        run.log_offset = log.tell()
        # A session of its own: the terminal's Ctrl-C reaches the runner only, which stops each run
        # as a whole (its process group) instead of leaving half of a torchrun job behind.
        # The runner stops a run with SIGINT, which the run must not ignore: a runner started in the
        # background by a script (`nohup bash study.sh &`) inherits an ignored SIGINT, which every
        # program it starts would inherit too, and a Python script then never sees a KeyboardInterrupt
        # (it went on until the stop timeout's SIGKILL). The runner has no threads, so a preexec_fn is safe.
        run.process = subprocess.Popen(
            ["bash", "-c", run.command],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
            pass_fds=(run.lock.fileno(),),  # the run holds its lock for as long as it lives, runner or not
            preexec_fn=lambda: prepare_run_process(dies_with_runner),
        )
    run.state, run.started = "running", time.time()


def prepare_run_process(dies_with_runner: bool):
    """In the run's process, in its new session, before it execs: SIGINT at its default; with
    dies_with_runner, a SIGKILL when the runner's thread that started it ends (prctl PR_SET_PDEATHSIG,
    kept across exec; bash -c execs a single command, so the script itself gets it). And the runner's
    niceness for the session: where the kernel groups processes by session (sched_autogroup, on by default
    on most distributions) a process's nice value only ranks it within its session, so a `nice -n 19`
    runner's run would otherwise take its full share of the cores from every other session's work."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    if dies_with_runner:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    niceness = os.nice(0)
    if niceness > 0 and os.path.exists("/proc/self/autogroup"):
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(niceness))
        except OSError:  # a kernel without autogroup scheduling: the nice value alone already ranks the run
            pass


PR_SET_PDEATHSIG = 1  # from linux/prctl.h


def read_progress(run: Run):
    """Takes the newest steps, SPS and return from what the run has written to its log since the last call."""
    try:
        with open(run.log_path, errors="replace") as log:
            log.seek(run.log_offset)
            text = log.read()
            run.log_offset = log.tell()
    except OSError:
        return
    lines = re.split(r"[\r\n]", run.partial_line + text)
    run.partial_line = lines.pop()  # not finished yet: a number may be cut in two
    for line in lines:
        if match := STEPS_PATTERN.search(line):
            run.steps = f"{match[1]}/{match[2]}"
        if match := SPS_PATTERN.search(line):
            run.sps = match[1]
        for pattern in RETURN_PATTERNS:
            if match := pattern.search(line):
                run.recent_return = match[1]


def finish(run: Run):
    read_progress(run)
    run.returncode, run.ended = run.process.returncode, time.time()
    run.state = "done" if run.returncode == 0 else "failed"
    with open(run.log_path, "a") as log:  # the last line says how it ended: what --skip-done reads
        log.write(f"\n{EXIT_LINE}{run.returncode} after {run.elapsed()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
    run.lock.close()


EXIT_LINE = "# exit "


HEADER_SECOND_LINE = re.compile(r"# OMP_NUM_THREADS=\d+, started ")


def finished_before(run: Run, log_dir: str) -> bool:
    """Whether an earlier runner finished this run, the same command, with exit status 0: its log's
    last header names the command and the log ends with the runner's exit line. The last header: a
    command with --resume adds each attempt's to one log, and a flag that resuming allows (e.g.
    --checkpoint-every) may have changed since the first, which would make the run never done."""
    try:
        with open(os.path.join(log_dir, f"{run.name}.log"), errors="replace") as log:
            lines = log.read().splitlines()
    except OSError:
        return False
    headers = [0] + [i - 1 for i in range(2, len(lines)) if HEADER_SECOND_LINE.match(lines[i])]
    return bool(lines) and lines[headers[-1]] == f"# {run.command}" and lines[-1].startswith(f"{EXIT_LINE}0 after")


def lock_runs(runs: list[Run], log_dir: str) -> list[str]:
    """Takes each run's lock, LOG_DIR/locks/{name}.lock; returns the names of the runs whose lock is held
    elsewhere: an attempt that outlived its runner (the runner killed with SIGKILL, its machine
    session gone while the run's own session went on) is still running, and starting the run again
    would make two trainings share the cores and one log."""
    held = []
    os.makedirs(os.path.join(log_dir, "locks"), exist_ok=True)
    for run in runs:
        run.lock = open(os.path.join(log_dir, "locks", f"{run.name}.lock"), "w")
        try:
            fcntl.flock(run.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.append(run.name)
    return held


def set_aside_earlier_attempts(run: Run, log_dir: str) -> list[str]:
    """Moves the TensorBoard directories of earlier, unfinished attempts of a run (runs/{name}__*,
    where the scripts write them) to LOG_DIR/incomplete_runs/, so that a plot does not count a
    cut-off attempt as one more seed. Kept, not deleted."""
    moved = []
    for path in sorted(glob.glob(os.path.join("runs", glob.escape(run.name) + "__*"))):
        if re.fullmatch(r"\d+", os.path.basename(path)[len(run.name) + 2 :]):  # the script's time stamp
            target = os.path.join(log_dir, "incomplete_runs", os.path.basename(path))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.move(path, target)
            moved.append(target)
    return moved


def stop(runs: list[Run], timeout: float, display) -> None:
    """SIGINT to every running run, then, after `timeout` seconds or a second Ctrl-C, SIGKILL to
    whatever is left of them: their process groups and every process they were seen to start."""
    # All of it in the try: a second Ctrl-C a few milliseconds after the first (a double tap) comes
    # while the runs are still being sent SIGINT, and must go on to the SIGKILLs as well.
    try:
        for run in runs:
            run.known_processes |= process_tree(run.process.pid)
            try:
                os.killpg(run.process.pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        display.message(
            f"stopping {len(runs)} running run(s): up to {timeout:.0f} s to exit, Ctrl-C again kills them now"
        )
        deadline = time.time() + timeout
        while time.time() < deadline and any(run.process.poll() is None for run in runs):
            for run in runs:
                if run.process.poll() is None:  # torchrun's workers are started while it lives: keep track
                    run.known_processes |= process_tree(run.process.pid)
            time.sleep(0.1)
    except KeyboardInterrupt:
        pass
    # Once killing, nothing stops the runner halfway with runs left alive: one more Ctrl-C, SIGTERM or
    # SIGHUP is ignored until they are gone (the caller's handlers are back when this returns).
    handlers = {
        number: signal.signal(number, signal.SIG_IGN) for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    }
    try:
        for run in runs:
            if run.process.poll() is None:  # a second Ctrl-C can come before the run's processes were listed
                run.known_processes |= process_tree(run.process.pid)
            try:
                os.killpg(run.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for pid, _ in still_alive(run.known_processes):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            run.process.wait()
            read_progress(run)
            run.state, run.returncode, run.ended = "stopped", run.process.returncode, time.time()
        deadline = time.time() + 5  # SIGKILL is asynchronous: return once the processes are really gone
        while time.time() < deadline and any(still_alive(run.known_processes) for run in runs):
            time.sleep(0.05)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


# ---------------------------------------------------------------------------------------------
# Display
# ---------------------------------------------------------------------------------------------
COLUMNS = [
    ("run", "name"),
    ("state", "state"),
    ("elapsed", None),
    ("steps", "steps"),
    ("SPS", "sps"),
    ("return", "recent_return"),
]


def table_lines(runs: list[Run]) -> list[str]:
    rows = [[name for name, _ in COLUMNS]] + [
        [run.elapsed() if attribute is None else str(getattr(run, attribute)) for _, attribute in COLUMNS]
        for run in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def counts(runs: list[Run]) -> str:
    states = ("queued", "running", "done", "skipped", "failed", "stopped")
    number = {state: sum(run.state == state for run in runs) for state in states}
    return ", ".join(f"{n} {state}" for state, n in number.items() if n)


def show(text: str, stream=None):
    """Writes text to stdout (or stream) at once. A terminal that was closed fails every write with EIO,
    a pipe whose reader went away with EPIPE: the runner goes on without telling anyone, since the
    closed terminal's SIGHUP has it stop its runs, and a display that raised would leave them running."""
    stream = stream or sys.stdout
    try:
        stream.write(text)
        stream.flush()
    except OSError:
        pass


class TerminalDisplay:
    """The status table, redrawn in place once a second."""

    def __init__(self, runs: list[Run]):
        self.runs, self.drawn_lines, self.last_draw = runs, 0, 0.0

    def message(self, text: str):
        self.erase()
        show(text + "\n")
        self.update(force=True)

    def erase(self):
        if self.drawn_lines:
            show(f"\x1b[{self.drawn_lines}F\x1b[J")
            self.drawn_lines = 0

    def update(self, force: bool = False):
        if not force and time.time() - self.last_draw < 1.0:
            return
        self.erase()
        lines = table_lines(self.runs) + [counts(self.runs)]
        show("\n".join(lines) + "\n")
        self.drawn_lines, self.last_draw = len(lines), time.time()

    def started(self, run: Run):
        self.update(force=True)

    def ended(self, run: Run):
        self.update(force=True)

    def close(self):
        self.update(force=True)


class PlainDisplay:
    """Plain lines for a log file: every start and end, and the running runs every `interval` seconds."""

    def __init__(self, runs: list[Run], interval: float):
        self.runs, self.interval, self.last_report = runs, interval, time.time()

    def message(self, text: str):
        show(f"[{time.strftime('%H:%M:%S')}] {text}\n")

    def started(self, run: Run):
        self.message(f"started {run.name} (pid {run.process.pid}, log {run.log_path}): {run.command}")

    def ended(self, run: Run):
        outcome = "done" if run.state == "done" else "FAILED"
        code = "" if run.state == "done" else f" (exit {run.returncode}, see {run.log_path})"
        self.message(f"{outcome} {run.name}{code} after {run.elapsed()}: {run.sps} SPS, return {run.recent_return}")

    def update(self, force: bool = False):
        if time.time() - self.last_report < self.interval:
            return
        self.last_report = time.time()
        for run in self.runs:
            if run.state == "running":
                self.message(
                    f"running {run.name} {run.elapsed()}: steps {run.steps}, {run.sps} SPS, return {run.recent_return}"
                )
        self.message(counts(self.runs))

    def close(self):
        show("\n".join(table_lines(self.runs)) + "\n")


class Interrupted(Exception):
    pass


def raise_interrupted(signum, frame):
    raise Interrupted()


def raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt()


def run_locally(
    runs: list[Run], workers: int, log_dir: str, status_interval: float, stop_timeout: float, skip_done: bool = False
) -> int:
    os.makedirs(log_dir, exist_ok=True)
    cores = len(os.sched_getaffinity(0))
    display = TerminalDisplay(runs) if sys.stdout.isatty() else PlainDisplay(runs, status_interval)
    display.message(f"{len(runs)} run(s), {workers} at a time, logs in {log_dir}/")
    still_running = lock_runs(runs, log_dir)
    if still_running:
        display.close()
        print(
            f"error: still running from an earlier runner: {', '.join(still_running)} (their processes hold "
            f"{log_dir}/locks/NAME.lock); stop them first",
            file=sys.stderr,
            flush=True,
        )
        return 1
    if skip_done:
        for run in runs:
            if finished_before(run, log_dir):
                run.state = "skipped"
            elif not run.resumes:  # a run with --resume goes on from its checkpoint, in its directory
                for path in set_aside_earlier_attempts(run, log_dir):
                    display.message(f"set aside the unfinished attempt {path}")
        skipped = [run.name for run in runs if run.state == "skipped"]
        if skipped:
            display.message(f"skipping {len(skipped)} run(s) done earlier: {', '.join(skipped)}")
    queue, running = [run for run in runs if run.state == "queued"], []
    # A scheduler's SIGTERM, `kill`, and a closed terminal's SIGHUP stop the runs like Ctrl-C; but
    # not a signal the runner was started with ignored (`nohup` ignores SIGHUP: the runs go on).
    stop_signals = [
        number for number in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(number) is not signal.SIG_IGN
    ]
    for number in stop_signals:
        signal.signal(number, raise_interrupted)
    try:
        while queue or running:
            while queue and len(running) < workers:
                run = queue.pop(0)
                running.append(run)  # before it starts: a Ctrl-C from here on stops it too
                start(run, log_dir, threads_per_run(cores, workers, run.processes))
                display.started(run)
            time.sleep(0.2)
            for run in list(running):
                read_progress(run)
                if run.process.poll() is not None:
                    finish(run)
                    running.remove(run)
                    display.ended(run)
            display.update()
    except (KeyboardInterrupt, Interrupted):
        timeout = stop_timeout
        while True:
            try:  # first thing: Python runs a signal's handler at a call or a loop's jump back, not before
                running = [run for run in running if run.process is not None]
                # While the runs stop, a second SIGTERM or SIGHUP kills them at once, as a second Ctrl-C
                # does (at their default, it would kill the runner and leave the runs running).
                for number in stop_signals:
                    signal.signal(number, raise_keyboard_interrupt)
                stop(running, timeout, display)
                break
            except (KeyboardInterrupt, Interrupted):  # the second came before stop() could catch it: kill now
                timeout = 0
        for number in (signal.SIGINT, *stop_signals):  # the runs are gone: what is left is to say so
            signal.signal(number, signal.SIG_IGN)
        display.close()
        not_started = f", {len(queue)} not started" if queue else ""
        show(f"error: interrupted: stopped {', '.join(r.name for r in running) or 'no run'}{not_started}\n", sys.stderr)
        return 130
    display.close()
    failed = [run for run in runs if run.state == "failed"]
    if failed:
        names = ", ".join(f"{run.name} (exit {run.returncode}, {run.log_path})" for run in failed)
        show(f"error: {len(failed)} of {len(runs)} runs failed: {names}\n", sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------------------
# Slurm
# ---------------------------------------------------------------------------------------------
def render_slurm(runs: list[Run], cli, log_dir: str, workdir: str) -> str:
    """benchmark/slurm_template.sh with its {{placeholders}} filled in."""
    with open(SLURM_TEMPLATE) as f:
        template = f.read()
    options = [f"#SBATCH --partition={cli.partition}"] if cli.partition else []
    if cli.gpus:
        options.append(f"#SBATCH --gpus={cli.gpus}")
    bash_array = lambda values: "\n".join(f"  {shlex.quote(str(value))}" for value in values)
    values = {
        "job_name": cli.job_name,
        "array": f"0-{len(runs) - 1}" + (f"%{cli.workers}" if cli.workers else ""),
        "cpus_per_task": str(cli.cpus_per_task),
        "time": cli.time,
        "mem": cli.mem,
        "output": shlex.quote(os.path.join(log_dir, f"{cli.job_name}-%A_%a.out")),
        "optional_options": "\n".join(options),
        "names": bash_array(run.name for run in runs),
        "commands": bash_array(run.command for run in runs),
        "processes": bash_array(run.processes for run in runs),
        "resumes": bash_array(int(run.resumes) for run in runs),
        "workdir": shlex.quote(workdir),
        "log_dir": shlex.quote(log_dir),
    }
    lines = [line for line in template.splitlines(keepends=True) if line.strip() != "{{optional_options}}" or options]
    return re.sub(r"\{\{(\w+)\}\}", lambda match: values[match[1]], "".join(lines))


def submit_slurm(runs: list[Run], cli, log_dir: str) -> int:
    script = render_slurm(runs, cli, os.path.abspath(log_dir), os.getcwd())
    print(script, end="", flush=True)
    if cli.dry_run:
        return 0
    os.makedirs(log_dir, exist_ok=True)  # Slurm writes --output there and does not create it
    path = os.path.join(log_dir, f"{cli.job_name}.sbatch")
    with open(path, "w") as f:
        f.write(script)
    print(f"\nwrote {path} ({len(runs)} array tasks)", flush=True)
    if shutil.which("sbatch") is None:
        print(f"sbatch is not on PATH: submit it on the cluster with `sbatch {path}`", flush=True)
        return 0
    return subprocess.run(["sbatch", path]).returncode


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--command",
        nargs="+",
        required=True,
        help="the training command(s), each one string; --env-id and --seed are appended",
    )
    parser.add_argument("--env-ids", nargs="+", required=True, help="env ids to run each command on")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1], help="seeds to run (default: 1)")
    parser.add_argument(
        "--workers",
        type=int,
        help="runs at the same time (default 1; under --slurm: no cap); each run gets "
        "OMP_NUM_THREADS = cores // (workers * processes of the run)",
    )
    parser.add_argument("--log-dir", default="logs", help="where each run's output goes, as {name}.log (default: logs)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands (or the sbatch script) and stop")
    parser.add_argument(
        "--skip-done",
        action="store_true",
        help="skip the runs that an earlier runner finished with exit 0 (their log in --log-dir "
        "says so, with the same command), and move the TensorBoard directories of earlier "
        "unfinished attempts of the others to LOG_DIR/incomplete_runs/: a study cut off "
        "midway goes on where it stopped when its command is run again",
    )
    parser.add_argument(
        "--status-interval",
        type=float,
        default=60.0,
        help="seconds between the progress lines of the running runs when stdout is not a terminal",
    )
    parser.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        help="seconds the runs get to exit after Ctrl-C before they are killed (default 30)",
    )
    slurm = parser.add_argument_group("Slurm (--slurm: an sbatch array script instead of local workers)")
    slurm.add_argument("--slurm", action="store_true", help="render, print and submit (with sbatch, if on PATH)")
    slurm.add_argument("--job-name", default="cleanrl", help="the Slurm job name, also the script's file name")
    slurm.add_argument("--partition", help="the partition (default: the cluster's)")
    slurm.add_argument("--cpus-per-task", type=int, default=8, help="CPU cores per run (default 8)")
    slurm.add_argument("--gpus", type=int, default=0, help="GPUs per run (default 0)")
    slurm.add_argument("--time", default="24:00:00", help="time limit per run (default 24:00:00)")
    slurm.add_argument("--mem", default="32G", help="memory per run (default 32G)")
    cli = parser.parse_args()

    if cli.workers is not None and cli.workers < 1:
        fail("--workers must be at least 1")
    if cli.cpus_per_task < 1 or cli.gpus < 0:
        fail("--cpus-per-task must be at least 1 and --gpus at least 0")
    if cli.status_interval <= 0 or cli.stop_timeout < 0:
        fail("--status-interval must be positive and --stop-timeout at least 0")
    runs = make_runs(cli.command, cli.env_ids, cli.seeds)
    if cli.slurm and cli.skip_done:
        fail("--skip-done is for local runs; under --slurm, resubmit the array tasks that failed (sbatch --array=...)")
    if cli.slurm:
        sys.exit(submit_slurm(runs, cli, cli.log_dir))
    workers = cli.workers or 1
    if cli.dry_run:
        cores = len(os.sched_getaffinity(0))
        for run in runs:
            if cli.skip_done and finished_before(run, cli.log_dir):
                print(f"# done earlier, skipped: {run.command}")
                continue
            print(
                f"OMP_NUM_THREADS={threads_per_run(cores, workers, run.processes)} {run.command}"
                f"  > {os.path.join(cli.log_dir, run.name + '.log')}"
            )
        return
    sys.exit(run_locally(runs, workers, cli.log_dir, cli.status_interval, cli.stop_timeout, cli.skip_done))


if __name__ == "__main__":
    main()
