"""Figures and tables from local runs: TensorBoard event files in, PNGs and markdown out, no account.

    python benchmark/plot.py learning                      # runs/ -> plots/
    python benchmark/plot.py learning --runs-dir benchmark/results/runs --out-dir docs/img/breakout_1m
    python benchmark/plot.py throughput throughput.json    # a `benchmark/throughput.py --json` result
    python benchmark/plot.py allreduce allreduce.json [allreduce_hosts.json]  # `benchmark/allreduce.py --json`

learning: reads every `RUNS_DIR/*/events.out.tfevents*`, takes each run's env id, exp_name (the
script) and seed from its hyperparameters text, else from its directory name
`{env_id}__{exp_name}__{seed}__{timestamp}`, and groups the runs by env id and script. It writes
  returns_vs_steps.png, returns_vs_time.png: one panel per env id, one line per script: the mean
      over seeds of each run's running mean of its last --window episodic returns, against the
      global step and against the wall-clock time since the run started (for a resumed run, the
      time it ran: the pauses between its attempts left out), with a band of +- one
      standard deviation over seeds (with one seed, no band);
  results.md: per env id and script, the final return (each run's mean of its last --window
      episodic returns; the mean and the standard deviation of those over the seeds) and the median
      over the seeds of each run's steady SPS (the median of its per-iteration SPS, computed from
      the steps and wall times of consecutive charts/SPS events, so start-up does not count);
      for a run resumed from checkpoints, also a row per part (event file): when it started, its
      steps, those redone by the next part, its wall hours and its steady SPS; with --every, each
      run's mean return of its last --window games at every --every steps, and per --every steps
      the mean of each training-health scalar it logged (learning rate or epsilon, entropy, approx
      KL, clip fraction, explained variance, value loss, TD loss, Q-values) and its longest game;
  with 3 or more Atari games that every script ran: aggregate.png (human-normalized IQM, median and
      mean of the finished runs with 95% stratified-bootstrap confidence intervals, rliable) and
      performance_profile.png (the fraction of runs above each human-normalized score), and their
      table in results.md. Normalization: (score - random) / (human - random), with the scores of
      REFERENCE_SCORES below.
A run directory without events, or that names no env id, script and seed, is skipped with a
one-line warning.

allreduce: the time of one gradient average against the number of processes, ring against central, and
their ratio beside the ratio of the busiest process's bytes, from one or more `benchmark/allreduce.py
--json` results: over loopback, and (--hosts) over hosts' links, a series per link rate.

throughput: a bar chart of the steady SPS of each configuration (a script, and the scheme it ran
under: the torchrun script with 1 process and with 2, each --env-split; the JAX script on 1 or more
XLA devices), fp32 and bf16 side by side, with the env-only limit of each script's environment
(random actions, measured by the same run) drawn as a line over its bars.
"""

import argparse
import glob
import itertools
import json
import logging
import math
import os
import re
import sys
import time
import warnings
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")  # files only: no display needed (Slurm, CI, ssh)
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader  # noqa: E402

# Random and human scores of the Atari-57 games (no-op starts, episodes capped at 108,000 frames):
# the random and human columns of the score table in Badia et al. 2020, "Agent57: Outperforming the
# Atari Human Benchmark" (arXiv:2003.13350), appendix; the random scores are those of Mnih et al.
# 2015 (the DQN Nature paper), the human scores those of the later DQN papers. {game: (random, human)}
REFERENCE_SCORES = {
    "Alien": (227.8, 7127.7),
    "Amidar": (5.8, 1719.5),
    "Assault": (222.4, 742.0),
    "Asterix": (210.0, 8503.3),
    "Asteroids": (719.1, 47388.7),
    "Atlantis": (12850.0, 29028.1),
    "BankHeist": (14.2, 753.1),
    "BattleZone": (2360.0, 37187.5),
    "BeamRider": (363.9, 16926.5),
    "Berzerk": (123.7, 2630.4),
    "Bowling": (23.1, 160.7),
    "Boxing": (0.1, 12.1),
    "Breakout": (1.7, 30.5),
    "Centipede": (2090.9, 12017.0),
    "ChopperCommand": (811.0, 7387.8),
    "CrazyClimber": (10780.5, 35829.4),
    "Defender": (2874.5, 18688.9),
    "DemonAttack": (152.1, 1971.0),
    "DoubleDunk": (-18.6, -16.4),
    "Enduro": (0.0, 860.5),
    "FishingDerby": (-91.7, -38.7),
    "Freeway": (0.0, 29.6),
    "Frostbite": (65.2, 4334.7),
    "Gopher": (257.6, 2412.5),
    "Gravitar": (173.0, 3351.4),
    "Hero": (1027.0, 30826.4),
    "IceHockey": (-11.2, 0.9),
    "Jamesbond": (29.0, 302.8),
    "Kangaroo": (52.0, 3035.0),
    "Krull": (1598.0, 2665.5),
    "KungFuMaster": (258.5, 22736.3),
    "MontezumaRevenge": (0.0, 4753.3),
    "MsPacman": (307.3, 6951.6),
    "NameThisGame": (2292.3, 8049.0),
    "Phoenix": (761.4, 7242.6),
    "Pitfall": (-229.4, 6463.7),
    "Pong": (-20.7, 14.6),
    "PrivateEye": (24.9, 69571.3),
    "Qbert": (163.9, 13455.0),
    "Riverraid": (1338.5, 17118.0),
    "RoadRunner": (11.5, 7845.0),
    "Robotank": (2.2, 11.9),
    "Seaquest": (68.4, 42054.7),
    "Skiing": (-17098.1, -4336.9),
    "Solaris": (1236.3, 12326.7),
    "SpaceInvaders": (148.0, 1668.7),
    "StarGunner": (664.0, 10250.0),
    "Surround": (-10.0, 6.5),
    "Tennis": (-23.8, -8.3),
    "TimePilot": (3568.0, 5229.2),
    "Tutankham": (11.4, 167.6),
    "UpNDown": (533.4, 11693.2),
    "Venture": (0.0, 1187.5),
    "VideoPinball": (16256.9, 17667.9),
    "WizardOfWor": (563.5, 4756.5),
    "YarsRevenge": (3092.9, 54576.9),
    "Zaxxon": (32.5, 9173.3),
}
# A resumed run's later event file starts with a purge_step: TensorBoard's reader drops what the
# cut-off attempt logged past its checkpoint, as intended, but warns of "a TensorFlow restart" for
# each tag. read_run says it in one line instead; the reader's other warnings (a truncated file) stay.
logging.getLogger("tensorboard").addFilter(lambda record: "Purging expired events" not in record.getMessage())
# The training-health scalars tabulated per interval (--every), as the scripts log them: {tag: column}.
HEALTH_TAGS = {
    "charts/learning_rate": "learning rate",
    "charts/epsilon": "epsilon",
    "losses/entropy": "entropy",
    "losses/approx_kl": "approx KL",
    "losses/clipfrac": "clip fraction",
    "losses/explained_variance": "explained variance",
    "losses/value_loss": "value loss",
    "losses/td_loss": "TD loss",
    "losses/q_values": "Q-values",
}
RUN_DIR_NAME = re.compile(r"^(?P<env_id>.+?)__(?P<exp_name>.+)__(?P<seed>-?\d+)__(?P<timestamp>\d+)$")


