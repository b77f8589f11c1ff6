"""benchmark/plot.py on small TensorBoard runs written here with known values: two scripts, three
Atari games, two seeds each; every run's last 100 games and its iteration times are chosen so that
the final returns, the steady SPS and the human-normalized scores are known in advance."""

import json
import math
import os
import sys
import time

import matplotlib.image
import numpy as np
import pytest
import scipy.stats
from running import assert_user_error, copy_of_tool, run_tool
from torch.utils.tensorboard import SummaryWriter

import benchmark.plot as plot
from benchmark.run import cpu_model

SCRIPTS = ["alpha", "beta"]
ENV_IDS = ["ALE/Qbert-v5", "BreakoutNoFrameskip-v4", "PongNoFrameskip-v4"]  # sorted, as the panels are
SEEDS = [1, 2]
# Random and human scores from Badia et al. 2020 (Agent57), typed here from the paper's table.
PUBLISHED = {"Breakout": (1.7, 30.5), "Pong": (-20.7, 14.6), "Qbert": (163.9, 13455.0)}


def last_100_value(script: str, env_id: str, seed: int) -> float:
    """Every one of the run's last 100 games scores this (the 50 games before them score -1000)."""
    return {"alpha": 10.0, "beta": 20.0}[script] + ENV_IDS.index(env_id) + 4.0 * seed


def iteration_rates(script: str, seed: int) -> list[float]:
    """SPS of each iteration after the first: their median is 400 + 200 * seed for alpha, twice that for beta."""
    median = (400 + 200 * seed) * (1 if script == "alpha" else 2)
    return [median / 4, median, median * 1.5, median, median * 0.9]  # a slow one (a pause) does not count


def write_run(folder, name: str, returns, text: str | None, rates=()):
    writer = SummaryWriter(os.path.join(folder, name))
    start = time.time()
    if text is not None:
        writer.add_text("hyperparameters", text)
    for i, value in enumerate(returns):
        writer.add_scalar("charts/episodic_return", value, 100 * (i + 1), walltime=start + i)
    wall = start
    writer.add_scalar("charts/SPS", 0.0, 1000, walltime=wall)
    for i, rate in enumerate(rates):
        wall += 1000 / rate
        writer.add_scalar("charts/SPS", rate, 1000 * (i + 2), walltime=wall)
    writer.close()


def hyperparameters_text(env_id: str, exp_name: str, seed: int) -> str:
    rows = {"exp_name": exp_name, "seed": seed, "env_id": env_id, "total_timesteps": 15000}
    return "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in rows.items())


def write_study(runs_dir, env_ids=ENV_IDS):
    for script in SCRIPTS:
        for env_id in env_ids:
            for seed in SEEDS:
                returns = [-1000.0] * 50 + [last_100_value(script, env_id, seed)] * 100
                name = f"{env_id.replace('/', '_')}__{script}__{seed}__1700000000"
                write_run(
                    runs_dir, name, returns, hyperparameters_text(env_id, script, seed), iteration_rates(script, seed)
                )


def table_rows(markdown: str) -> dict[tuple[str, str], list[str]]:
    rows = [line.strip("|").split(" | ") for line in markdown.splitlines() if line.startswith("| ")]
    return {(row[0].strip(), row[1].strip()): [cell.strip() for cell in row] for row in rows[1:] if len(row) == 5}


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """The study above plus three folders the tool must skip, plotted once for all the tests below."""
    folder = tmp_path_factory.mktemp("study")
    runs_dir = folder / "runs"
    write_study(runs_dir)
    (runs_dir / "empty").mkdir()  # no events
    write_run(runs_dir, "my_experiment", [1.0, 2.0], text=None)  # neither a known name nor a hyperparameters text
    (runs_dir / "notes.txt").write_text("not a run")
    result = run_tool("plot.py", "learning", "--runs-dir", "runs", "--out-dir", "out", "--reps", "200", cwd=folder)
    assert result.returncode == 0, result.stderr
    return folder, result


@pytest.mark.parametrize(
    "name", ["returns_vs_steps.png", "returns_vs_time.png", "aggregate.png", "performance_profile.png"]
)
def test_each_figure_is_written_as_a_png(study, name):
    image = matplotlib.image.imread(study[0] / "out" / name)
    assert image.shape[0] > 100 and image.shape[1] > 100
    assert image.std() > 0, "not a blank image"


def test_the_curves_have_one_panel_per_env_side_by_side(study):
    height, width, _ = matplotlib.image.imread(study[0] / "out" / "returns_vs_steps.png").shape
    assert width > 2.5 * height, "three panels in a row"


@pytest.mark.parametrize("axis", ["steps", "time"])
def test_each_panel_is_an_env_with_one_line_per_script(tmp_path, axis):
    write_study(tmp_path)
    figure = plot.plot_returns(plot.read_runs(str(tmp_path)), axis, window=100)
    assert [ax.get_title() for ax in figure.axes] == ENV_IDS
    for ax in figure.axes:
        assert [line.get_label() for line in ax.get_lines()] == ["alpha (2 seeds)", "beta (2 seeds)"]
        assert len(ax.collections) == 2, "a band over the seeds for each script"


def test_a_line_ends_at_the_mean_over_seeds_and_its_band_spans_their_spread(tmp_path):
    write_study(tmp_path)
    figure = plot.plot_returns(plot.read_runs(str(tmp_path)), "steps", window=100)
    for ax, env_id in zip(figure.axes, ENV_IDS):
        for line, band, script in zip(ax.get_lines(), ax.collections, SCRIPTS):
            finals = [last_100_value(script, env_id, seed) for seed in SEEDS]
            assert line.get_xdata()[-1] == 15000
            assert line.get_ydata()[-1] == pytest.approx(np.mean(finals))
            low, high = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
            assert high == pytest.approx(np.mean(finals) + np.std(finals))
            assert low < -900, "the band covers the early games too"


