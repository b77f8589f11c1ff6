"""Hyperparameter search for any script of cleanrl/ with Optuna: trials on local workers, or on many
machines sharing one study (a PostgreSQL server, a journal file on a shared filesystem, a Slurm array
job, an AWS Batch array job).

    python benchmark/tune.py --command "python cleanrl/ppo.py --total-timesteps 100000" \\
        --env-ids CartPole-v1 --seeds 1 2 --n-trials 30 --workers 2 \\
        --param learning-rate=log:1e-4:1e-2 --param num-minibatches=choice:1,2,4,8 --param ent-coef=float:0:0.05
    python benchmark/tune.py ... --storage postgresql://user:password@host/db     # many machines, one study
    python benchmark/tune.py ... --storage journal:/shared/tune.journal --slurm --array-tasks 8 --gpus 1
    python benchmark/tune.py --report --study-name NAME --storage URL              # the results, no trial

A trial samples the --param ranges, then runs the command with them (and `--exp-name
{study}-trial{N} --env-id ENV --seed SEED` appended) once per env id and seed, all at once, the way
benchmark/run.py runs a study: same log files (LOG_DIR/{env_id}__{study}-trial{N}__{seed}.log), same
thread-count rule (OMP_NUM_THREADS = cores // (workers x runs of a trial x processes of a run)), same
clean stop. The objective, maximized, is the mean over the seeds of each run's mean episodic return
over its last --window games (charts/episodic_return in its TensorBoard events); with several env ids,
each env's return is first normalized, (return - low) / (high - low), by its --score-range or, for an
Atari game, by the random and human scores of benchmark/plot.py's table. While the runs go, the same
quantity is reported to Optuna every --report-every env steps; the pruner (median or successive
halving) may stop the trial then: its runs are stopped like a Ctrl-C, their folders kept and marked
(a file PRUNED in each run directory and a last line in each log).

A study is named (--study-name) and lives in --storage (default: sqlite:///tune/optuna.db, one local
file). The same command again continues the study until it has --n-trials finished (complete or
pruned) trials; several tuners with the same command and storage share the study. Each running trial
sends a heartbeat; a trial whose tuner died (SIGKILL, a lost node) is failed by the next tuner that
looks, after 2 x --heartbeat-interval without one, and retried once with the same parameters; so is a
trial stopped by Ctrl-C or SIGTERM.

When the study is done (and with --report), the tuner prints the best trials (parameters, the
objective's mean and standard deviation over seeds, the command that reproduces the best) and writes
them with Optuna's figures to OUT_DIR/{study}/. Docs: docs/tuning.md
"""

import argparse
import contextlib
import datetime
import fcntl
import glob
import hashlib
import math
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import types
import warnings
from dataclasses import dataclass, field

import numpy as np
import optuna
import run as runner  # benchmark/run.py: runs, logs, threads, clean stop, the Slurm template
from optuna.storages import JournalStorage, RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat  # the interface fail_stale_trials() checks for
from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
from optuna.trial import TrialState
from plot import REFERENCE_SCORES, game_of  # benchmark/plot.py: the Atari random and human scores
from sqlalchemy import text as sql
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

BENCHMARK_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(BENCHMARK_DIR)
STUDY_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9.-]|_(?!_))*$")  # no "__": it separates a run name's parts
SET_BY_THE_TUNER = ("env-id", "seed", "exp-name")
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
MAX_RETRY = 1  # a trial failed by an interrupt or a lost heartbeat is queued again this many times
RETRY_QUEUEING_S = 30.0  # how long such a trial's retry may take to appear in the study (see retries_being_queued)
# What a study remembers of the command that made it: a tuner with another one stops instead of mixing them.
DEFINITION = ("command", "env_ids", "seeds", "window", "score_ranges")
fail = runner.fail

optuna.logging.set_verbosity(optuna.logging.WARNING)  # the tuner says what happens, one line per event
warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
# The tuner runs trials with ask and tell, and records their heartbeats itself (work()).
warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")


# ---------------------------------------------------------------------------------------------
# The script's flags and the search space
# ---------------------------------------------------------------------------------------------
@dataclass
class Flag:
    kind: str  # int, float, bool, other
    default: str | None


def script_of(tokens: list[str]) -> int:
    """The index of the script (the first word ending in .py) in a command's words."""
    for i, token in enumerate(tokens):
        if token.endswith(".py"):
            return i
    fail(f'--command {shlex.join(tokens)!r} runs no .py script (e.g. "python cleanrl/ppo.py --total-timesteps 100000")')


def help_command(tokens: list[str]) -> tuple[list[str], dict]:
    """The command that prints the script's --help, and its environment: the command's own interpreter
    (its leading VAR=value words set in the environment), or this Python for a torchrun command."""
    index, environment = script_of(tokens), {}
    launch = tokens[: index + 1]
    while launch and re.fullmatch(r"[A-Za-z_]\w*=.*", launch[0]):
        name, value = launch.pop(0).split("=", 1)
        environment[name] = value
    if len(launch) == 1 or any(os.path.basename(t) in ("torchrun", "torch.distributed.run") for t in launch):
        launch = [sys.executable, tokens[index]]
    return launch + ["--help"], environment


def script_flags(tokens: list[str]) -> dict[str, Flag]:
    """{flag name without dashes: Flag} from the script's --help (tyro's table: `--name TYPE`, or
    `--name, --no-name` for a boolean, then the help text ending in `(default: ...)`)."""
    command, environment = help_command(tokens)
    # wide, so that tyro does not wrap a flag's text in the middle of its default
    env = {**os.environ, **environment, "COLUMNS": "1000", "OMP_NUM_THREADS": "1"}
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as error:
        fail(f"cannot run {shlex.join(command)} to read the script's flags: {error}")
    if result.returncode != 0:
        last = (result.stderr.strip() or result.stdout.strip() or "no output").splitlines()[-1]
        fail(f"{shlex.join(command)} exited {result.returncode} ({last}): the tuner reads the script's flags from it")
    flags, current = {}, None
    for line in result.stdout.splitlines():
        line = line.strip().strip("│|").strip()
        match = re.match(r"^(?:-\w, )?--([\w.-]+)(, --no-[\w.-]+)?(?: ([^\s]+))?(.*)$", line)
        if match:
            metavar = match[3] or ""
            kind = "bool" if match[2] else "int" if "INT" in metavar else "float" if "FLOAT" in metavar else "other"
            current = flags[match[1].replace("_", "-")] = Flag(kind, None)
            text = match[4]
        else:
            text = line
        if current is not None and (default := re.search(r"\(default: (.*?)\)\s*$", text)):
            current.default = default[1]
    flags.pop("help", None)
    if not flags:
        fail(f"{shlex.join(command)} printed no flags: is {tokens[script_of(tokens)]} a script of cleanrl/?")
    return flags


def number(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        fail(f"{what}: {text!r} is not a number")
    # float() takes inf and nan: Optuna cannot sample up to inf, and a score range to inf makes every objective 0
    if not math.isfinite(value):
        fail(f"{what}: {text!r} is not a finite number")
    return value


@dataclass
class Param:
    """One dimension of the search space: NAME=float:LOW:HIGH[:STEP], log:LOW:HIGH, int:LOW:HIGH[:STEP]
    or choice:A,B,C."""

    name: str
    kind: str
    low: float = 0.0
    high: float = 0.0
    step: float | None = None
    choices: list = field(default_factory=list)
    flag_kind: str = "other"

    def suggest(self, trial: optuna.Trial):
        if self.kind == "choice":
            return trial.suggest_categorical(self.name, self.choices)
        integer = self.kind == "int" or (self.kind == "log" and self.flag_kind == "int")
        if integer:
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.kind == "log"
            )
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.kind == "log")

    def arguments(self, value) -> list[str]:
        if self.flag_kind == "bool":
            return [f"--{self.name}" if value else f"--no-{self.name}"]
        return [f"--{self.name}", str(value)]