def warn(message: str):
    print(f"warning: {message}", file=sys.stderr, flush=True)


def fail(message: str):
    sys.exit(f"error: {message}")


# ---------------------------------------------------------------------------------------------
# Reading runs
# ---------------------------------------------------------------------------------------------
@dataclass
class Run:
    path: str
    env_id: str
    exp_name: str
    seed: int
    episode_steps: np.ndarray  # global step at which each game ended
    episode_seconds: np.ndarray  # wall-clock seconds since the run started, the pauses of a resumed run left out
    returns: np.ndarray
    sps_steps: np.ndarray  # the steps and wall times of the charts/SPS events (one per iteration)
    sps_times: np.ndarray
    total_steps: float = math.nan  # the run's --total-timesteps, from its hyperparameters text (nan if none)
    lengths: np.ndarray | None = None  # each game's length (charts/episodic_length), None if not logged
    health: dict = field(default_factory=dict)  # {tag: (steps, values)} of the HEALTH_TAGS the run logged


def hyperparameters(accumulator: EventAccumulator) -> dict[str, str]:
    """The `|param|value|` table the scripts log as text at the start of a run."""
    tag = "hyperparameters/text_summary"
    if tag not in accumulator.Tags().get("tensors", []):
        return {}
    text = accumulator.Tensors(tag)[0].tensor_proto.string_val[0].decode()
    rows = (line.strip().strip("|").split("|") for line in text.splitlines())
    return {row[0]: row[1] for row in rows if len(row) == 2}


def identify(path: str, accumulator: EventAccumulator) -> tuple[str, str, int] | None:
    """(env_id, exp_name, seed): from the hyperparameters text (which keeps the env id's '/'), else
    from the directory name."""
    params = hyperparameters(accumulator)
    if {"env_id", "exp_name", "seed"} <= params.keys() and re.fullmatch(r"-?\d+", params["seed"]):
        return params["env_id"], params["exp_name"], int(params["seed"])
    if match := RUN_DIR_NAME.match(os.path.basename(os.path.normpath(path))):
        return match["env_id"], match["exp_name"], int(match["seed"])
    return None


def read_run(path: str) -> Run | None:
    """The run in `path`, or None (after a one-line warning) when it cannot be used."""
    if not os.path.isdir(path):
        return warn(f"skipping {path}: not a run directory")
    event_files = glob.glob(os.path.join(path, "events.out.tfevents*"))
    if not event_files:
        return warn(f"skipping {path}: no events.out.tfevents file")
    try:
        accumulator = EventAccumulator(path, size_guidance={"scalars": 0, "tensors": 0})
        accumulator.Reload()
        started = accumulator.FirstEventTimestamp()
    except Exception as error:  # one unreadable run must not stop the figures of the others
        return warn(f"skipping {path}: unreadable events ({type(error).__name__}: {error})")
    identity = identify(path, accumulator)
    if identity is None:
        return warn(
            f"skipping {path}: unknown layout (neither a hyperparameters text with env_id, exp_name and "
            "seed nor a directory name {env_id}__{exp_name}__{seed}__{timestamp})"
        )
    scalars = accumulator.Tags()["scalars"]
    if "charts/episodic_return" not in scalars:
        return warn(f"skipping {path}: no charts/episodic_return (no game finished)")
    episodes = accumulator.Scalars("charts/episodic_return")
    if len(event_files) > 1:  # each file after the first is an attempt resumed from a checkpoint
        print(
            f"note: {path}: resumed {len(event_files) - 1} time(s); what an attempt logged past the checkpoint it was "
            "resumed from is left out",
            file=sys.stderr,
            flush=True,
        )
    sps = accumulator.Scalars("charts/SPS") if "charts/SPS" in scalars else []
    total_steps = hyperparameters(accumulator).get("total_timesteps", "")
    lengths = accumulator.Scalars("charts/episodic_length") if "charts/episodic_length" in scalars else []
    health = {}
    for tag in (tag for tag in HEALTH_TAGS if tag in scalars):
        events = accumulator.Scalars(tag)
        health[tag] = (np.array([e.step for e in events], dtype=np.float64), np.array([e.value for e in events]))
    return Run(
        path,
        *identity,
        episode_steps=np.array([e.step for e in episodes], dtype=np.float64),
        episode_seconds=running_seconds(
            path, np.array([e.wall_time for e in episodes]), started, np.array([e.wall_time for e in [*episodes, *sps]])
        ),
        returns=np.array([e.value for e in episodes], dtype=np.float64),
        sps_steps=np.array([e.step for e in sps], dtype=np.float64),
        sps_times=np.array([e.wall_time for e in sps]),
        total_steps=float(total_steps) if re.fullmatch(r"\d+", total_steps) else math.nan,
        lengths=np.array([e.value for e in lengths]) if len(lengths) == len(episodes) else None,
        health=health,
    )