def test_the_mean_over_seeds_stops_where_the_shortest_seed_stops(tmp_path):
    write_run(tmp_path, "Pong-v5__alpha__1__1700000000", [1.0] * 10, text=None)  # games at steps 100 .. 1,000
    write_run(tmp_path, "Pong-v5__alpha__2__1700000000", [3.0] * 20, text=None)  # games at steps 100 .. 2,000
    (ax,) = plot.plot_returns(plot.read_runs(str(tmp_path)), "steps", window=1).axes
    (line,) = ax.get_lines()
    assert (line.get_xdata()[0], line.get_xdata()[-1]) == (100, 1000)


def test_a_script_with_one_seed_has_a_line_and_no_band(tmp_path):
    write_run(tmp_path, "Pong-v5__alpha__1__1700000000", [1.0] * 10, text=None)
    (ax,) = plot.plot_returns(plot.read_runs(str(tmp_path)), "steps", window=1).axes
    assert [line.get_label() for line in ax.get_lines()] == ["alpha (1 seed)"]
    assert len(ax.collections) == 0


def test_the_table_gives_the_final_return_of_the_last_100_games_over_seeds(study):
    rows = table_rows((study[0] / "out" / "results.md").read_text())
    assert len(rows) == len(SCRIPTS) * len(ENV_IDS)
    for script in SCRIPTS:
        for env_id in ENV_IDS:
            finals = [last_100_value(script, env_id, seed) for seed in SEEDS]
            assert rows[env_id, script][2] == "1, 2"
            assert rows[env_id, script][3] == f"{np.mean(finals):.2f} ± {np.std(finals):.2f}"


def test_a_runs_final_score_is_the_mean_of_exactly_its_last_window_games(tmp_path):
    write_run(tmp_path, "Pong-v5__alpha__1__1700000000", [0.0, 0.0, 3.0, 6.0, 9.0], text=None)
    rows = table_rows(plot.results_table(plot.read_runs(str(tmp_path)), window=3))
    assert rows["Pong-v5", "alpha"][3] == "6.00 ± 0.00"


def test_the_table_gives_the_median_steady_sps_over_seeds(study):
    rows = table_rows((study[0] / "out" / "results.md").read_text())
    for script in SCRIPTS:
        expected = np.median([np.median(iteration_rates(script, seed)) for seed in SEEDS])
        assert expected == {"alpha": 700, "beta": 1400}[script]
        for env_id in ENV_IDS:
            assert rows[env_id, script][4] == f"{expected:,.0f}"


def test_the_table_gives_the_median_not_the_mean_of_the_seeds_steady_sps(tmp_path):
    for seed, rate in ((1, 100.0), (2, 200.0), (3, 600.0)):
        write_run(tmp_path, f"Pong-v5__alpha__{seed}__1700000000", [1.0], text=None, rates=[rate] * 3)
    rows = table_rows(plot.results_table(plot.read_runs(str(tmp_path)), window=100))
    assert rows["Pong-v5", "alpha"][4] == "200"


def test_the_aggregate_iqm_is_the_trimmed_mean_of_the_human_normalized_scores(study):
    text = (study[0] / "out" / "results.md").read_text()
    aggregate = text[text.index("## Aggregate over games") :]
    assert "3 games (Breakout, Pong, Qbert), 2 run(s) per game" in aggregate
    for script in SCRIPTS:
        scores = np.array(
            [
                [
                    (last_100_value(script, env_id, seed) - PUBLISHED[game][0])
                    / (PUBLISHED[game][1] - PUBLISHED[game][0])
                    for env_id, game in zip(ENV_IDS, ["Qbert", "Breakout", "Pong"])
                ]
                for seed in SEEDS
            ]
        )
        (row,) = [line for line in aggregate.splitlines() if line.startswith(f"| {script} |")]
        iqm, median, mean = (cell.strip() for cell in row.strip("|").split("|")[1:])
        assert iqm.startswith(f"{scipy.stats.trim_mean(scores, 0.25, axis=None):.3f} [")
        assert median.startswith(f"{np.median(scores):.3f} [")
        assert mean.startswith(f"{np.mean(scores):.3f} [")
        low, high = map(float, iqm[iqm.index("[") + 1 : -1].split(", "))
        assert scores.min() <= low <= high <= scores.max()


def test_runs_without_events_or_of_an_unknown_layout_are_skipped_with_one_warning_each(study):
    folder, result = study
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert any("runs/empty: no events.out.tfevents file" in w for w in warnings)
    assert any("runs/my_experiment: unknown layout" in w for w in warnings)
    assert any("runs/notes.txt: not a run directory" in w for w in warnings)


def test_the_hyperparameters_text_names_a_run_whatever_its_folder_is_called(tmp_path):
    write_run(tmp_path, "anything", [3.0], hyperparameters_text("ALE/Pong-v5", "gamma", 7))
    (run,) = plot.read_runs(str(tmp_path))
    assert (run.env_id, run.exp_name, run.seed) == ("ALE/Pong-v5", "gamma", 7)


def test_the_folder_name_names_a_run_without_hyperparameters_text(tmp_path):
    write_run(tmp_path, "ALE_Breakout-v5__ppo_atari__3__1700000000", [3.0], text=None)
    (run,) = plot.read_runs(str(tmp_path))
    assert (run.env_id, run.exp_name, run.seed) == ("ALE_Breakout-v5", "ppo_atari", 3)


def test_of_two_runs_of_one_seed_the_one_that_got_further_counts(tmp_path, capsys):
    text = hyperparameters_text("PongNoFrameskip-v4", "alpha", 1)
    write_run(tmp_path, "PongNoFrameskip-v4__alpha__1__1700000000", [1.0] * 30, text)  # cut off at step 3,000
    write_run(tmp_path, "PongNoFrameskip-v4__alpha__1__1700009999", [2.0] * 50, text)
    write_run(
        tmp_path,
        "PongNoFrameskip-v4__alpha__2__1700000000",
        [3.0] * 10,
        hyperparameters_text("PongNoFrameskip-v4", "alpha", 2),
    )
    runs = plot.read_runs(str(tmp_path))
    assert sorted((run.seed, len(run.returns)) for run in runs) == [(1, 50), (2, 10)]
    warning = capsys.readouterr().err
    assert "skipping " + str(tmp_path / "PongNoFrameskip-v4__alpha__1__1700000000") in warning
    assert "got further" in warning