def choice_value(text: str, flag_kind: str, name: str):
    """A choice as Optuna stores it: a bool for a boolean flag, else an int, a float or the text."""
    if flag_kind == "bool":
        if text.lower() not in ("true", "false"):
            fail(f"--param {name}: --{name} is a boolean flag, its choices are true and false, not {text!r}")
        return text.lower() == "true"
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    return text


def parse_param(text: str) -> Param:
    """The syntax of one --param; the flag's existence and type are checked later, against --help."""
    usage = "use NAME=float:LOW:HIGH, NAME=log:LOW:HIGH, NAME=int:LOW:HIGH or NAME=choice:A,B,C"
    if "=" not in text or ":" not in text.split("=", 1)[1]:
        fail(f"--param {text!r}: {usage}")
    name, spec = text.split("=", 1)
    name = name.strip().lstrip("-").replace("_", "-")
    kind, _, rest = spec.partition(":")
    if not name:
        fail(f"--param {text!r}: no name before '='; {usage}")
    if kind == "choice":
        choices = [value.strip() for value in rest.split(",")]
        if not all(choices) or len(set(choices)) != len(choices):
            fail(f"--param {text!r}: the choices must be distinct and non-empty, e.g. {name}=choice:4,8,16")
        return Param(name, kind, choices=choices)
    if kind not in ("float", "log", "int"):
        fail(f"--param {text!r}: unknown kind {kind!r}; {usage}")
    parts = rest.split(":")
    if len(parts) not in (2, 3) or (kind == "log" and len(parts) == 3):
        fail(f"--param {text!r}: {usage} (float and int take an optional :STEP)")
    low, high = (number(part, f"--param {text!r}") for part in parts[:2])
    step = number(parts[2], f"--param {text!r}") if len(parts) == 3 else None
    if not low < high:
        fail(f"--param {text!r}: LOW must be below HIGH")
    if kind == "log" and low <= 0:
        fail(f"--param {text!r}: a log range needs LOW > 0")
    if step is not None and step <= 0:
        fail(f"--param {text!r}: STEP must be positive")
    if kind == "int" and not all(float(v).is_integer() for v in (low, high, step or 1)):
        fail(f"--param {text!r}: an int range takes whole numbers")
    return Param(name, kind, low, high, step)


def check_params(params: list[Param], flags: dict[str, Flag], tokens: list[str], script: str):
    """Every parameter is a flag of the script, of a fitting type, set by the tuner alone."""
    names = [param.name for param in params]
    for name in names:
        if names.count(name) > 1:
            fail(f"--param {name} is given twice")
    for param in params:
        if param.name in SET_BY_THE_TUNER:
            fail(f"--param {param.name}: the tuner sets --{param.name} itself")
        if param.name not in flags:
            fail(f"--param {param.name}: {script} has no flag --{param.name} (see python {script} --help)")
        if runner.option_value(tokens, f"--{param.name}") is not None or f"--{param.name}" in tokens:
            fail(f"--param {param.name}: --command sets --{param.name} too; remove it from --command")
        param.flag_kind = flags[param.name].kind
        if param.flag_kind == "bool" and param.kind != "choice":
            fail(f"--param {param.name}: --{param.name} is a boolean flag; use {param.name}=choice:true,false")
        if param.flag_kind == "int" and param.kind == "float":
            fail(f"--param {param.name}: --{param.name} takes an integer; use int:LOW:HIGH, log:LOW:HIGH or choice:...")
        if (
            param.flag_kind == "int"
            and param.kind == "log"
            and not (param.low.is_integer() and param.high.is_integer())
        ):
            fail(f"--param {param.name}: --{param.name} takes an integer; a log range of it needs whole bounds")
        if param.kind == "choice":
            param.choices = [choice_value(value, param.flag_kind, param.name) for value in param.choices]
    for token in tokens[script_of(tokens) + 1 :]:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("_", "-")
            if name not in flags and not (
                name.startswith("no-") and flags.get(name[3:], Flag("", None)).kind == "bool"
            ):
                fail(f"--command: {script} has no flag --{name} (see python {script} --help)")
    if "exp-name" not in flags:
        fail(f"{script} has no --exp-name flag: the tuner names each trial's runs with it")


def parse_score_ranges(texts: list[str], env_ids: list[str]) -> dict[str, list[float]]:
    """{env id: [low, high]} for every env id when the returns must be normalized (several env ids,
    or a range given): --score-range ENV=LOW:HIGH, else an Atari game's random and human scores."""
    ranges = {}
    for text in texts:
        match = re.fullmatch(r"(.+)=([^:]+):([^:]+)", text)
        if not match:
            fail(f"--score-range {text!r}: use ENV_ID=LOW:HIGH, e.g. CartPole-v1=0:500")
        low, high = (number(value, f"--score-range {text!r}") for value in (match[2], match[3]))
        if not low < high:
            fail(f"--score-range {text!r}: LOW must be below HIGH")
        if match[1] not in env_ids:
            fail(f"--score-range {text!r}: {match[1]} is not one of --env-ids")
        ranges[match[1]] = [low, high]
    if len(env_ids) > 1 or ranges:
        for env_id in env_ids:
            if env_id not in ranges:
                game = game_of(env_id)
                if game is None:
                    fail(
                        f"{env_id} needs --score-range {env_id}=LOW:HIGH: the objective averages normalized returns "
                        "over the env ids, and only Atari games have a built-in range (random and human scores)"
                    )
                ranges[env_id] = list(REFERENCE_SCORES[game])
    return ranges


# ---------------------------------------------------------------------------------------------
# Storage
# ---------------------------------------------------------------------------------------------
class JournalStorageWithHeartbeat(JournalStorage, BaseHeartbeat):
    """Optuna's journal file storage with the heartbeat that its RDB storage has: each heartbeat is a
    time stamp in the trial's system attributes (one journal line), and Optuna's fail_stale_trials()
    fails the running trials whose last one is older than the grace period. The time stamps come from
    the clocks of the tuners' machines, which must agree to within a fraction of the grace period
    (NTP does that on a cluster)."""

    def __init__(self, backend, heartbeat_interval: int, grace_period: int, stale_trial_callback):
        super().__init__(backend)
        self.heartbeat_interval, self.grace_period, self.stale_trial_callback = (
            heartbeat_interval,
            grace_period,
            stale_trial_callback,
        )

    def record_heartbeat(self, trial_id: int) -> None:
        self.set_trial_system_attr(trial_id, "heartbeat", time.time())

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        now = time.time()
        return [
            trial._trial_id
            for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
            if now - trial.system_attrs.get("heartbeat", trial.datetime_start.timestamp()) > self.grace_period
        ]

    def get_heartbeat_interval(self) -> int:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self):
        return self.stale_trial_callback


def shown(url: str) -> str:
    """A storage URL with its password hidden, for messages."""
    return re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", url)


def is_journal(url: str) -> bool:
    return "://" not in url


def journal_path(url: str) -> str:
    return os.path.abspath(url.removeprefix("journal:"))


def open_storage(url: str, heartbeat_interval: int):
    """The storage of --storage, with heartbeats on and a dead tuner's trial retried once: a URL
    (sqlite:///FILE, postgresql://..., mysql://...) is Optuna's RDB storage, anything else
    (journal:PATH or PATH) a journal file."""
    retry = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY)
    grace = 2 * heartbeat_interval
    if is_journal(url):
        path = journal_path(url)
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            return JournalStorageWithHeartbeat(JournalFileBackend(path), heartbeat_interval, grace, retry)
        except Exception as error:  # noqa: BLE001 (any failure to open the file is the user's to fix)
            fail(f"cannot open the journal file {path}: {type(error).__name__}: {str(error).splitlines()[0]}")
    engine_kwargs = {}
    if url.startswith("sqlite:///"):
        os.makedirs(os.path.dirname(os.path.abspath(url[len("sqlite:///") :])) or ".", exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 60}}  # several local tuners wait for each other's writes
    elif url.startswith("postgresql") and "connect_timeout" not in url:
        engine_kwargs = {"connect_args": {"connect_timeout": 10}}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # heartbeat_interval is "experimental"
            return RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=heartbeat_interval,
                grace_period=grace,
                heartbeat_stale_trial_callback=retry,
            )
    except Exception as error:  # noqa: BLE001 (a driver's error, a refused connection, a bad URL)
        message = " ".join(str(error).split())[:300]
        fail(f"cannot reach the storage {shown(url)}: {type(error).__name__}: {message}")