def first_scalar_time(events_file: str) -> float | None:
    for event in EventFileLoader(events_file).Load():  # the loader gives scalars as the scalars plugin's tensors
        if any(value.metadata.plugin_data.plugin_name == "scalars" for value in event.summary.value):
            return event.wall_time
    return None


def running_seconds(path: str, times: np.ndarray, started: float, kept_times: np.ndarray) -> np.ndarray:
    """Seconds since the run started at each of `times`, less the pauses of a resumed run: each
    event file after the first is an attempt that went on from a checkpoint, and the time between
    the last event kept before its first one and that first one (the machine away, the steps
    redone after the checkpoint, hidden by the purge) is not time the run spent training. After a
    part that died before its next checkpoint, all of it redone and purged, the pause is measured
    from where that part began: the time from the last kept event to there was taken off with that
    part already, and taking it off again made the time go backwards."""
    seconds = times - started
    # The parts in the order they ran (the file names' time stamps have whole seconds only).
    files = glob.glob(os.path.join(path, "events.out.tfevents*"))
    resumes = sorted(t for t in map(first_scalar_time, files) if t is not None)
    for previous, resumed_at in zip(resumes, resumes[1:]):
        earlier = kept_times[kept_times < resumed_at]
        if len(earlier):
            seconds[times >= resumed_at] -= resumed_at - max(earlier.max(), previous)
    return seconds


def last_step(run: Run) -> float:
    return max(run.episode_steps.max(initial=0.0), run.sps_steps.max(initial=0.0))


def read_runs(runs_dir: str) -> list[Run]:
    runs = [read_run(path) for path in sorted(glob.glob(os.path.join(runs_dir, "*")))]
    # A seed counted twice would narrow the band and bias the mean: of two runs of one seed (an
    # attempt cut off and restarted, a run repeated by hand), the one that got further is kept.
    kept = {}
    for run in (run for run in runs if run is not None):
        key = (run.env_id, run.exp_name, run.seed)
        if key in kept:
            shorter, further = sorted((kept[key], run), key=last_step)
            warn(
                f"skipping {shorter.path}: seed {run.seed} of {run.exp_name} on {run.env_id} again, and "
                f"{further.path} got further"
            )
            run = further
        kept[key] = run
    return list(kept.values())


def unfinished(run: Run) -> bool:
    """Whether the run stopped short of its --total-timesteps (still running, or cut off): its last
    iteration ends within 1% of the total (the iterations need not divide it)."""
    return last_step(run) < 0.99 * run.total_steps  # False when the total is unknown (nan)


def group(runs: list[Run]) -> dict[tuple[str, str], list[Run]]:
    """{(env_id, exp_name): runs sorted by seed}, env ids and scripts in sorted order."""
    groups = {}
    for run in sorted(runs, key=lambda run: (run.env_id, run.exp_name, run.seed)):
        groups.setdefault((run.env_id, run.exp_name), []).append(run)
    return groups


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------
def final_return(run: Run, window: int) -> float:
    return float(np.mean(run.returns[-window:]))


def steady_sps(run: Run) -> float:
    """The median of the run's per-iteration SPS (steps over wall time between consecutive
    charts/SPS events): start-up, compilation and a pause for a restart do not count."""
    return median_rate(run.sps_steps, run.sps_times)


def median_rate(steps: np.ndarray, times: np.ndarray) -> float:
    rates = np.diff(steps) / np.diff(times)
    rates = rates[np.isfinite(rates) & (rates > 0)]
    return float(np.median(rates)) if rates.size else math.nan


def running_mean(values: np.ndarray, window: int) -> np.ndarray:
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts


def seed_curve(runs: list[Run], x_of, window: int, points: int = 200):
    """The runs' running-mean curves on a common grid (where every run has data): grid, mean, std."""
    xs = [x_of(run) for run in runs]
    ys = [running_mean(run.returns, window) for run in runs]
    grid = np.linspace(max(x[0] for x in xs), min(x[-1] for x in xs), points)
    curves = np.array([np.interp(grid, x, y) for x, y in zip(xs, ys)])
    return grid, curves.mean(axis=0), curves.std(axis=0)


def game_of(env_id: str) -> str | None:
    """The Atari game an env id names (BreakoutNoFrameskip-v4, ALE/Breakout-v5, Breakout-v5 -> Breakout),
    if it is one of REFERENCE_SCORES."""
    name = re.sub(r"(NoFrameskip|Deterministic)?-v\d+$", "", env_id.split("/")[-1]).lower()
    return next((game for game in REFERENCE_SCORES if game.lower() == name), None)


def human_normalized(score: float, game: str) -> float:
    random_score, human_score = REFERENCE_SCORES[game]
    return (score - random_score) / (human_score - random_score)


# ---------------------------------------------------------------------------------------------
# Learning figures and tables
# ---------------------------------------------------------------------------------------------
def script_colors(scripts) -> dict[str, tuple]:
    palette = plt.get_cmap("tab10")
    return {script: palette(i % 10) for i, script in enumerate(sorted(set(scripts)))}