def test_a_resumed_run_counts_the_time_it_ran_not_its_pauses(tmp_path, capsys, caplog):
    # games every 100 steps, one a second; the first attempt is cut off at step 1,200 after its
    # checkpoint at 1,000, and the run resumes an hour later, in the same directory
    folder = str(tmp_path / "Pong-v5__alpha__1__1700000000")
    first = SummaryWriter(folder)
    start = time.time()
    for k in range(12):
        first.add_scalar("charts/episodic_return", float(k), 100 * (k + 1), walltime=start + k)
    first.close()
    resumed = SummaryWriter(folder, purge_step=1001)
    for k in range(10):
        resumed.add_scalar("charts/episodic_return", float(k), 1100 + 100 * k, walltime=start + 3600 + k)
    resumed.close()
    (run,) = plot.read_runs(str(tmp_path))
    assert run.episode_steps.tolist() == [100.0 * (k + 1) for k in range(20)], "the steps past 1,000 once"
    seconds = run.episode_seconds - run.episode_seconds[0]
    np.testing.assert_allclose(seconds, [*range(10), *range(9, 19)], atol=1e-3)
    # the purge is said once, in the tool's words, not as TensorBoard's warning of a "TensorFlow restart"
    messages = capsys.readouterr().err.splitlines()
    assert messages == [
        f"note: {folder}: resumed 1 time(s); what an attempt logged past the checkpoint it was resumed from is left out"
    ]
    assert [record.message for record in caplog.records if record.name == "tensorboard"] == []


def write_parts(folder, parts):
    """A resumed run's parts, one event file each, in `folder`: (purge_step, first step, last step, seconds per
    game, wall time of the first) each, a game and an SPS event every 100 steps. The files are named in the
    order the parts ran, as the machine's clock names them (one writer's names can sort in another order
    when they fall in one second)."""
    for k, (purge_step, first_step, last_step, seconds_per_game, wall) in enumerate(parts):
        scratch = os.path.join(folder, "scratch")
        writer = SummaryWriter(scratch, purge_step=purge_step)
        for i, step in enumerate(range(first_step, last_step + 1, 100)):
            writer.add_scalar("charts/episodic_return", 1.0, step, walltime=wall + i * seconds_per_game)
            writer.add_scalar("charts/SPS", 1.0, step, walltime=wall + i * seconds_per_game)
        writer.close()
        (written,) = os.listdir(scratch)
        os.rename(
            os.path.join(scratch, written), os.path.join(folder, f"events.out.tfevents.{1700000000 + k}.host.1.0")
        )
        os.rmdir(scratch)


def test_a_part_redone_entirely_does_not_take_the_pause_before_it_off_twice(tmp_path):
    # Part 1 logs a game every 100 s up to step 1,200, its checkpoint at 1,000. Part 2 resumes from it two hours
    # later and dies after one game, before its next checkpoint: all it logged is purged. Part 3 resumes from the
    # same checkpoint an hour after part 2 began and logs a game every 60 s up to step 2,000.
    start = time.time()
    folder = str(tmp_path / "Pong-v5__alpha__1__1700000000")
    write_parts(
        folder,
        [(None, 100, 1200, 100, start), (1001, 1100, 1100, 100, start + 7200), (1001, 1100, 2000, 60, start + 10800)],
    )
    (run,) = plot.read_runs(str(tmp_path))
    assert run.episode_steps.tolist() == [100.0 * (k + 1) for k in range(20)]
    # part 1's games to the checkpoint, then part 3's from where they stopped: neither pause, nor part 2, counts
    seconds = run.episode_seconds - run.episode_seconds[0]
    np.testing.assert_allclose(seconds, [*range(0, 1000, 100), *range(900, 1441, 60)], atol=1e-3)