def tuners_lock(url: str, storage, study_name: str):
    """The lock that the tuners of a study hold in turn while they count its trials and start one, and while they
    fail a trial and queue its retry (see work()): a function that returns it as a context manager. It is let go
    when its tuner dies while holding it: a PostgreSQL or MySQL advisory lock (the server's, for tuners on many
    machines), a flock beside an SQLite file (one machine), or a lock file beside a journal file, of the kind the
    journal's own writes take (a shared filesystem; one left by a dead tuner is broken after 30 s)."""
    if is_journal(url):
        return lambda: journal_file_lock(JournalFileSymlinkLock(f"{journal_path(url)}.tuners"))
    engine, name = storage.engine, f"benchmark/tune.py {hashlib.sha1(study_name.encode()).hexdigest()}"
    if engine.dialect.name == "postgresql":  # a transaction's lock: it goes when the connection does
        return lambda: database_lock(engine, "SELECT pg_advisory_xact_lock(hashtext(:name))", None, name)
    if engine.dialect.name == "mysql":
        return lambda: database_lock(engine, "SELECT GET_LOCK(:name, -1)", "SELECT RELEASE_LOCK(:name)", name)
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if not database or database == ":memory:":  # a study in this process alone
            return contextlib.nullcontext
        return lambda: file_lock(f"{os.path.abspath(database)}.tuners.lock")
    fail(f"--storage {shown(url)}: tuners share a study through PostgreSQL, MySQL, SQLite or a journal file")


@contextlib.contextmanager
def database_lock(engine, acquire: str, release: str | None, name: str):
    with engine.connect() as connection:  # its own, for the lock alone
        connection.execute(sql(acquire), {"name": name})
        try:
            yield
        finally:
            if release:
                connection.execute(sql(release), {"name": name})
    # the connection's transaction ends as it goes back to the pool, and a PostgreSQL transaction lock with it


@contextlib.contextmanager
def file_lock(path: str):
    with open(path, "a") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        yield  # closing the file lets the lock go, as the process's death does


@contextlib.contextmanager
def journal_file_lock(lock: JournalFileSymlinkLock):
    lock.acquire()
    try:
        yield
    finally:
        lock.release()


# ---------------------------------------------------------------------------------------------
# Reading a run's returns while it runs
# ---------------------------------------------------------------------------------------------
class Returns:
    """A run's episodic returns (charts/episodic_return) and the last step it logged, read from its
    TensorBoard events as the script writes them. Made before the run starts: its directory is the one
    that appears after that."""

    def __init__(self, env_id: str, exp_name: str, seed: int):
        self.patterns = {
            f"runs/{glob.escape(env)}__{glob.escape(exp_name)}__{seed}__*" for env in (env_id, env_id.replace("/", "_"))
        }
        # An earlier study of the same name (another --storage, a deleted database) left directories of the
        # same run names: the first reads come before the script has made its own, and would take one of those.
        self.earlier = {path for pattern in self.patterns for path in glob.glob(pattern)}
        self.directory, self.accumulator = None, None
        self.steps, self.values, self.last_step = np.zeros(0), np.zeros(0), 0

    def refresh(self):
        if self.directory is None:
            found = sorted(
                path
                for pattern in self.patterns
                for path in glob.glob(pattern)
                if path not in self.earlier and os.path.isdir(path)
            )
            if not found:
                return
            self.directory = found[-1]
            self.accumulator = EventAccumulator(self.directory, size_guidance={"scalars": 0, "tensors": 1})
        try:
            self.accumulator.Reload()
        except Exception:  # noqa: BLE001 (a file being written; the next reload reads on)
            return
        tags = self.accumulator.Tags()["scalars"]
        for tag in tags:
            events = self.accumulator.Scalars(tag)
            if events:
                self.last_step = max(self.last_step, events[-1].step)
        if "charts/episodic_return" in tags:
            events = self.accumulator.Scalars("charts/episodic_return")
            self.steps = np.array([event.step for event in events])
            self.values = np.array([event.value for event in events], dtype=np.float64)

    def mean_of_last(self, window: int, until: float = math.inf) -> float | None:
        values = self.values[self.steps <= until]
        return float(values[-window:].mean()) if len(values) else None


# ---------------------------------------------------------------------------------------------
# Trials
# ---------------------------------------------------------------------------------------------
@dataclass
class Setup:
    """What every trial of the study shares."""

    command: str
    env_ids: list[str]
    seeds: list[int]
    params: list[Param]
    window: int
    score_ranges: dict[str, list[float]]
    report_every: int
    log_dir: str
    total_steps: int | None  # each run's --total-timesteps (--command's or the script's default); None if tuned


@dataclass
class TrialRuns:
    trial: optuna.Trial
    command: str  # the script command with the trial's parameters, without --exp-name, --env-id, --seed
    runs: list[runner.Run]
    returns: list[Returns]
    total_steps: int | None  # the steps each run trains, where known: a report there is not for the pruner
    reported_step: int = 0
    last_read: float = field(default_factory=time.time)  # the first read --read-interval after the start


def objective_part(setup: Setup, env_id: str, value: float) -> float:
    if not setup.score_ranges:
        return value
    low, high = setup.score_ranges[env_id]
    return (value - low) / (high - low)


def seed_values(setup: Setup, trial_runs: TrialRuns, until: float = math.inf) -> list[float] | None:
    """Per seed, the mean over the env ids of each run's (normalized) mean return of its last --window
    games ended by step `until`; None while a run has finished no game by then."""
    per_seed = {}
    for run_returns, (env_id, seed) in zip(trial_runs.returns, runs_order(setup)):
        value = run_returns.mean_of_last(setup.window, until)
        if value is None:
            return None
        per_seed.setdefault(seed, []).append(objective_part(setup, env_id, value))
    return [float(np.mean(values)) for values in per_seed.values()]


def runs_order(setup: Setup) -> list[tuple[str, int]]:
    """(env id, seed) of each run of a trial, in run.py's order (env id, then seed)."""
    return [(env_id, seed) for env_id in setup.env_ids for seed in setup.seeds]


def trial_command(setup: Setup, trial: optuna.Trial) -> str:
    arguments = [argument for param in setup.params for argument in param.arguments(param.suggest(trial))]
    return f"{setup.command} {shlex.join(arguments)}".strip()


def ask(study: optuna.Study, storage) -> optuna.Trial:
    """A waiting trial (a retry, an --enqueue), else a new one, with its first heartbeat: a retry has its failed
    trial's attributes, in a journal its last heartbeat too, and would look dead to a tuner that looked in between."""
    trial = study.ask()
    if isinstance(storage, BaseHeartbeat):
        storage.record_heartbeat(trial._trial_id)  # Optuna keeps no public id; its own optimize() does the same
    return trial