def plot_returns(runs: list[Run], axis: str, window: int, references=()) -> plt.Figure:
    """One panel per env id, one line per script: the mean over seeds (band: +- std over seeds).
    references: (label, return) pairs drawn as dashed horizontal lines on every panel."""
    groups = group(runs)
    env_ids = sorted({env_id for env_id, _ in groups})
    colors = script_colors(script for _, script in groups)
    if axis == "steps":
        x_of, xlabel, scale = (lambda run: run.episode_steps), "environment steps", 1.0
    else:
        longest = max(run.episode_seconds[-1] for run in runs)
        unit, scale = ("hours", 3600.0) if longest > 2 * 3600 else ("minutes", 60.0)
        x_of, xlabel = (lambda run: run.episode_seconds / scale), f"wall-clock time ({unit})"
    columns = min(3, len(env_ids))
    rows = math.ceil(len(env_ids) / columns)
    figure, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 3.8 * rows), squeeze=False)
    for ax in axes.flat[len(env_ids) :]:
        figure.delaxes(ax)
    for ax, env_id in zip(axes.flat, env_ids):
        for (group_env, script), members in groups.items():
            if group_env != env_id:
                continue
            # The mean runs over the finished seeds, as far as they all got; a seed still running (or cut off)
            # beside them gets a dashed line of its own instead of cutting the mean short.
            finished = [run for run in members if not unfinished(run)]
            running = [run for run in members if unfinished(run)] if finished else []
            seed_runs = finished or members
            grid, mean, std = seed_curve(seed_runs, x_of, window)
            seeds = f"{len(seed_runs)} seed{'s' if len(seed_runs) > 1 else ''}"
            ax.plot(grid, mean, color=colors[script], label=f"{script} ({seeds})")
            if len(seed_runs) > 1:
                ax.fill_between(grid, mean - std, mean + std, color=colors[script], alpha=0.2, linewidth=0)
            for run in running:
                label = f"{script} seed {run.seed} (unfinished)"
                ax.plot(x_of(run), running_mean(run.returns, window), color=colors[script], linestyle="--", label=label)
        for (label, value), style in zip(references, ["--", ":", "-."] * len(references)):
            ax.axhline(value, color="black", linestyle=style, linewidth=1, label=label)
        ax.set_title(env_id)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"episodic return (last {window})")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    figure.tight_layout()
    return figure


def format_mean_std(values: list[float]) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def results_table(runs: list[Run], window: int) -> str:
    lines = [
        f"| env id | script | seeds | final return (mean ± std over seeds of each run's last-{window} mean) "
        "| median steady SPS |",
        "|---|---|---|---|---|",
    ]
    for (env_id, script), members in group(runs).items():
        # A run short of its total steps (running, or cut off) does not enter the finished seeds' mean: it
        # gets a row of its own, marked, with the step its return is at.
        finished = [run for run in members if not unfinished(run)]
        rows = [(script, ", ".join(str(run.seed) for run in finished), finished)] if finished else []
        for run in filter(unfinished, members):
            at = f"step {last_step(run):,.0f} of {run.total_steps:,.0f}"
            warn(f"{run.path} stopped at {at}: its final return is there")
            rows.append((f"{script} (unfinished)", f"{run.seed} (at {at})", [run]))
        for label, seeds, seed_runs in rows:
            finals = [final_return(run, window) for run in seed_runs]
            sps = [s for s in map(steady_sps, seed_runs) if not math.isnan(s)]
            median = f"{np.median(sps):,.0f}" if sps else "-"
            lines.append(f"| {env_id} | {label} | {seeds} | {format_mean_std(finals)} | {median} |")
    return "\n".join(lines) + "\n"


def milestones_table(runs: list[Run], window: int, every: int) -> str:
    """Each run's mean return of its last `window` games at every `every` steps (the games logged by then)."""
    lines = [
        f"| env id | script | seed | steps | mean return of the last {window} games | games |",
        "|---|---|---|---|---|---|",
    ]
    for (env_id, script), members in group(runs).items():
        for run in members:
            for milestone in range(every, int(last_step(run)) + 1, every):
                played = run.returns[run.episode_steps <= milestone]
                if played.size:
                    mean = np.mean(played[-window:])
                    lines.append(f"| {env_id} | {script} | {run.seed} | {milestone:,} | {mean:.2f} | {played.size:,} |")
    return "\n".join(lines) + "\n"