def test_each_part_of_a_resumed_run_gets_its_start_steps_redone_steps_hours_and_speed(tmp_path):
    # Part 1 logs 100 steps every 100 s up to step 1,200 and is cut off after its checkpoint at 1,000. Part 2
    # resumes from it two hours later and dies after one iteration. Part 3 resumes from it again and logs
    # 100 steps every 60 s up to 2,000. Seed 2 never resumed.
    start = 1_700_000_000  # 2023-11-14 22:13:20 UTC
    folder = str(tmp_path / "runs" / "Pong-v5__alpha__1__1700000000")
    parts = [
        (None, 100, 1200, 100, start),
        (1001, 1100, 1100, 100, start + 7200),
        (1001, 1100, 2000, 60, start + 10800),
    ]
    for purge_step, first_step, last_step, seconds_per_iteration, wall in parts:
        writer = SummaryWriter(folder, purge_step=purge_step)
        for k, step in enumerate(range(first_step, last_step + 1, 100)):
            writer.add_scalar("charts/episodic_return", 1.0, step, walltime=wall + k * seconds_per_iteration)
            writer.add_scalar("charts/SPS", 1.0, step, walltime=wall + k * seconds_per_iteration)
        writer.close()
    write_run(tmp_path / "runs", "Pong-v5__alpha__2__1700000000", [1.0] * 10, text=None, rates=[100.0] * 5)
    result = run_tool("plot.py", "learning", "--runs-dir", "runs", "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    rows = [line for line in report.split("## Parts of resumed runs")[1].splitlines() if line.startswith("| Pong")]
    assert rows == [
        "| Pong-v5 | alpha | 1 | 1 | 2023-11-14 22:13 | 0 -> 1,200 | 200 | 0.31 | 1 |",
        "| Pong-v5 | alpha | 1 | 2 | 2023-11-15 00:13 | 1,000 -> 1,100 | 100 | - | - |",
        "| Pong-v5 | alpha | 1 | 3 | 2023-11-15 01:13 | 1,000 -> 2,000 | 0 | 0.15 | 2 |",
    ]


def test_a_run_that_finished_no_game_is_skipped_with_a_warning(tmp_path, capsys):
    write_run(tmp_path, "Pong-v5__alpha__1__1700000000", [], text=None, rates=[100.0])
    assert plot.read_runs(str(tmp_path)) == []
    assert "no charts/episodic_return" in capsys.readouterr().err


def test_fewer_than_three_games_leave_the_aggregate_out(tmp_path):
    write_study(tmp_path / "runs", env_ids=ENV_IDS[:2])
    result = run_tool("plot.py", "learning", "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "aggregate figures left out" in result.stdout
    assert sorted(os.listdir(tmp_path / "out")) == ["results.md", "returns_vs_steps.png", "returns_vs_time.png"]


def test_every_script_gets_the_same_number_of_seeds_per_game_in_the_aggregate(tmp_path):
    write_study(tmp_path)
    # a finished third seed of alpha on Pong (no total steps known: no hyperparameters text)
    write_run(tmp_path, "PongNoFrameskip-v4__alpha__3__1700000000", [5.0], text=None)
    scores, games = plot.normalized_scores(plot.read_runs(str(tmp_path)), window=100)
    assert games == ["Breakout", "Pong", "Qbert"]
    assert {script: s.shape for script, s in scores.items()} == {"alpha": (2, 3), "beta": (2, 3)}


def test_the_aggregate_leaves_out_unfinished_runs_as_the_tables_do(tmp_path):
    # a third seed of each script on each game, cut off after one game (step 100 of 15,000), scoring 5
    write_study(tmp_path / "runs")
    for script in SCRIPTS:
        for env_id in ENV_IDS:
            text = hyperparameters_text(env_id, script, 3)
            write_run(tmp_path / "runs", f"{env_id.replace('/', '_')}__{script}__3__1700000000", [5.0], text)
    scores, games = plot.normalized_scores(plot.read_runs(str(tmp_path / "runs")), window=100)
    assert {script: s.shape for script, s in scores.items()} == {"alpha": (2, 3), "beta": (2, 3)}
    for script in SCRIPTS:
        finished = [
            [plot.human_normalized(last_100_value(script, env_id, seed), plot.game_of(env_id)) for env_id in ENV_IDS]
            for seed in SEEDS
        ]
        np.testing.assert_allclose(
            scores[script], np.array(finished)[:, [1, 2, 0]]
        )  # games sorted: Breakout, Pong, Qbert
    result = run_tool("plot.py", "learning", "--out-dir", "out", "--reps", "100", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "3 games (Breakout, Pong, Qbert), 2 run(s) per game" in (tmp_path / "out" / "results.md").read_text()


@pytest.mark.parametrize(
    "env_id, game",
    [
        ("BreakoutNoFrameskip-v4", "Breakout"),
        ("ALE/Breakout-v5", "Breakout"),
        ("Breakout-v5", "Breakout"),
        ("MsPacmanNoFrameskip-v4", "MsPacman"),
        ("CartPole-v1", None),
    ],
)
def test_env_ids_of_every_style_name_their_atari_game(env_id, game):
    assert plot.game_of(env_id) == game


def test_human_normalized_scores_are_zero_at_random_and_one_at_human_play():
    for game, (random_score, human_score) in PUBLISHED.items():
        assert plot.human_normalized(random_score, game) == 0.0
        assert plot.human_normalized(human_score, game) == pytest.approx(1.0)


def test_no_usable_run_is_a_one_line_error(tmp_path):
    (tmp_path / "runs" / "empty").mkdir(parents=True)
    assert_user_error(run_tool("plot.py", "learning", cwd=tmp_path), "no usable run in runs")


# ---------------------------------------------------------------------------------------------
# Throughput
# ---------------------------------------------------------------------------------------------
JAX_SCAN, MULTIGPU = "ppo_atari_envpool_xla_jax_scan", "ppo_atari_multigpu"


def throughput_results() -> dict:
    """What benchmark/throughput.py writes with --json, from two rounds of made-up measurements of every
    scheme: one process, torchrun with 1 and 2 processes and each env split, the JAX script on 1 and 2
    XLA devices."""
    import benchmark.throughput as throughput

    configuration = throughput.Configuration
    samples = {
        ("ppo_atari", None, "env"): [0.002, 0.004],  # median 3 ms per vector step of 8 envs
        ("ppo_atari", "none", "nn"): [1.0, 2.0],
        ("ppo_atari", "bf16", "nn"): [1.0, 1.0],
        (configuration("ppo_atari"), "none", "steady"): [400.0, 420.0],
        (configuration("ppo_atari"), "bf16", "steady"): [550.0, 570.0],
        (JAX_SCAN, None, "env"): [0.004, 0.004],
        (JAX_SCAN, "none", "nn"): [2.0, 2.0],
        (JAX_SCAN, "bf16", "nn"): [3.0, 3.0],
        (configuration(JAX_SCAN, xla_devices=1), "none", "steady"): [300.0, 320.0],
        (configuration(JAX_SCAN, xla_devices=1), "bf16", "steady"): [200.0, 220.0],
        (configuration(JAX_SCAN, xla_devices=2), "none", "steady"): [250.0, 270.0],
        (configuration(JAX_SCAN, xla_devices=2), "bf16", "steady"): [180.0, 200.0],
        (configuration(MULTIGPU, 1, "even"), "none", "steady"): [390.0, 410.0],
        (configuration(MULTIGPU, 1, "even"), "bf16", "steady"): [500.0, 520.0],
        (configuration(MULTIGPU, 2, "even"), "none", "steady"): [700.0, 740.0],
        (configuration(MULTIGPU, 2, "even"), "bf16", "steady"): [900.0, 980.0],
        (configuration(MULTIGPU, 2, "measured"), "none", "steady"): [710.0, 770.0],
        (configuration(MULTIGPU, 2, "measured"), "bf16", "steady"): [910.0, 990.0],
    }
    for key in list(samples):
        if key[2] == "steady":
            samples[key[:2] + ("reported",)] = [value - 10 for value in samples[key]]
    rows = throughput.summarize(
        samples,
        ["ppo_atari", JAX_SCAN, MULTIGPU],
        ["none", "bf16"],
        batch_size=1024,
        num_steps=128,
        num_envs=8,
        xla_devices=[1, 2],
    )
    return {"setup": {"env_id": "BreakoutNoFrameskip-v4", "num_envs": 8, "num_steps": 128, "cpus": 2}, "rows": rows}


def row_key(row: dict) -> tuple:
    return row["script"], row["processes"], row["env_split"], row["xla_devices"], row["precision"]


def test_throughput_rows_hold_the_medians_of_the_rounds_and_the_serial_bound():
    rows = {row_key(row): row for row in throughput_results()["rows"]}
    assert list(rows) == [
        ("ppo_atari", 1, None, None, "fp32"),
        ("ppo_atari", 1, None, None, "bf16"),
        (JAX_SCAN, 1, None, 1, "fp32"),
        (JAX_SCAN, 1, None, 1, "bf16"),
        (JAX_SCAN, 1, None, 2, "fp32"),
        (JAX_SCAN, 1, None, 2, "bf16"),
        (MULTIGPU, 1, "even", None, "fp32"),
        (MULTIGPU, 1, "even", None, "bf16"),
        (MULTIGPU, 2, "even", None, "fp32"),
        (MULTIGPU, 2, "even", None, "bf16"),
        (MULTIGPU, 2, "measured", None, "fp32"),
        (MULTIGPU, 2, "measured", None, "bf16"),
    ]
    fp32 = rows["ppo_atari", 1, None, None, "fp32"]
    assert fp32["steady_sps"] == 410.0 and fp32["logged_sps"] == 400.0
    assert fp32["env_only_sps"] == pytest.approx(8 / 0.003)
    assert fp32["bound_sps"] == pytest.approx(1024 / (128 * 0.003 + 1.5))
    assert rows[MULTIGPU, 2, "even", None, "bf16"]["steady_sps"] == 940.0
    assert rows[MULTIGPU, 2, "measured", None, "bf16"]["steady_sps"] == 950.0
    assert rows[MULTIGPU, 2, "even", None, "bf16"]["env_only_sps"] is None, "not measured for the torchrun script"


def test_throughput_rows_take_the_median_of_odd_rounds_each_precisions_network_time_and_steady_over_bound():
    import benchmark.throughput as throughput

    one = throughput.Configuration("ppo_atari")
    samples = {
        ("ppo_atari", None, "env"): [0.002, 0.010, 0.003],  # median 3 ms, mean 5 ms
        ("ppo_atari", "none", "nn"): [1.0, 1.2, 4.0],  # median 1.2 s
        ("ppo_atari", "bf16", "nn"): [0.5, 0.5, 0.5],
        (one, "none", "steady"): [400.0, 100.0, 430.0],  # median 400, mean 310
        (one, "bf16", "steady"): [600.0, 600.0, 600.0],
        (one, "none", "reported"): [390.0, 90.0, 420.0],
        (one, "bf16", "reported"): [590.0, 590.0, 590.0],
    }
    fp32, bf16 = throughput.summarize(samples, ["ppo_atari"], ["none", "bf16"], 1024, 128, 8)
    assert fp32["steady_sps"] == 400.0 and fp32["logged_sps"] == 390.0 and fp32["env_ms_per_step"] == 3.0
    assert fp32["steady_sps_per_round"] == [400.0, 100.0, 430.0]
    assert fp32["bound_sps"] == pytest.approx(1024 / (128 * 0.003 + 1.2))
    assert bf16["bound_sps"] == pytest.approx(1024 / (128 * 0.003 + 0.5)), "with bf16's own network time"
    assert bf16["nn_s_per_iteration"] == 0.5
    for row in (fp32, bf16):
        assert row["fraction_of_bound"] == pytest.approx(row["steady_sps"] / row["bound_sps"])
    assert fp32["fraction_of_bound"] == pytest.approx(400 / 646.46, rel=1e-4)


def test_a_jax_run_on_two_devices_has_the_scripts_env_limit_but_no_serial_bound():
    rows = {row_key(row): row for row in throughput_results()["rows"]}
    one, two = rows[JAX_SCAN, 1, None, 1, "fp32"], rows[JAX_SCAN, 1, None, 2, "fp32"]
    assert one["bound_sps"] == pytest.approx(1024 / (128 * 0.004 + 2.0)) and one["fraction_of_bound"] is not None
    assert two["steady_sps"] == 260.0 and two["steady_sps_per_round"] == [250.0, 270.0]
    assert two["env_only_sps"] == pytest.approx(8 / 0.004), "the same 8 envs as on one device"
    assert two["bound_sps"] is None and two["nn_s_per_iteration"] is None, "the NN was timed on one device"


def test_throughput_figure_has_a_bar_per_configuration_and_precision_and_the_env_only_line():
    results = throughput_results()
    figure = plot.plot_throughput(results)
    (ax,) = figure.axes
    heights = [bar.get_height() for bar in ax.patches]
    fp32, bf16 = [410.0, 310.0, 260.0, 400.0, 720.0, 740.0], [560.0, 210.0, 190.0, 510.0, 940.0, 950.0]
    assert heights == fp32 + bf16, "fp32 bars, then bf16 bars"
    assert [label.get_text() for label in ax.get_xticklabels()] == [
        "ppo_atari",
        f"{JAX_SCAN}\n1 XLA device",
        f"{JAX_SCAN}\n2 XLA devices",
        f"{MULTIGPU}\n1 process",
        f"{MULTIGPU}\n2 processes, even split",
        f"{MULTIGPU}\n2 processes, measured split",
    ]
    starts = [segment[0] for line in ax.collections for segment in line.get_segments()]  # (x, y) of each line
    assert np.ravel(starts) == pytest.approx([-0.45, 8 / 0.003, 0.55, 8 / 0.004, 1.55, 8 / 0.004]), (
        "over ppo_atari and both JAX configurations; none over the torchrun script's"
    )


def test_throughput_figure_names_the_cpu_its_bars_were_measured_on():
    results = throughput_results()
    results["setup"].update(cpu="AMD EPYC 9R14 (AVX-512 BF16)", date="2026-12-06 18:30")
    (ax,) = plot.plot_throughput(results).axes
    assert ax.get_title() == (
        "BreakoutNoFrameskip-v4, 8 envs x 128 steps per process, 2 CPUs: AMD EPYC 9R14 (AVX-512 BF16), 2026-12-06 18:30"
    )


def test_a_throughput_file_written_before_the_schemes_reads_as_the_even_split_and_one_device():
    rows = [
        {"script": script, "processes": processes, "precision": "fp32", "steady_sps": sps, "env_only_sps": None}
        for script, processes, sps in [(JAX_SCAN, 1, 170.0), (MULTIGPU, 1, 230.0), (MULTIGPU, 2, 260.0)]
    ]
    (ax,) = plot.plot_throughput({"rows": rows}).axes
    assert [bar.get_height() for bar in ax.patches] == [170.0, 230.0, 260.0]
    assert [label.get_text() for label in ax.get_xticklabels()] == [
        f"{JAX_SCAN}\n1 XLA device",
        f"{MULTIGPU}\n1 process",
        f"{MULTIGPU}\n2 processes, even split",
    ]


def test_a_failed_throughput_measurement_has_no_bar():
    results = throughput_results()
    results["rows"][4]["steady_sps"] = float("nan")  # the JAX script on 2 devices, fp32: left out
    (ax,) = plot.plot_throughput(results).axes
    assert ax.patches[2].get_height() == 0.0
    assert [text.get_text() for text in ax.texts][:3] == ["410", "310", ""]


def test_each_scheme_runs_with_its_launcher_flags_and_xla_devices():
    import benchmark.throughput as throughput

    run = lambda configuration: throughput.real_run(configuration, "Pong", 8, 16, 1024, "none")
    command, environment = run(throughput.Configuration(MULTIGPU, 2, "measured"))
    assert command[0] == throughput.TORCHRUN and "--nproc-per-node=2" in command
    assert " --local-num-envs 8 " in " ".join(command) and " --env-split measured --split-every 3" in " ".join(command)
    command, _ = run(throughput.Configuration(MULTIGPU, 2, "even"))
    assert " --env-split even" in " ".join(command) and "--split-every" not in command
    command, environment = run(throughput.Configuration(JAX_SCAN, xla_devices=2))
    assert command[0] == sys.executable and " --num-envs 8 " in " ".join(command)
    assert "--xla_force_host_platform_device_count=2" in environment["XLA_FLAGS"]
    _, environment = run(throughput.Configuration(JAX_SCAN, xla_devices=1))
    assert "xla_force_host_platform_device_count" not in environment.get("XLA_FLAGS", "")


FAKE_JAX_SCRIPT = """
import os, re
from torch.utils.tensorboard import SummaryWriter

forced = re.search(r"device_count=(\\d+)", os.environ.get("XLA_FLAGS", ""))
devices = os.environ.get("FAKE_GPUS") or (forced[1] if forced else "1")
print(f"{devices} {'gpu' if os.environ.get('FAKE_GPUS') else 'cpu'} device(s) on 1 process(es): ...", flush=True)
writer = SummaryWriter("runs/fake")
for i, wall in enumerate([100.0, 102.0, 104.0, 106.0]):  # 1000 steps every 2 s
    writer.add_scalar("charts/SPS", 1.0, 1000 * (i + 1), walltime=wall)
writer.close()
"""


def test_a_jax_run_on_forced_xla_devices_is_measured_and_one_that_did_not_get_them_is_left_out(
    tmp_path, monkeypatch, capsys
):
    import benchmark.throughput as throughput

    (tmp_path / "cleanrl").mkdir()
    (tmp_path / "cleanrl" / f"{JAX_SCAN}.py").write_text(FAKE_JAX_SCRIPT)
    monkeypatch.setattr(throughput, "REPO_ROOT", str(tmp_path))
    two_devices = throughput.Configuration(JAX_SCAN, xla_devices=2)
    assert throughput.measure_real(two_devices, "Pong", 8, 16, 3, "none") == (1.0, 500.0)
    monkeypatch.setenv("FAKE_GPUS", "1")  # a GPU machine: the forced count makes CPU devices only
    assert all(math.isnan(sps) for sps in throughput.measure_real(two_devices, "Pong", 8, 16, 3, "none"))
    assert "2 XLA devices none: left out, the run had 1 gpu device(s)" in capsys.readouterr().out


def test_throughput_real_runs_give_the_medians_of_the_rounds_of_the_last_logged_and_the_steady_sps(tmp_path):
    """A stand-in ppo_atari.py (tests/fake_sps.py) with a steady rate per round, logging 0.9 of it last."""
    settings = {"rates": [400, 100, 430], "first": 1024, "start": 1024, "end": 4096}
    tool = copy_of_tool(tmp_path, "throughput.py", {"ppo_atari": settings})
    args = ("--real-only", "--scripts", "ppo_atari", "--precisions", "none", "--rounds", "3", "--iterations", "3")
    result = run_tool(tool, *args, "--json", "out.json", cwd=tmp_path)  # an absolute path: the copy
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "out.json").read_text())
    (row,) = results["rows"]
    assert row["steady_sps_per_round"] == pytest.approx([400, 100, 430])
    assert row["steady_sps"] == pytest.approx(400) and row["logged_sps"] == pytest.approx(0.9 * 400)
    assert row["env_only_sps"] is None and row["bound_sps"] is None, "--real-only"
    setup = results["setup"]
    assert (setup["rounds"], setup["iterations"], setup["real_only"]) == (3, 3, True)
    assert (setup["cpu"], setup["cpus"]) == (cpu_model(), os.cpu_count())


def test_xla_devices_that_do_not_divide_the_envs_are_a_one_line_error(tmp_path):
    result = run_tool("throughput.py", "--scripts", JAX_SCAN, "--xla-devices", "1", "3", cwd=tmp_path)
    assert_user_error(result, "--xla-devices 1 3", "--num-envs 8")


def test_throughput_command_writes_the_png(tmp_path):
    (tmp_path / "throughput.json").write_text(json.dumps(throughput_results()))
    result = run_tool("plot.py", "throughput", "throughput.json", "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert matplotlib.image.imread(tmp_path / "out" / "throughput.png").std() > 0


def test_a_throughput_file_of_another_layout_is_a_one_line_error(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"rows": [{"script": "x"}]}))
    assert_user_error(run_tool("plot.py", "throughput", "other.json", cwd=tmp_path), "is not a")