def start_trial(study: optuna.Study, trial: optuna.Trial, setup: Setup, workers: int, display) -> TrialRuns:
    command = trial_command(setup, trial)
    exp_name = f"{study.study_name}-trial{trial.number}"
    runs = runner.make_runs([f"{command} --exp-name {exp_name}"], setup.env_ids, setup.seeds)
    trial.set_user_attr("command", command)
    trial.set_user_attr("logs", [os.path.join(setup.log_dir, f"{run.name}.log") for run in runs])
    trial.set_user_attr("host", runner.machine())
    retried = RetryHeartbeatStaleTrialCallback.retried_trial_number(study.get_trials(deepcopy=False)[trial.number])
    display.message(
        f"trial {trial.number} started{f' (a retry of trial {retried})' if retried is not None else ''}: {command}"
    )
    total_steps = trial.params.get("total-timesteps", setup.total_steps)
    trial_runs = TrialRuns(
        trial,
        command,
        runs,
        [Returns(env_id, exp_name, seed) for env_id, seed in runs_order(setup)],
        int(total_steps) if total_steps is not None else None,
    )
    held = runner.lock_runs(runs, setup.log_dir)
    if held:  # a trial number is new, so only a stray process of a killed tuner can hold it
        fail(f"trial {trial.number}'s runs are held by another process: {', '.join(held)}")
    for run in runs:
        if kept := keep_earlier_log(run, setup.log_dir):
            display.message(f"an earlier study's log of {run.name} is kept as {kept}")
    cores = cpu_count()
    for run in runs:
        runner.start(
            run, setup.log_dir, runner.threads_per_run(cores, workers * len(runs), run.processes), dies_with_runner=True
        )
        display.started(run)
    return trial_runs


def keep_earlier_log(run: runner.Run, log_dir: str) -> str | None:
    """Moves the log of an earlier study's run of this name (a study of the same name in another --storage,
    or deleted and made again) to LOG_DIR/{name}__{time of its last write}.log, and returns that path. A trial
    number runs once in a study, so a log already there is not this study's, and starting the run would
    overwrite it: that study's output, a failed trial's traceback."""
    path = os.path.join(log_dir, f"{run.name}.log")
    if not os.path.exists(path):
        return None
    kept = os.path.join(log_dir, f"{run.name}__{int(os.path.getmtime(path))}.log")
    os.replace(path, kept)
    return kept


def cpu_count() -> int:
    """The cores this tuner may use: a Slurm task's --cpus-per-task, else the CPUs it may run on."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    return int(slurm) if slurm.isdigit() else len(os.sched_getaffinity(0))


def report_progress(study: optuna.Study, setup: Setup, trial_runs: TrialRuns) -> bool:
    """Reports the objective at every --report-every step that all the trial's runs have passed;
    returns whether the pruner wants the trial stopped. Not asked at or past the runs' last step: they
    have trained their whole budget (what is left, a --save-model evaluation, is not for the pruner to
    cut), and the trial completes when they exit."""
    for run_returns in trial_runs.returns:
        run_returns.refresh()
    trial_runs.last_read = time.time()
    reached = min(run_returns.last_step for run_returns in trial_runs.returns)
    step = trial_runs.reported_step + setup.report_every
    prune = False
    while step <= reached:
        values = seed_values(setup, trial_runs, until=step)
        if values is not None:
            trial_runs.trial.report(float(np.mean(values)), step)
            trained = trial_runs.total_steps is not None and step >= trial_runs.total_steps
            prune = not trained and trial_runs.trial.should_prune()
        trial_runs.reported_step = step
        if prune:
            break
        step += setup.report_every
    return prune


def prune_trial(study: optuna.Study, trial_runs: TrialRuns, stop_timeout: float, display):
    step = trial_runs.reported_step
    running = [run for run in trial_runs.runs if run.state == "running"]
    display.message(f"trial {trial_runs.trial.number} pruned at step {step:,}: stopping its runs")
    if running:
        runner.stop(running, stop_timeout, display)
    for run, run_returns in zip(trial_runs.runs, trial_runs.returns):
        mark = f"pruned by benchmark/tune.py at step {step} (trial {trial_runs.trial.number} of {study.study_name})"
        with open(run.log_path, "a") as log:
            log.write(f"\n# {mark}\n")
        run_returns.refresh()
        if run_returns.directory:
            with open(os.path.join(run_returns.directory, "PRUNED"), "w") as marker:
                marker.write(mark + "\n")
        run.lock.close()
    study.tell(trial_runs.trial, state=TrialState.PRUNED)


def complete_trial(study: optuna.Study, setup: Setup, trial_runs: TrialRuns, display):
    trial = trial_runs.trial
    failed = [run for run in trial_runs.runs if run.returncode != 0]
    if failed:
        reason = ", ".join(f"{run.name} exited {run.returncode} (see {run.log_path})" for run in failed)
        trial.set_user_attr("error", reason)
        study.tell(trial, state=TrialState.FAIL)
        display.message(f"trial {trial.number} FAILED: {reason}")
        return
    for run_returns in trial_runs.returns:
        run_returns.refresh()
    values = seed_values(setup, trial_runs)
    if values is None:
        reason = "a run finished no game: raise --total-timesteps"
        trial.set_user_attr("error", reason)
        study.tell(trial, state=TrialState.FAIL)
        display.message(f"trial {trial.number} FAILED: {reason}")
        return
    trial.set_user_attr("seed_values", values)
    trial.set_user_attr("std", float(np.std(values)))
    trial.set_user_attr("run_dirs", [run_returns.directory for run_returns in trial_runs.returns])
    study.tell(trial, float(np.mean(values)))
    display.message(f"trial {trial.number} complete: {np.mean(values):.4g} ± {np.std(values):.2g} over seeds")


def interrupt_trials(study: optuna.Study, lock, active: list[TrialRuns], stop_timeout: float, display) -> list[str]:
    """Ctrl-C, SIGTERM: the runs stopped, each trial failed and queued again once, as for a dead tuner (a
    trial that is itself a retry is not queued again). Returns what became of each trial, for the message."""
    running = [run for trial_runs in active for run in trial_runs.runs if run.state == "running"]
    if running:
        runner.stop(running, stop_timeout, display)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the runs are gone: record the trials whole
        signal.signal(number, signal.SIG_IGN)
    retry, outcomes = RetryHeartbeatStaleTrialCallback(max_retry=MAX_RETRY), []
    for trial_runs in active:
        number = trial_runs.trial.number
        for run in trial_runs.runs:
            run.lock.close()
        with lock():  # the failure and the retry, written before another tuner counts (see work())
            if finished_elsewhere(study, trial_runs):
                outcomes.append(f"{number} (failed before by another tuner)")
                continue
            # no "error" attribute: the retry gets a copy of the trial's attributes, and neither counts as a failure
            failed = study.tell(trial_runs.trial, state=TrialState.FAIL)
            history = RetryHeartbeatStaleTrialCallback.retry_history(failed)
            retry(study, failed)  # queues it unless it was retried MAX_RETRY times already
        if len(history) < MAX_RETRY:
            outcomes.append(f"{number} (failed, and queued to run again)")
        else:
            outcomes.append(f"{number} (failed; a retry of trial {history[0]}, not queued again)")
    return outcomes


def finished_elsewhere(study: optuna.Study, trial_runs: TrialRuns) -> bool:
    """Whether another tuner has ended this tuner's trial: it found no heartbeat for longer than the grace
    period (this tuner stalled: a suspended machine, a storage out of reach) and failed it."""
    return study.get_trials(deepcopy=False)[trial_runs.trial.number].state != TrialState.RUNNING


def drop_trial(trial_runs: TrialRuns, stop_timeout: float, display):
    """A trial that another tuner has failed (and queued again): its runs are stopped, its result is not reported."""
    display.message(
        f"trial {trial_runs.trial.number} was failed by another tuner (no heartbeat within the grace "
        "period): stopping its runs; its retry runs as a trial of its own"
    )
    running = [run for run in trial_runs.runs if run.state == "running"]
    if running:
        runner.stop(running, stop_timeout, display)
    for run in trial_runs.runs:
        run.lock.close()


def counts(trials: list[optuna.trial.FrozenTrial]) -> dict[TrialState, int]:
    return {state: sum(trial.state == state for trial in trials) for state in TrialState}


def failures(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The trials that failed of themselves: a run exited non-zero or finished no game (their "error"
    attribute). Not those failed by an interrupt or a lost heartbeat: they say nothing of the command,
    and their retries are queued."""
    return sum(trial.state == TrialState.FAIL and "error" in trial.user_attrs for trial in trials)