def health_table(runs: list[Run], every: int) -> str:
    """Per script, each run's mean of every logged training-health scalar (HEALTH_TAGS) over each interval
    of `every` steps, and the longest game that ended in it (a game at the time limit shows here)."""
    sections = []
    for (env_id, script), members in group(runs).items():
        tags = [tag for tag in HEALTH_TAGS if any(tag in run.health for run in members)]
        with_lengths = any(run.lengths is not None for run in members)
        if not tags and not with_lengths:
            continue
        columns = ["seed", "steps", *(HEALTH_TAGS[tag] for tag in tags)] + ["longest game"] * with_lengths
        lines = [f"{env_id}, {script}:\n", "| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
        for run in members:
            for start in range(0, int(last_step(run)), every):
                cells = [str(run.seed), f"{start:,}-{start + every:,}"]
                for tag in tags:
                    steps, values = run.health.get(tag, (np.array([]), np.array([])))
                    inside = values[(steps > start) & (steps <= start + every)]
                    cells.append(f"{np.mean(inside):.3g}" if inside.size else "-")
                if with_lengths:
                    ended = (run.episode_steps > start) & (run.episode_steps <= start + every)
                    longest = run.lengths[ended] if run.lengths is not None else np.array([])
                    cells.append(f"{longest.max():,.0f}" if longest.size else "-")
                lines.append("| " + " | ".join(cells) + " |")
        sections.append("\n".join(lines) + "\n")
    return "\n".join(sections)


def comparison_table(runs: list[Run], window: int, base: str, other: str) -> str:
    """Per env id that both scripts ran: OTHER's final return minus BASE's, with the 95% confidence
    interval of Welch's t over the seeds (unequal variances; with a handful of seeds a bootstrap would
    give too narrow an interval), also in percent of BASE's mean when that is positive ("-" otherwise:
    against a mean of 0 or below a percentage has no meaning, its sign and its interval come out reversed)."""
    lines = [
        f"| env id | {base} | {other} | {other} - {base} | 95% CI | in % of {base} | 95% CI in % |",
        "|---|---|---|---|---|---|---|",
    ]
    for run in filter(unfinished, runs):
        warn(f"--compare: {run.path} has not reached its total steps; left out")
    groups = group([run for run in runs if not unfinished(run)])
    for env_id in dict.fromkeys(env_id for env_id, _ in groups):
        finals = [[final_return(run, window) for run in groups.get((env_id, script), [])] for script in (base, other)]
        if min(map(len, finals)) < 2:
            warn(f"--compare: {env_id} needs 2 or more seeds of both {base} and {other}; left out")
            continue
        difference = np.mean(finals[1]) - np.mean(finals[0])
        low, high = scipy.stats.ttest_ind(finals[1], finals[0], equal_var=False).confidence_interval(0.95)
        interval = f"[{low:+.2f}, {high:+.2f}]"
        relative = "- | -"
        if np.mean(finals[0]) > 0:
            percent = 100 / np.mean(finals[0])
            relative = f"{difference * percent:+.1f}% | [{low * percent:+.1f}%, {high * percent:+.1f}%]"
        lines.append(
            f"| {env_id} | {format_mean_std(finals[0])} | {format_mean_std(finals[1])} | {difference:+.2f} "
            f"| {interval} | {relative} |"
        )
    return "\n".join(lines) + "\n"


@dataclass
class Part:
    """One part of a resumed run: an event file, from the checkpoint it resumed from to where it stopped."""

    created: float  # the wall time of the file's first event: the order the parts ran in
    started: float  # the wall time of its first scalar (of the file's creation if it logged none)
    resumed_from: float  # the step of the checkpoint it went on from (0 for the first part)
    sps_steps: np.ndarray
    sps_times: np.ndarray


def read_part(events_file: str) -> Part:
    # A resumed part's SummaryWriter starts with a purge_step, logged as a SessionLog START at the
    # checkpoint's step + 1.
    created, started, resumed_from, points = None, None, 0.0, []
    for event in EventFileLoader(events_file).Load():
        created = event.wall_time if created is None else created
        if started is None and event.summary.value:
            started = event.wall_time
        if event.HasField("session_log") and event.session_log.status == event.session_log.START:
            resumed_from = float(event.step - 1)
        if any(value.tag == "charts/SPS" for value in event.summary.value):
            points.append((event.step, event.wall_time))
    steps, times = np.array(points, dtype=np.float64).reshape(-1, 2).T
    return Part(created or 0.0, started or created or 0.0, resumed_from, steps, times)


def parts_table(runs: list[Run]) -> str:
    """Each resumed run's parts, an event file each, in the order they ran: when it started, the steps
    from the checkpoint it resumed from to its last, those redone by the next part (which resumed from an
    older checkpoint), its wall hours and its steady SPS. Runs that never resumed have no rows."""
    lines = [
        "| env id | script | seed | part | started (UTC) | steps | redone by the next part | wall hours "
        "| median steady SPS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (env_id, script), members in group(runs).items():
        for run in members:
            files = glob.glob(os.path.join(run.path, "events.out.tfevents*"))
            if len(files) < 2:
                continue
            parts = sorted(map(read_part, files), key=lambda part: part.created)
            for k, part in enumerate(parts):
                last = part.sps_steps[-1] if part.sps_steps.size else part.resumed_from
                redone = max(0.0, last - parts[k + 1].resumed_from) if k + 1 < len(parts) else 0.0
                hours, sps = "-", "-"
                if part.sps_steps.size >= 2:
                    hours = f"{(part.sps_times[-1] - part.sps_times[0]) / 3600:.2f}"
                    sps = f"{median_rate(part.sps_steps, part.sps_times):,.0f}"
                started = time.strftime("%Y-%m-%d %H:%M", time.gmtime(part.started))
                steps = f"{part.resumed_from:,.0f} -> {last:,.0f}"
                cells = [env_id, script, run.seed, k + 1, started, steps, f"{redone:,.0f}", hours, sps]
                lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n" if len(lines) > 2 else ""


def normalized_scores(runs: list[Run], window: int) -> tuple[dict[str, np.ndarray], list[str]] | None:
    """{script: (runs, games) human-normalized final returns} on the games every script ran, or None
    when those are fewer than 3. Every script gets the same number of runs per game (the first seeds).
    Finished runs only, as in the results table and --compare: a run cut off early would count its
    early return as a final one."""
    per_game = {}  # script -> game -> final returns
    for (env_id, script), members in group([run for run in runs if not unfinished(run)]).items():
        if (game := game_of(env_id)) is not None:
            per_game.setdefault(script, {}).setdefault(game, []).extend(final_return(run, window) for run in members)
    if not per_game:
        return None
    games = sorted(set.intersection(*(set(games) for games in per_game.values())))
    if len(games) < 3:
        return None
    count = min(len(per_game[script][game]) for script in per_game for game in games)
    if any(len(per_game[script][game]) > count for script in per_game for game in games):
        warn(f"the aggregate uses the first {count} seed(s) of each script on each game (the fewest any has)")
    scores = {
        script: np.array([[human_normalized(per_game[script][game][i], game) for game in games] for i in range(count)])
        for script in sorted(per_game)
    }
    return scores, games


def aggregate(scores: dict[str, np.ndarray], games: list[str], reps: int):
    """rliable's interval estimates of the IQM, median and mean, and the performance profiles:
    (table, interval figure, profile figure)."""
    from rliable import library as rly
    from rliable import metrics, plot_utils

    metric_names = ["IQM", "Median", "Mean"]
    measure = lambda x: np.array([metrics.aggregate_iqm(x), metrics.aggregate_median(x), metrics.aggregate_mean(x)])
    with warnings.catch_warnings():  # rliable 1.2 still seeds arch's bootstrap the way arch 7 deprecates
        warnings.filterwarnings("ignore", "random_state is deprecated", FutureWarning)
        points, intervals = rly.get_interval_estimates(
            scores, measure, reps=reps, random_state=np.random.RandomState(0)
        )
    scripts = sorted(scores)
    lines = [
        f"Human-normalized final return over {len(games)} games ({', '.join(games)}), "
        f"{next(iter(scores.values())).shape[0]} run(s) per game, 95% stratified-bootstrap confidence intervals "
        f"({reps} resamples):",
        "",
        "| script | IQM | median | mean |",
        "|---|---|---|---|",
    ]
    for script in scripts:
        cells = [
            f"{points[script][i]:.3f} [{intervals[script][0, i]:.3f}, {intervals[script][1, i]:.3f}]"
            for i in range(len(metric_names))
        ]
        lines.append(f"| {script} | {' | '.join(cells)} |")
    colors = script_colors(scripts)
    interval_figure, _ = plot_utils.plot_interval_estimates(
        points,
        intervals,
        metric_names=metric_names,
        algorithms=scripts,
        colors=colors,
        xlabel="human-normalized score",
        subfigure_width=3.4,
        row_height=0.6,
        xlabel_y_coordinate=-0.35,
        max_ticks=3,
    )
    highest = max(float(np.max(s)) for s in scores.values())
    taus = np.linspace(min(0.0, min(float(np.min(s)) for s in scores.values())), max(1.0, highest) * 1.05, 101)
    np.random.seed(0)  # create_performance_profile takes no random state: the same figure every time
    profiles, profile_intervals = rly.create_performance_profile(scores, taus, reps=reps)
    profile_figure, ax = plt.subplots(figsize=(6, 4))
    ax.set_title(f"performance profile over {len(games)} games", fontsize="medium")
    plot_utils.plot_performance_profiles(
        profiles,
        taus,
        performance_profile_cis=profile_intervals,
        colors=colors,
        ax=ax,
        xlabel=r"human-normalized score $\tau$",
        ylabel=r"fraction of runs with score $> \tau$",
    )
    ax.legend([plt.Line2D([], [], color=colors[s]) for s in scripts], scripts, fontsize="small")
    return "\n".join(lines) + "\n", interval_figure, profile_figure


def save(figure: plt.Figure, path: str):
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
    print(f"wrote {path}")


def parse_reference(text: str) -> tuple[str, float]:
    label, _, value = text.rpartition("=")
    try:
        return label.strip(), float(value)
    except ValueError:
        fail(f"--reference {text!r}: expected LABEL=RETURN, e.g. 'CleanRL, 10M steps=414.66'")


def learning(cli):
    if not os.path.isdir(cli.runs_dir):
        fail(f"no folder {cli.runs_dir}: give the folder the scripts wrote their runs to with --runs-dir")
    runs = read_runs(cli.runs_dir)
    if not runs:
        fail(f"no usable run in {cli.runs_dir} (see the warnings above)")
    os.makedirs(cli.out_dir, exist_ok=True)
    references = [parse_reference(text) for text in cli.reference]
    save(plot_returns(runs, "steps", cli.window, references), os.path.join(cli.out_dir, "returns_vs_steps.png"))
    save(plot_returns(runs, "time", cli.window, references), os.path.join(cli.out_dir, "returns_vs_time.png"))
    report = "## Final return and speed\n\n" + results_table(runs, cli.window)
    if cli.every:
        report += f"\n## Along the way, every {cli.every:,} steps\n\n" + milestones_table(runs, cli.window, cli.every)
        if health := health_table(runs, cli.every):
            report += f"\n## Training health, mean over every {cli.every:,} steps\n\n" + health
    if parts := parts_table(runs):
        report += "\n## Parts of resumed runs\n\n" + parts
    if cli.compare:
        base, other = cli.compare
        report += f"\n## {other} against {base}\n\n" + comparison_table(runs, cli.window, base, other)
    normalized = normalized_scores(runs, cli.window)
    if normalized is None:
        print("aggregate figures left out: they need 3 or more Atari games that every script ran")
    else:
        table, interval_figure, profile_figure = aggregate(*normalized, reps=cli.reps)
        save(interval_figure, os.path.join(cli.out_dir, "aggregate.png"))
        save(profile_figure, os.path.join(cli.out_dir, "performance_profile.png"))
        report += "\n## Aggregate over games\n\n" + table
    path = os.path.join(cli.out_dir, "results.md")
    with open(path, "w") as f:
        f.write(report)
    print(f"wrote {path}\n\n{report}", end="")


# ---------------------------------------------------------------------------------------------
# Throughput figure
# ---------------------------------------------------------------------------------------------
def read_throughput(path: str) -> dict:
    try:
        with open(path) as f:
            results = json.load(f)
        rows = results["rows"]
        assert rows and all(
            {"script", "processes", "precision", "steady_sps", "env_only_sps"} <= row.keys() for row in rows
        )
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as error:
        fail(
            f"{path} is not a `benchmark/throughput.py --json` result ({type(error).__name__}); write one with "
            "python benchmark/throughput.py --json FILE"
        )
    return results


def throughput_configuration(row: dict) -> tuple:
    """(script, processes, env split, XLA devices) of a row. A file written before the schemes has no env
    split and no device count: its torchrun script ran with the even split, its JAX script on one device."""
    script = row["script"]
    env_split = row.get("env_split", "even" if script == "ppo_atari_multigpu" else None)
    xla_devices = row.get("xla_devices", 1 if script == "ppo_atari_envpool_xla_jax_scan" else None)
    return script, row["processes"], env_split, xla_devices


def throughput_label(configuration: tuple) -> str:
    script, processes, env_split, xla_devices = configuration
    if env_split is not None:  # the torchrun script
        return f"{script}\n1 process" if processes == 1 else f"{script}\n{processes} processes, {env_split} split"
    if xla_devices is not None:
        return f"{script}\n{xla_devices} XLA device{'s' if xla_devices > 1 else ''}"
    return script


def plot_throughput(results: dict) -> plt.Figure:
    """Grouped bars: one group per configuration (a script and its scheme), one bar per precision; a black
    line over a group marks its environment's env-only limit. A measurement that failed has no bar."""
    rows = results["rows"]
    configurations = list(dict.fromkeys(throughput_configuration(row) for row in rows))
    precisions = list(dict.fromkeys(row["precision"] for row in rows))
    width = 0.8 / len(precisions)
    figure, ax = plt.subplots(figsize=(2.1 * len(configurations) + 2, 4.4))
    palette = {"fp32": "tab:blue", "bf16": "tab:orange"}
    measured = lambda value: value if value is not None and math.isfinite(value) else 0.0
    for p, precision in enumerate(precisions):
        heights = [
            measured(
                next(
                    (
                        row["steady_sps"]
                        for row in rows
                        if throughput_configuration(row) == c and row["precision"] == precision
                    ),
                    None,
                )
            )
            for c in configurations
        ]
        positions = np.arange(len(configurations)) - 0.4 + width * (p + 0.5)
        bars = ax.bar(positions, heights, width, label=f"{precision} (steady SPS)", color=palette.get(precision))
        ax.bar_label(bars, labels=[f"{h:.0f}" if h else "" for h in heights], fontsize="small")
    env_label = "env-only limit (random actions)"
    for i, configuration in enumerate(configurations):
        limits = [row["env_only_sps"] for row in rows if throughput_configuration(row) == configuration]
        if limits and limits[0]:
            ax.hlines(limits[0], i - 0.45, i + 0.45, colors="black", linewidth=2, label=env_label)
            env_label = None  # one legend entry for all the lines
    ax.set_xticks(range(len(configurations)))
    ax.set_xticklabels([throughput_label(c) for c in configurations], fontsize="small")
    ax.set_ylabel("environment steps per second")
    setup = results.get("setup", {})
    title = [
        setup.get("env_id"),
        f"{setup.get('num_envs')} envs x {setup.get('num_steps')} steps per process",
        f"{setup.get('cpus')} CPUs" + (f": {setup['cpu']}" if setup.get("cpu") else ""),
        setup.get("date"),
    ]
    ax.set_title(", ".join(str(part) for part in title if part and "None" not in str(part)), fontsize="medium")
    ax.legend(fontsize="small")
    ax.grid(axis="y", alpha=0.3)
    figure.tight_layout()
    return figure


def throughput(cli):
    os.makedirs(cli.out_dir, exist_ok=True)
    save(plot_throughput(read_throughput(cli.results)), os.path.join(cli.out_dir, "throughput.png"))


# ---------------------------------------------------------------------------------------------
# Gradient averaging against the number of processes (benchmark/allreduce.py)
# ---------------------------------------------------------------------------------------------
def read_allreduce(path: str) -> list[dict]:
    """The series of a result: one (every count over loopback), or one per link rate (--hosts). Each series
    has its label and the result's setup beside its rows, central_over_ring and central_60_percent_more_at."""
    try:
        with open(path) as f:
            results = json.load(f)
        networks = results["networks"] if "networks" in results else [results]
        series = []
        for network in networks:
            rows, ratios = network["rows"], network["central_over_ring"]
            assert rows and all(
                {"processes", "scheme", "median_ms", "busiest_sent_bytes"} <= row.keys() for row in rows
            )
            assert all({"processes", "time_ratio", "bytes_ratio"} <= point.keys() for point in ratios)
            assert "central_60_percent_more_at" in network
            label = "loopback" if "networks" not in results else f"hosts, {network['rate'] or 'no cap'}"
            series.append({**network, "label": label, "setup": results.get("setup", {})})
    except (OSError, ValueError, KeyError, TypeError, AssertionError) as error:
        fail(
            f"{path} is not a `benchmark/allreduce.py --json` result ({type(error).__name__}); write one with "
            "python benchmark/allreduce.py --json FILE"
        )
    return series


def plot_allreduce(all_series: list[dict]) -> plt.Figure:
    """Left: the median time of one average per scheme against the process count, one line per scheme and
    network (loopback, or hosts with capped links). Right: central / ring, the measured time of each network
    and the busiest process's bytes (computed: N / 2; measured on the hosts' links), with the line where the
    central scheme costs 60% more than the ring and the count where each measured time ratio reaches it."""
    figure, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {"ring": "tab:blue", "central": "tab:red"}
    styles = ["o-", "s--", "^:", "D-."]
    all_rows = [row for series in all_series for row in series["rows"]]
    for style, series in zip(itertools.cycle(styles), all_series):
        rows = series["rows"]
        for scheme in dict.fromkeys(row["scheme"] for row in rows):
            points = sorted(
                (row["processes"], row["median_ms"], row["busiest_sent_bytes"])
                for row in rows
                if row["scheme"] == scheme
            )
            counts, times, _ = zip(*points)
            label = scheme if len(all_series) == 1 else f"{scheme}, {series['label']}"
            left.plot(counts, times, style, color=colors.get(scheme), label=label)
            if len(all_series) == 1:  # one network: each point's time and bytes written beside it
                for n, t, b in points:
                    left.annotate(
                        f"{t:.1f} ms\n{b / 1e6:.1f} MB",
                        (n, t),
                        textcoords="offset points",
                        xytext=(4, -22) if scheme == "ring" else (-8, 6),
                        ha="left" if scheme == "ring" else "right",
                        fontsize="x-small",
                        color=colors.get(scheme),
                    )
    if len(all_series) == 1:
        top = max(row["median_ms"] for row in all_rows)
        left.set_ylim(-0.15 * top, 1.2 * top)  # room for the labels above and below the points
        left.set_title("time; MB each way of the busiest process (computed)", fontsize="medium")
    else:  # milliseconds over loopback to seconds on a slow link
        left.set_yscale("log")
        left.set_title("time of one average", fontsize="medium")
    left.set_xlim(min(r["processes"] for r in all_rows) / 1.35, max(r["processes"] for r in all_rows) * 1.35)
    left.set_ylabel("median time of one average (ms)")

    counts = sorted({row["processes"] for row in all_rows})
    computed = sorted({(p["processes"], p["bytes_ratio"]) for s in all_series for p in s["central_over_ring"]})
    right.plot(*zip(*computed), "s--", color="gray", label="busiest process's bytes (computed: N / 2)")
    crossings = 0  # the labels of the counts where a time ratio reaches 1.6, stacked
    for style, series in zip(itertools.cycle(styles), all_series):
        ratios = sorted(
            (p["processes"], p["time_ratio"], p.get("measured_bytes_ratio")) for p in series["central_over_ring"]
        )
        label = "time (measured)" if len(all_series) == 1 else f"time, {series['label']}"
        right.plot([n for n, _, _ in ratios], [r for _, r, _ in ratios], style, color="black", label=label)
        measured = [(n, b) for n, _, b in ratios if b is not None]
        if measured:
            right.plot(*zip(*measured), "x", color="gray", markersize=8)
        at = series["central_60_percent_more_at"]
        if at is not None:
            right.axvline(at, color="tab:orange", linestyle=":", linewidth=1.5)
            right.annotate(
                f"{series['label']}: {at:.1f}" if len(all_series) > 1 else f"measured: {at:.1f} processes",
                (at, 1.6),
                textcoords="offset points",
                xytext=(5, -14 - 12 * crossings),
                fontsize="small",
                color="tab:orange",
            )
            crossings += 1
    if any(p.get("measured_bytes_ratio") is not None for s in all_series for p in s["central_over_ring"]):
        right.plot([], [], "x", color="gray", markersize=8, label="busiest host's bytes (measured on its link)")
    right.axhline(1.6, color="tab:orange", linewidth=1.5, label="central costs 60% more than ring (1.6)")
    right.set_ylabel("central / ring")
    right.set_title("central scheme over ring", fontsize="medium")
    right.set_xlim(left.get_xlim())
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(counts, [str(n) for n in counts])
        ax.minorticks_off()
        ax.set_xlabel("processes")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small" if len(all_series) > 1 else "small")
    setups = list({json.dumps(s["setup"], sort_keys=True): s["setup"] for s in all_series}.values())
    first = setups[0]
    title = [", ".join(str(p) for p in (f"{first.get('numel', 0):,} fp32 parameters", first.get("backend")) if p)]
    for setup in setups:  # where and on what each result was measured
        machine = f"{setup.get('cpus')} CPUs ({setup.get('cpu')})" if setup.get("cpus") else None
        parts = [setup.get("transport"), machine, setup.get("gpu"), setup.get("date")]
        title.append(", ".join(str(part) for part in parts if part))
    figure.suptitle("\n".join(title) + "\nthe traffic pattern of a cluster, not a cluster", fontsize="medium")
    figure.tight_layout()
    return figure


def allreduce(cli):
    os.makedirs(cli.out_dir, exist_ok=True)
    series = [one for path in cli.results for one in read_allreduce(path)]
    save(plot_allreduce(series), os.path.join(cli.out_dir, "allreduce.png"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="figure", required=True)
    runs = commands.add_parser("learning", help="learning curves and the results table from TensorBoard runs")
    runs.add_argument("--runs-dir", default="runs", help="the folder holding the run directories (default: runs)")
    runs.add_argument("--out-dir", default="plots", help="where the PNGs and results.md go (default: plots)")
    runs.add_argument("--window", type=int, default=100, help="episodes in each run's final mean (default 100)")
    runs.add_argument("--reps", type=int, default=50000, help="bootstrap resamples of the aggregate (default 50000)")
    runs.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="LABEL=RETURN",
        help="a published result drawn as a dashed line on every panel (repeatable)",
    )
    runs.add_argument(
        "--every",
        type=int,
        default=0,
        metavar="STEPS",
        help="also tabulate each run's last-window mean at every STEPS steps, and its training-health means and "
        "longest game over each STEPS steps (default: off)",
    )
    runs.add_argument(
        "--compare",
        nargs=2,
        metavar=("BASE", "OTHER"),
        help="also tabulate OTHER's final return minus BASE's (two scripts' exp_names) with a 95%% confidence "
        "interval, and in percent of BASE's mean where that is positive",
    )
    speed = commands.add_parser("throughput", help="the bar chart of a `benchmark/throughput.py --json` result")
    speed.add_argument("results", help="the JSON file written by benchmark/throughput.py --json")
    speed.add_argument("--out-dir", default="plots", help="where throughput.png goes (default: plots)")
    averaging = commands.add_parser("allreduce", help="the figure of `benchmark/allreduce.py --json` results")
    averaging.add_argument(
        "results", nargs="+", help="JSON files written by benchmark/allreduce.py --json (loopback, --hosts)"
    )
    averaging.add_argument("--out-dir", default="plots", help="where allreduce.png goes (default: plots)")
    cli = parser.parse_args()
    if cli.figure == "allreduce":
        allreduce(cli)
    elif cli.figure == "learning":
        if cli.window < 1 or cli.reps < 1 or cli.every < 0:
            fail("--window and --reps must be positive, --every 0 or positive")
        learning(cli)
    else:
        throughput(cli)


if __name__ == "__main__":
    main()