def test_a_throughput_file_without_rows_is_a_one_line_error(tmp_path):
    (tmp_path / "empty.json").write_text(json.dumps({"rows": []}))
    assert_user_error(run_tool("plot.py", "throughput", "empty.json", cwd=tmp_path), "is not a")


def test_a_published_result_is_a_dashed_line_on_every_panel(tmp_path):
    write_study(tmp_path)
    figure = plot.plot_returns(plot.read_runs(str(tmp_path)), "steps", window=100, references=[("published", 12.5)])
    for ax in figure.axes:
        (reference,) = [line for line in ax.get_lines() if line.get_label() == "published"]
        assert list(reference.get_ydata()) == [12.5, 12.5] and reference.get_linestyle() == "--"


def test_the_milestones_table_gives_each_runs_last_100_mean_at_every_mark(tmp_path):
    # 150 games at steps 100, 200, ..., 15000: the first 50 score -1000, the last 100 score v.
    write_study(tmp_path / "runs", env_ids=["BreakoutNoFrameskip-v4"])
    result = run_tool(
        "plot.py",
        "learning",
        "--runs-dir",
        "runs",
        "--out-dir",
        "out",
        "--every",
        "5000",
        "--reference",
        "CleanRL, 10M steps=414.66",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "out" / "results.md").read_text().splitlines()
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]
    marks = {(row[1], int(row[2]), row[3]): row[4:] for row in rows if len(row) == 6 and row[2].isdigit()}
    for script in SCRIPTS:
        for seed in SEEDS:
            v = last_100_value(script, "BreakoutNoFrameskip-v4", seed)
            assert marks[script, seed, "5,000"] == ["-1000.00", "50"]
            assert marks[script, seed, "10,000"] == [f"{(v - 1000) / 2:.2f}", "100"]
            assert marks[script, seed, "15,000"] == [f"{v:.2f}", "150"]