def retries_waiting(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The retries queued and not started yet: each stands for a trial that was counted when it started, so a tuner
    with a free worker runs it, whatever the count of finished trials (study.ask() takes a waiting trial first)."""
    return sum(
        trial.state == TrialState.WAITING and RetryHeartbeatStaleTrialCallback.retried_trial_number(trial) is not None
        for trial in trials
    )


def retries_being_queued(trials: list[optuna.trial.FrozenTrial]) -> int:
    """The trials failed by an interrupt or a lost heartbeat whose retry is not in the study yet. The tuners write a
    failure and its retry under the tuners' lock, so a tuner that counts under it sees this only if the tuner that
    failed the trial died in between, or if a process other than a tuner failed it (it may be queueing the retry
    now). Each counts as running until its retry is there, or for RETRY_QUEUEING_S at most, so that no tuner starts
    a new trial in the retry's place (the study would reach --n-trials with the retry left waiting)."""
    retried = {number for trial in trials for number in RetryHeartbeatStaleTrialCallback.retry_history(trial)}
    now = datetime.datetime.now()
    return sum(
        trial.state == TrialState.FAIL
        and "error" not in trial.user_attrs
        and len(RetryHeartbeatStaleTrialCallback.retry_history(trial)) < MAX_RETRY
        and trial.number not in retried
        and trial.datetime_complete is not None
        and abs((now - trial.datetime_complete).total_seconds()) < RETRY_QUEUEING_S
        for trial in trials
    )


def work(study: optuna.Study, storage, lock, setup: Setup, cli) -> int:
    """Runs trials, --workers at a time, until the study has --n-trials finished ones and no retry waiting. lock:
    the tuners' lock on the study (tuners_lock())."""
    live_runs: list[runner.Run] = []
    display = runner.PlainDisplay(live_runs, cli.status_interval)
    active: list[TrialRuns] = []
    stop_signals = [
        number for number in (signal.SIGTERM, signal.SIGHUP) if signal.getsignal(number) is not signal.SIG_IGN
    ]
    # A stop (Ctrl-C, SIGTERM, SIGHUP) is acted on at the top of the loop, between two calls to the storage.
    # Raised where it came, it could break a database query half sent (a traceback, exit 1) or fall between a
    # trial's creation and its registration here, leaving the trial RUNNING. A second one stops at once.
    stop_requested = []

    def request_stop(number, frame):
        if stop_requested:
            raise KeyboardInterrupt()
        stop_requested.append(number)

    held = {number: signal.getsignal(number) for number in (signal.SIGINT, *stop_signals)}
    for number, handler in held.items():
        if handler is not signal.SIG_IGN:
            signal.signal(number, request_stop)

    def let_go(trial_runs: TrialRuns):
        active.remove(trial_runs)
        for run in trial_runs.runs:
            live_runs.remove(run)

    last_beat = last_count = 0.0
    try:
        while True:
            if stop_requested:
                raise runner.Interrupted()
            now = time.time()
            if now - last_beat >= cli.heartbeat_interval / 2:
                for trial_runs in list(active):
                    try:
                        storage.record_heartbeat(trial_runs.trial._trial_id)
                    except optuna.exceptions.UpdateFinishedTrialError:  # the journal's; an RDB storage takes it
                        if not finished_elsewhere(study, trial_runs):
                            raise
                        drop_trial(trial_runs, cli.stop_timeout, display)
                        let_go(trial_runs)
                with lock():  # a dead tuner's trial is failed and its retry queued before another tuner counts
                    optuna.storages.fail_stale_trials(study)
                last_beat = now
            if len(active) < cli.workers and now - last_count >= 1.0:
                last_count = now
                # From one reading of the trials to the new one's creation, under the lock: two tuners counting at
                # once each saw the last free place and started a trial in it, and a tuner whose ask() found the
                # retry it counted on taken by another got a new trial instead; the study then reached --n-trials
                # with a retry left waiting.
                with lock():
                    trials = study.get_trials(deepcopy=False)
                    number, failed, waiting = counts(trials), failures(trials), retries_waiting(trials)
                    finished = sum(number[state] for state in FINISHED)
                    failing = failed >= max(cli.n_trials, 3)  # a broken command: stop sampling
                    if finished >= cli.n_trials and not waiting and not active:
                        display.message(f"the study has {finished} finished trials (--n-trials {cli.n_trials})")
                        return 0
                    if failing and not active:
                        print(
                            f"error: {failed} trials of study {study.study_name} failed: read the logs "
                            "of the last ones (their error in python benchmark/tune.py --report ...)",
                            file=sys.stderr,
                            flush=True,
                        )
                        return 1
                    running = number[TrialState.RUNNING] + retries_being_queued(trials)
                    trial = None
                    if not failing and (finished + running < cli.n_trials or waiting):
                        trial = ask(study, storage)
                if trial is not None:
                    trial_runs = start_trial(study, trial, setup, cli.workers, display)
                    active.append(trial_runs)
                    live_runs.extend(trial_runs.runs)
                    last_count = 0.0  # another slot may be free: look again at once
                    continue
                # else: the other tuners' trials make up the rest; wait in case one of their tuners dies
            time.sleep(0.25)
            for trial_runs in list(active):
                for run in trial_runs.runs:
                    if run.state == "running":
                        runner.read_progress(run)
                        if run.process.poll() is not None:
                            runner.finish(run)
                            display.ended(run)
                done = all(run.state != "running" for run in trial_runs.runs)
                if done or time.time() - trial_runs.last_read >= cli.read_interval:
                    try:
                        prune = report_progress(study, setup, trial_runs)
                        if done:  # finished: complete (or failed), whatever its last report made the pruner think
                            complete_trial(study, setup, trial_runs, display)
                        elif prune:
                            prune_trial(study, trial_runs, cli.stop_timeout, display)
                        else:
                            continue
                    except (optuna.exceptions.UpdateFinishedTrialError, ValueError):
                        if not finished_elsewhere(study, trial_runs):
                            raise
                        drop_trial(trial_runs, cli.stop_timeout, display)
                    let_go(trial_runs)
            display.update()
    except (KeyboardInterrupt, runner.Interrupted):
        # While the runs stop, a second SIGTERM or SIGHUP kills them at once, as a second Ctrl-C does (at their
        # default, it would kill the tuner and leave the runs running).
        for number in stop_signals:
            signal.signal(number, runner.raise_keyboard_interrupt)
        stopped = ", ".join(interrupt_trials(study, lock, active, cli.stop_timeout, display)) or "none"
        print(
            f"error: interrupted: stopped trial(s) {stopped}",
            file=sys.stderr,
            flush=True,
        )
        return 130
    finally:  # the report after the trials stops at Ctrl-C as usual
        for number, handler in held.items():
            signal.signal(number, handler)


# ---------------------------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------------------------
def params_text(trial) -> str:
    return ", ".join(
        f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}" for name, value in trial.params.items()
    )


def objective_text(definition: dict) -> str:
    """What the objective is, in words, from the study's definition."""
    ranges = definition.get("score_ranges") or {}
    normalized = ", ".join(f"{env}: [{low:g}, {high:g}]" for env, (low, high) in ranges.items())
    return (
        f"Objective: the mean over seeds {definition.get('seeds')} of each run's mean return of its last "
        f"{definition.get('window')} games"
        + (f", normalized per env id by {normalized}" if ranges else "")
        + f", on {', '.join(definition.get('env_ids', []))}."
    )


def results(study: optuna.Study, top: int, out_dir: str) -> str:
    """The table of the best trials and the command that reproduces the best one (markdown), and
    Optuna's figures as PNG in out_dir."""
    definition = study.user_attrs
    number = counts(study.get_trials(deepcopy=False))
    lines = [
        f"# Study {study.study_name}",
        "",
        f"{number[TrialState.COMPLETE]} complete, {number[TrialState.PRUNED]} pruned, "
        f"{number[TrialState.FAIL]} failed, {number[TrialState.RUNNING]} running trial(s). "
        + objective_text(definition),
        "",
    ]
    complete = sorted(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)), key=lambda t: -t.value)
    if not complete:
        lines.append("No complete trial yet.")
        return "\n".join(lines) + "\n"
    names = list(dict.fromkeys(name for trial in complete for name in trial.params))
    lines += [
        "| trial | objective (mean ± std over seeds) | " + " | ".join(names) + " |",
        "|---|---|" + "---|" * len(names),
    ]
    for trial in complete[:top]:
        cells = [
            f"{trial.params[name]:.4g}"
            if isinstance(trial.params.get(name), float)
            else str(trial.params.get(name, "-"))
            for name in names
        ]
        lines.append(
            f"| {trial.number} | {trial.value:.4g} ± {trial.user_attrs.get('std', math.nan):.2g} | "
            + " | ".join(cells)
            + " |"
        )
    best = complete[0]
    seeds = " ".join(map(str, definition.get("seeds", [])))
    env_ids = " ".join(map(shlex.quote, definition.get("env_ids", [])))
    lines += [
        "",
        f"The best, trial {best.number} ({params_text(best)}), on every env id and seed of the study:",
        "",
        "```bash",
        f"python benchmark/run.py --env-ids {env_ids} --seeds {seeds} --command "
        f"{shlex.quote(best.user_attrs['command'])}",
        "```",
    ]
    lines += write_figures(study, out_dir)
    return "\n".join(lines) + "\n"