def test_a_malformed_reference_is_a_one_line_error(tmp_path):
    write_study(tmp_path / "runs", env_ids=["BreakoutNoFrameskip-v4"])
    result = run_tool("plot.py", "learning", "--runs-dir", "runs", "--reference", "CleanRL 414", cwd=tmp_path)
    assert_user_error(result, "expected LABEL=RETURN")


def write_comparison(runs_dir, finals: dict[str, list[float]]):
    """Seeds 1, 2, ... of each script ending on its given final returns, and a seed of beta still running: 20
    of its 150 games (all 99.0), at step 2,000 of 15,000."""
    for script, values in finals.items():
        for seed, value in enumerate(values, start=1):
            text = hyperparameters_text("BreakoutNoFrameskip-v4", script, seed)
            write_run(runs_dir, f"{script}_{seed}", [-1000.0] * 50 + [value] * 100, text)
    seed = len(finals["beta"]) + 1
    write_run(runs_dir, f"beta_{seed}", [99.0] * 20, hyperparameters_text("BreakoutNoFrameskip-v4", "beta", seed))


def test_an_unfinished_run_has_a_marked_row_of_its_own_and_stays_out_of_the_finished_seeds_mean(tmp_path):
    write_comparison(tmp_path / "runs", {"alpha": [10.0, 12.0], "beta": [20.0, 30.0]})
    result = run_tool("plot.py", "learning", "--runs-dir", "runs", "--out-dir", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    rows = table_rows((tmp_path / "out" / "results.md").read_text())
    assert rows["BreakoutNoFrameskip-v4", "beta"][2:4] == ["1, 2", "25.00 ± 5.00"]
    assert rows["BreakoutNoFrameskip-v4", "beta (unfinished)"][2:4] == ["3 (at step 2,000 of 15,000)", "99.00 ± 0.00"]
    assert rows["BreakoutNoFrameskip-v4", "alpha"][2:4] == ["1, 2", "11.00 ± 1.00"]
    unfinished = os.path.join("runs", "beta_3")
    assert f"warning: {unfinished} stopped at step 2,000 of 15,000: its final return is there" in result.stderr


def test_a_run_within_1_percent_of_its_total_steps_is_finished_and_one_5_percent_short_is_not(tmp_path):
    # games every 100 steps of a 15,000-step run: the last at 14,900 (99.3%) or at 14,300 (95.3%)
    for seed, games in ((1, 149), (2, 143)):
        text = hyperparameters_text("PongNoFrameskip-v4", "alpha", seed)
        write_run(tmp_path, f"PongNoFrameskip-v4__alpha__{seed}__1700000000", [1.0] * games, text)
    assert {run.seed: plot.unfinished(run) for run in plot.read_runs(str(tmp_path))} == {1: False, 2: True}


def test_an_unfinished_seed_is_a_dashed_line_of_its_own_and_does_not_cut_the_mean_short(tmp_path):
    write_comparison(tmp_path, {"alpha": [10.0, 12.0], "beta": [20.0, 30.0]})
    (ax,) = plot.plot_returns(plot.read_runs(str(tmp_path)), "steps", window=100).axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert list(lines) == ["alpha (2 seeds)", "beta (2 seeds)", "beta seed 3 (unfinished)"]
    assert lines["beta (2 seeds)"].get_xdata()[-1] == 15000, "the finished seeds' mean reaches their end"
    assert lines["beta (2 seeds)"].get_ydata()[-1] == pytest.approx(25.0)
    assert lines["beta seed 3 (unfinished)"].get_linestyle() == "--"
    assert lines["beta seed 3 (unfinished)"].get_xdata()[-1] == 2000


def test_compare_gives_the_difference_of_final_returns_with_welchs_95_percent_interval(tmp_path):
    # Final returns: alpha 10, 12, 14 (sample variance 4), beta 20, 30 (50): a difference of 13, a standard
    # error of sqrt(4/3 + 50/2), on Welch-Satterthwaite's degrees of freedom (not the pooled t's 3).
    finals = {"alpha": [10.0, 12.0, 14.0], "beta": [20.0, 30.0]}
    write_comparison(tmp_path / "runs", finals)  # beta's unfinished third seed is left out of the comparison
    args = ("--runs-dir", "runs", "--out-dir", "out", "--compare", "alpha", "beta")
    result = run_tool("plot.py", "learning", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    unfinished = os.path.join("runs", "beta_3")
    assert f"warning: {unfinished} stopped at step 2,000 of 15,000: its final return is there" in result.stderr
    assert f"warning: --compare: {unfinished} has not reached its total steps; left out" in result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    assert "## beta against alpha" in report
    (row,) = [line for line in report.splitlines() if line.startswith("| BreakoutNoFrameskip-v4 | 12.00")]
    a, b = 4 / 3, 50 / 2  # the squared standard errors of the two means
    degrees = (a + b) ** 2 / (a**2 / 2 + b**2 / 1)
    low, high = (
        13 - scipy.stats.t.ppf(0.975, degrees) * math.sqrt(a + b),
        13 + scipy.stats.t.ppf(0.975, degrees) * math.sqrt(a + b),
    )
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == [f"12.00 ± {np.std(finals['alpha']):.2f}", "25.00 ± 5.00", "+13.00"]
    assert cells[4] == f"[{low:+.2f}, {high:+.2f}]"
    assert cells[5:] == ["+108.3%", f"[{low / 0.12:+.1f}%, {high / 0.12:+.1f}%]"]


@pytest.mark.parametrize("base_finals", [[-1.0, 1.0], [-12.0, -10.0]], ids=["mean 0", "negative mean"])
def test_compare_gives_no_percentages_of_a_base_mean_of_zero_or_below(tmp_path, base_finals):
    # in % of a negative mean, a gain reads as a loss and the interval comes out reversed; of 0, as infinite
    write_comparison(tmp_path / "runs", {"alpha": base_finals, "beta": [20.0, 30.0]})
    args = ("--runs-dir", "runs", "--out-dir", "out", "--compare", "alpha", "beta")
    result = run_tool("plot.py", "learning", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    (row,) = [line for line in report.split("## beta against alpha")[1].splitlines() if line.startswith("| Breakout")]
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[3] == f"{25.0 - np.mean(base_finals):+.2f}", "the difference itself is still given"
    assert cells[5:] == ["-", "-"]


def test_compare_leaves_out_an_env_without_two_seeds_of_each_script_with_a_warning(tmp_path):
    write_study(tmp_path / "runs", env_ids=["BreakoutNoFrameskip-v4"])
    args = ("--runs-dir", "runs", "--out-dir", "out", "--compare", "alpha", "gamma")
    result = run_tool("plot.py", "learning", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "needs 2 or more seeds of both alpha and gamma" in result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    assert "## gamma against alpha" in report and "| BreakoutNoFrameskip-v4 | 17.00" not in report


def test_compare_leaves_out_an_env_where_a_script_has_a_single_seed(tmp_path):
    write_comparison(tmp_path / "runs", {"alpha": [10.0], "beta": [20.0, 30.0]})
    args = ("--runs-dir", "runs", "--out-dir", "out", "--compare", "alpha", "beta")
    result = run_tool("plot.py", "learning", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "needs 2 or more seeds of both alpha and beta" in result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    assert not [line for line in report.split("## beta against alpha")[1].splitlines() if line.startswith("| Breakout")]


def test_the_health_table_gives_each_scalars_mean_and_the_longest_game_over_every_interval(tmp_path):
    # An iteration every 1,000 steps logs lr = step and entropy = 2 * step; a game ends every 500 steps
    # with length step / 100, so each 5,000-step interval's longest game is its last.
    writer = SummaryWriter(str(tmp_path / "runs" / "BreakoutNoFrameskip-v4__alpha__1__1700000000"))
    writer.add_text("hyperparameters", hyperparameters_text("BreakoutNoFrameskip-v4", "alpha", 1))
    for step in range(500, 10_001, 500):
        writer.add_scalar("charts/episodic_return", 1.0, step)
        writer.add_scalar("charts/episodic_length", step / 100, step)
        if step % 1000 == 0:
            writer.add_scalar("charts/learning_rate", step, step)
            writer.add_scalar("losses/entropy", 2 * step, step)
    writer.close()
    result = run_tool("plot.py", "learning", "--runs-dir", "runs", "--out-dir", "out", "--every", "5000", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = (tmp_path / "out" / "results.md").read_text()
    assert "| seed | steps | learning rate | entropy | longest game |" in report
    assert "| 1 | 0-5,000 | 3e+03 | 6e+03 | 50 |" in report  # the means of 1,000 .. 5,000 and of twice those
    assert "| 1 | 5,000-10,000 | 8e+03 | 1.6e+04 | 100 |" in report