def write_figures(study: optuna.Study, out_dir: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as figures

    written, skipped = [], []
    for name, plot in [
        ("optimization_history", figures.plot_optimization_history),
        # PED-ANOVA, Optuna 5's default, named: Optuna 4's default (fANOVA) needs scikit-learn
        (
            "param_importances",
            lambda study: figures.plot_param_importances(study, evaluator=PedAnovaImportanceEvaluator()),
        ),
        ("parallel_coordinate", figures.plot_parallel_coordinate),
        ("intermediate_values", figures.plot_intermediate_values),
    ]:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                axes = plot(study)
            figure = (axes.flat[0] if isinstance(axes, np.ndarray) else axes).figure
            figure.set_size_inches(10, 6)
            figure.tight_layout()
            os.makedirs(out_dir, exist_ok=True)
            figure.savefig(os.path.join(out_dir, f"{name}.png"), dpi=100)
            plt.close(figure)
            written.append(f"{name}.png")
        except Exception as error:  # noqa: BLE001 (too few trials for a figure: say so, draw the others)
            skipped.append(f"{name} ({type(error).__name__}: {' '.join(str(error).split())[:100]})")
            plt.close("all")
    lines = ["", f"Figures in {out_dir}/: {', '.join(written) or 'none'}."]
    if skipped:
        lines.append(f"Not drawn: {'; '.join(skipped)}.")
    return lines


def report(study: optuna.Study, cli) -> None:
    out_dir = os.path.join(cli.out_dir, study.study_name)
    text = results(study, cli.top, out_dir)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.md"), "w") as f:
        f.write(text)
    print(text, end="", flush=True)
    print(
        f"(also in {os.path.join(out_dir, 'results.md')}; watch the study live with: "
        f"optuna-dashboard {shlex.quote(dashboard_storage(cli.storage))})",
        flush=True,
    )


def dashboard_storage(url: str) -> str:
    return journal_path(url) if is_journal(url) else url


# ---------------------------------------------------------------------------------------------
# Fan-out: a Slurm array job, an AWS Batch array job
# ---------------------------------------------------------------------------------------------
WORKER_OPTIONS = [
    "command",
    "env_ids",
    "seeds",
    "param",
    "n_trials",
    "workers",
    "window",
    "score_range",
    "report_every",
    "sampler",
    "seed",
    "pruner",
    "pruner_startup_trials",
    "pruner_warmup_steps",
    "enqueue",
    "log_dir",
    "out_dir",
    "top",
    "status_interval",
    "stop_timeout",
    "heartbeat_interval",
    "read_interval",
]


def worker_arguments(cli, parser) -> list[str]:
    """The command line of one tuner of the study, from this one's options (the fan-out's left out)."""
    flags = {action.dest: action for action in parser._actions}
    arguments = ["--study-name", cli.study_name, "--storage", cli.storage]
    for dest in WORKER_OPTIONS:
        value, action = getattr(cli, dest), flags[dest]
        if value is None or value == action.default or value is False:
            continue
        flag = action.option_strings[0]
        if value is True:
            arguments.append(flag)
        elif isinstance(action, (argparse._AppendAction, argparse._ExtendAction)):  # --param, --enqueue: repeated
            for item in value:
                arguments += [flag, *(item if isinstance(item, list) else [str(item)])]
        elif isinstance(value, list):
            arguments += [flag, *map(str, value)]
        else:
            arguments += [flag, str(value)]
    return arguments


def submit_slurm(cli, parser) -> int:
    """benchmark/slurm_template.sh (run.py's) with one tuner per array task."""
    worker = shlex.join([sys.executable, os.path.join(BENCHMARK_DIR, "tune.py"), *worker_arguments(cli, parser)])
    runs = [
        runner.Run(name=f"{cli.study_name}-tuner{task}", command=worker, processes=1) for task in range(cli.array_tasks)
    ]
    slurm = types.SimpleNamespace(
        job_name=cli.job_name or f"tune-{cli.study_name}",
        workers=None,
        partition=cli.partition,
        gpus=cli.gpus,
        cpus_per_task=cli.cpus_per_task,
        time=cli.time,
        mem=cli.mem,
        dry_run=cli.dry_run,
    )
    return runner.submit_slurm(runs, slurm, cli.log_dir)


def submit_aws_batch(cli, parser) -> int:
    """One AWS Batch array job whose child jobs are tuners of the study (cloud/'s job queue and
    definition; the command relative to the image's /app, the storage a database server)."""
    sys.path.insert(0, os.path.join(REPO_ROOT, "cloud"))
    import json

    from batch import aws_errors, batch_client, require_job_queue
    from submit import require_job_definition, validate_requests

    worker = ["python", "benchmark/tune.py", *worker_arguments(cli, parser)]
    request = {
        "jobName": f"tune-{cli.study_name}".replace(".", "-")[:128],
        "jobQueue": cli.job_queue,
        "jobDefinition": cli.job_definition,
        "parameters": {"envId": cli.env_ids[0]},
        "containerOverrides": {"command": worker},
        "tags": {"cleanrl:study": cli.study_name},
        "propagateTags": True,
    }
    if cli.array_tasks > 1:  # Batch's arrays have 2 to 10,000 children
        request["arrayProperties"] = {"size": cli.array_tasks}
    resources = [
        {"type": kind, "value": str(value)}
        for kind, value in (("VCPU", cli.cpus_per_task), ("GPU", cli.gpus or None))
        if value
    ]
    request["containerOverrides"]["resourceRequirements"] = resources
    validate_requests([request])
    if cli.dry_run:
        print(json.dumps(request))
        print(f"dry run: an array job of {cli.array_tasks} tuner(s) of study {cli.study_name}, nothing submitted")
        return 0
    client = batch_client(cli.endpoint_url)
    require_job_queue(client, cli.job_queue)
    require_job_definition(client, cli.job_definition)
    with aws_errors():
        response = client.submit_job(**request)
    print(
        f"submitted {response['jobName']} {response['jobId']}: {cli.array_tasks} tuner(s) of study "
        f"{cli.study_name} in {cli.job_queue}",
        flush=True,
    )
    return 0


# ---------------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------------
class Parser(argparse.ArgumentParser):
    def error(self, message):
        fail(f"{message} (see --help)")


def make_parser() -> Parser:
    parser = Parser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    study = parser.add_argument_group("the study")
    study.add_argument(
        "--command",
        help="the script command without --env-id, --seed and --exp-name (the tuner sets "
        'them), e.g. "python cleanrl/ppo.py --total-timesteps 100000"',
    )
    study.add_argument("--env-ids", nargs="+", help="env ids each trial runs on (the objective averages over them)")
    study.add_argument("--seeds", type=int, nargs="+", default=[1], help="seeds each trial runs (default: 1)")
    study.add_argument(
        "--param",
        action="extend",
        nargs="+",
        default=[],
        metavar="NAME=KIND:RANGE",
        help="a flag of the script to tune: NAME=float:LOW:HIGH[:STEP], NAME=log:LOW:HIGH, "
        "NAME=int:LOW:HIGH[:STEP] or NAME=choice:A,B,C (repeat, or give several)",
    )
    study.add_argument(
        "--n-trials",
        type=int,
        default=20,
        help="finished (complete or pruned) trials the study should have (default: 20)",
    )
    study.add_argument("--study-name", help="the study's name (default: SCRIPT-ENV_ID, e.g. ppo-CartPole-v1)")
    study.add_argument(
        "--storage",
        default="sqlite:///tune/optuna.db",
        help="where the study lives: an Optuna storage URL (sqlite:///FILE, postgresql://USER:PASSWORD"
        "@HOST/DB, ...) or a journal file (journal:PATH) on a shared filesystem (default: "
        "sqlite:///tune/optuna.db)",
    )
    study.add_argument(
        "--enqueue",
        action="append",
        nargs="+",
        metavar="NAME=VALUE",
        help="a trial to run first, with these values (the others sampled); repeat for more",
    )
    objective = parser.add_argument_group("the objective")
    objective.add_argument(
        "--window",
        type=int,
        default=100,
        help="the objective takes each run's mean return of its last WINDOW games (default: 100)",
    )
    objective.add_argument(
        "--score-range",
        nargs="+",
        default=[],
        metavar="ENV_ID=LOW:HIGH",
        help="normalize ENV_ID's returns to (return - LOW) / (HIGH - LOW) before averaging over env "
        "ids; needed with several env ids but for Atari games (random and human scores)",
    )
    objective.add_argument(
        "--report-every",
        type=int,
        help="env steps between the intermediate values reported to the pruner (default: a tenth "
        "of the command's --total-timesteps, or of the script's default)",
    )
    search = parser.add_argument_group("search and pruning")
    search.add_argument(
        "--sampler",
        choices=["tpe", "random"],
        default="tpe",
        help="Optuna's sampler: tpe (TPESampler with constant liar for parallel trials) or random",
    )
    search.add_argument("--seed", type=int, help="the sampler's seed (each Slurm array task adds its index)")
    search.add_argument(
        "--pruner",
        choices=["median", "halving", "none"],
        default="median",
        help="median (MedianPruner), halving (SuccessiveHalvingPruner) or none (default: median)",
    )
    search.add_argument(
        "--pruner-startup-trials", type=int, default=5, help="median: complete trials before any is pruned (default: 5)"
    )
    search.add_argument(
        "--pruner-warmup-steps",
        type=int,
        default=0,
        help="median: env steps of a trial before it may be pruned; halving: its first rung "
        "(default: 0; halving: Optuna's automatic choice)",
    )
    local = parser.add_argument_group("the tuner")
    local.add_argument("--workers", type=int, default=1, help="trials at the same time on this machine (default: 1)")
    local.add_argument("--log-dir", default="logs", help="where each run's output goes, as {name}.log (default: logs)")
    local.add_argument("--out-dir", default="tune", help="the results go to OUT_DIR/{study}/ (default: tune)")
    local.add_argument("--top", type=int, default=10, help="trials in the results table (default: 10)")
    local.add_argument(
        "--report", action="store_true", help="print the study's results, write its figures; run nothing"
    )
    local.add_argument(
        "--status-interval",
        type=float,
        default=60.0,
        help="seconds between progress lines of the running runs (default: 60)",
    )
    local.add_argument(
        "--stop-timeout",
        type=float,
        default=30.0,
        help="seconds a stopped run (pruned, Ctrl-C) gets to exit before it is killed (default: 30)",
    )
    local.add_argument(
        "--heartbeat-interval",
        type=int,
        default=60,
        help="seconds between a running trial's heartbeats; a trial without one for twice as long "
        "is failed and retried once (default: 60)",
    )
    local.add_argument(
        "--read-interval",
        type=float,
        default=5.0,
        help="seconds between reads of a running trial's TensorBoard events (default: 5)",
    )
    fan_out = parser.add_argument_group("fan-out: --slurm or --aws-batch, ARRAY_TASKS tuners of one study")
    fan_out.add_argument(
        "--slurm",
        action="store_true",
        help="submit an sbatch array job of tuners (sbatch on PATH), else write and print it",
    )
    fan_out.add_argument("--aws-batch", action="store_true", help="submit an AWS Batch array job of tuners (cloud/)")
    fan_out.add_argument("--array-tasks", type=int, default=2, help="tuners in the array job (default: 2)")
    fan_out.add_argument("--dry-run", action="store_true", help="print the job and submit nothing")
    fan_out.add_argument("--job-name", help="Slurm: the job name, also its script's file name (default: tune-STUDY)")
    fan_out.add_argument("--partition", help="Slurm: the partition (default: the cluster's)")
    fan_out.add_argument(
        "--cpus-per-task", type=int, default=8, help="cores per tuner (Slurm; Batch vCPUs) (default: 8)"
    )
    fan_out.add_argument("--gpus", type=int, default=0, help="GPUs per tuner (default: 0)")
    fan_out.add_argument("--time", default="24:00:00", help="Slurm: time limit per tuner (default: 24:00:00)")
    fan_out.add_argument("--mem", default="32G", help="Slurm: memory per tuner (default: 32G)")
    fan_out.add_argument("--job-queue", default="cleanrl-queue", help="Batch: the job queue (default: cleanrl-queue)")
    fan_out.add_argument(
        "--job-definition", default="cleanrl-ppo", help="Batch: the job definition (default: cleanrl-ppo)"
    )
    fan_out.add_argument("--endpoint-url", help="Batch: the endpoint, e.g. a local test server (default: AWS's)")
    return parser


def check_cli(cli):
    for name in ("n_trials", "workers", "window", "top", "array_tasks", "heartbeat_interval", "cpus_per_task"):
        if getattr(cli, name) < 1:
            fail(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("pruner_startup_trials", "pruner_warmup_steps", "gpus"):
        if getattr(cli, name) < 0:
            fail(f"--{name.replace('_', '-')} must be at least 0")
    if cli.report_every is not None and cli.report_every < 1:
        fail("--report-every must be at least 1")
    if cli.status_interval <= 0 or cli.stop_timeout < 0 or cli.read_interval <= 0:
        fail("--status-interval and --read-interval must be positive, --stop-timeout at least 0")
    if cli.slurm and cli.aws_batch:
        fail("--slurm and --aws-batch: choose one")
    if cli.study_name is not None and not STUDY_NAME.match(cli.study_name):
        fail(f"--study-name {cli.study_name!r}: use letters, digits, '.', '-' and single '_' (no '__')")
    if cli.slurm and not is_journal(cli.storage) and cli.storage.startswith("sqlite"):
        fail(
            "--slurm: the array's tuners share the study through --storage, and SQLite does not lock reliably on a "
            "shared filesystem: give --storage journal:PATH (on the shared filesystem) or a database server's URL"
        )
    if cli.aws_batch and (is_journal(cli.storage) or cli.storage.startswith("sqlite")):
        fail(
            "--aws-batch: the jobs share the study through --storage, which must be a database server they reach, "
            "e.g. --storage postgresql://USER:PASSWORD@HOST/DB"
        )


def total_timesteps(tokens: list[str], flags: dict[str, Flag]) -> int | None:
    value = runner.option_value(tokens, "--total-timesteps", "--total_timesteps")
    if value is None and "total-timesteps" in flags:
        value = flags["total-timesteps"].default
    try:
        return int(float(value)) if value is not None else None
    except ValueError:
        return None


def make_sampler(cli):
    seed = cli.seed
    if seed is not None and os.environ.get("SLURM_ARRAY_TASK_ID", "").isdigit():
        seed += int(os.environ["SLURM_ARRAY_TASK_ID"])  # tuners with one seed would sample the same trials
    if seed is not None and os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "").isdigit():
        seed += int(os.environ["AWS_BATCH_JOB_ARRAY_INDEX"])
    if cli.sampler == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, constant_liar=True)


def make_pruner(cli):
    if cli.pruner == "none":
        return optuna.pruners.NopPruner()
    if cli.pruner == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(min_resource=cli.pruner_warmup_steps or "auto")
    return optuna.pruners.MedianPruner(
        n_startup_trials=cli.pruner_startup_trials, n_warmup_steps=cli.pruner_warmup_steps
    )


def enqueued_trials(cli, params: list[Param]) -> list[dict]:
    """--enqueue: the values of each trial to run first, checked against the --param ranges before the
    study is touched."""
    by_name, trials = {param.name: param for param in params}, []
    for values in cli.enqueue or []:
        fixed = {}
        for text in values:
            name, _, value = text.partition("=")
            name = name.lstrip("-").replace("_", "-")
            if name not in by_name or not value:
                fail(f"--enqueue {text!r}: use NAME=VALUE with NAME one of the --param names ({', '.join(by_name)})")
            param = by_name[name]
            fixed[name] = (
                choice_value(value, param.flag_kind, name)
                if param.kind == "choice"
                else number(value, f"--enqueue {text!r}")
            )
            if param.kind == "choice" and fixed[name] not in param.choices:
                fail(f"--enqueue {text!r}: {value} is not one of the choices of --param {name}")
            if param.kind != "choice" and not param.low <= fixed[name] <= param.high:
                fail(f"--enqueue {text!r}: {value} is outside the range of --param {name}")
            integer = param.kind == "int" or (param.kind == "log" and param.flag_kind == "int")
            if integer and not fixed[name].is_integer():
                fail(f"--enqueue {text!r}: --param {name} takes whole numbers")
            # On the grid LOW, LOW + STEP, ... that Optuna samples: it would run a value off it, and warn only
            if param.step is not None and not on_grid(fixed[name], param.low, param.step):
                grid = f"{param.low:g} + k x {param.step:g}"
                fail(f"--enqueue {text!r}: {value} is not on the grid of --param {name} ({grid})")
            if integer:
                fixed[name] = int(fixed[name])
        trials.append(fixed)
    return trials


def enqueue(study: optuna.Study, trials: list[dict]):
    """Queues the --enqueue trials once (a study continued with the same command does not queue them again)."""
    if not trials or study.user_attrs.get("enqueued"):
        return
    for values in trials:
        study.enqueue_trial(values, skip_if_exists=True)
    study.set_user_attr("enqueued", True)


def on_grid(value: float, low: float, step: float) -> bool:
    """Whether value is LOW + k x STEP, within the rounding that Optuna's float grid allows."""
    k = (value - low) / step
    return abs(k - round(k)) < 1e-8


def load_study(cli, storage, definition: dict | None, lock=contextlib.nullcontext):
    """The named study: created with its definition, or continued when the definition is the same. lock: the
    tuners' lock on the study (tuners_lock()), under which the definition is read and written: a tuner that read
    it while another wrote its parts one by one found one part missing, and stopped."""
    try:
        study = optuna.create_study(
            study_name=cli.study_name,
            storage=storage,
            sampler=make_sampler(cli),
            pruner=make_pruner(cli),
            direction="maximize",
            load_if_exists=True,
        )
    except Exception as error:  # noqa: BLE001 (the storage refused: a server gone, a file unreadable)
        fail(
            f"cannot open study {cli.study_name} in {shown(cli.storage)}: {type(error).__name__}: "
            f"{' '.join(str(error).split())[:200]}"
        )
    if study.direction != optuna.study.StudyDirection.MAXIMIZE:
        fail(f"study {cli.study_name} in {shown(cli.storage)} minimizes: it is not a study of this tuner")
    if definition is None:
        return study
    with lock():
        existing = {name: study.user_attrs.get(name) for name in DEFINITION}
        if all(value is None for value in existing.values()):
            for name, value in definition.items():
                study.set_user_attr(name, value)
    if not all(value is None for value in existing.values()):
        differ = [name for name in DEFINITION if existing[name] != definition[name]]
        if differ:
            name = differ[0]
            fail(
                f"study {cli.study_name} was made with another {name.replace('_', ' ')} ({existing[name]!r}, now "
                f"{definition[name]!r}): give this search its own --study-name"
            )
    return study


def main():
    parser = make_parser()
    cli = parser.parse_args()
    check_cli(cli)
    if cli.report:
        if cli.study_name is None:
            fail("--report needs --study-name (and the --storage of the study)")
        storage = open_storage(cli.storage, cli.heartbeat_interval)
        if cli.study_name not in optuna.get_all_study_names(storage):
            fail(f"no study {cli.study_name} in {shown(cli.storage)}")
        report(load_study(cli, storage, None), cli)
        return
    if not cli.command or not cli.env_ids:
        fail("--command and --env-ids are required (or --report with --study-name)")
    if not cli.param:
        fail("no --param: name at least one flag of the script to tune, e.g. --param learning-rate=log:1e-5:1e-3")
    try:
        tokens = shlex.split(cli.command)
    except ValueError as error:
        fail(f"cannot parse --command {cli.command!r}: {error}")
    script = tokens[script_of(tokens)]
    for name in SET_BY_THE_TUNER:
        if runner.option_value(tokens, f"--{name}") is not None or f"--{name}" in tokens:
            fail(f"--command sets --{name}: the tuner sets it for each run of each trial; remove it")
    params = [parse_param(text) for text in cli.param]
    score_ranges = parse_score_ranges(cli.score_range, cli.env_ids)
    if len(set(cli.seeds)) != len(cli.seeds) or len(set(cli.env_ids)) != len(cli.env_ids):
        fail("--seeds and --env-ids must not repeat a value")
    stem = os.path.splitext(os.path.basename(script))[0]
    cli.study_name = cli.study_name or re.sub(r"[^A-Za-z0-9.-]+", "-", f"{stem}-{cli.env_ids[0]}")
    if is_journal(cli.storage):
        cli.storage = "journal:" + journal_path(cli.storage)  # the same file for tuners started elsewhere
    elif cli.storage.startswith("sqlite:///") and not cli.storage.startswith("sqlite:////"):
        cli.storage = "sqlite:///" + os.path.abspath(cli.storage[len("sqlite:///") :])
    storage = open_storage(cli.storage, cli.heartbeat_interval)
    flags = script_flags(tokens)
    check_params(params, flags, tokens, script)
    tuned = {param.name for param in params}
    total = total_timesteps(tokens, flags) if "total-timesteps" not in tuned else None  # else each trial's own
    if cli.report_every is None:
        if total is None:
            fail("give --report-every STEPS: the tuner cannot read the runs' --total-timesteps")
        cli.report_every = max(1, total // 10)
    queued = enqueued_trials(cli, params)
    definition = {
        "command": cli.command,
        "env_ids": cli.env_ids,
        "seeds": cli.seeds,
        "window": cli.window,
        "score_ranges": score_ranges,
    }
    lock = tuners_lock(cli.storage, storage, cli.study_name)
    study = load_study(cli, storage, definition, lock)
    with lock():  # tuners started at once queue the --enqueue trials once
        enqueue(study, queued)
    if cli.slurm:
        sys.exit(submit_slurm(cli, parser))
    if cli.aws_batch:
        sys.exit(submit_aws_batch(cli, parser))
    print(
        f"study {cli.study_name} in {shown(cli.storage)}: {cli.n_trials} trials, {cli.workers} at a time, "
        f"{len(cli.env_ids) * len(cli.seeds)} run(s) each; watch it with: optuna-dashboard "
        f"{shlex.quote(dashboard_storage(cli.storage))}",
        flush=True,
    )
    setup = Setup(
        cli.command, cli.env_ids, cli.seeds, params, cli.window, score_ranges, cli.report_every, cli.log_dir, total
    )
    status = work(study, storage, lock, setup, cli)
    if status == 0:
        report(study, cli)
    sys.exit(status)


if __name__ == "__main__":
    main()
