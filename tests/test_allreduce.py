"""benchmark/allreduce.py (ring against central gradient averaging) and `benchmark/plot.py allreduce`:
both schemes give every process the plain mean of the processes' gradients, with 2 and 3 processes
(tiny tensors, one timed round: no timing is checked); the busiest process's bytes follow the two
algorithms; the figure is written; bad input is a one-line error."""

import json
import math
import os
import statistics

import matplotlib.image
import pytest
import torch
from running import assert_user_error, run_tool

import benchmark.allreduce as allreduce
import cleanrl.ppo_atari_multigpu as multigpu
from benchmark.run import cpu_model

NUMEL = 1003  # not a multiple of 2 or 3: the ring's chunks are uneven


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """One run of the tool with 2 and 3 processes, keeping every process's averaged tensor."""
    folder = tmp_path_factory.mktemp("allreduce")
    result = run_tool(
        "allreduce.py",
        "--processes",
        "2",
        "3",
        "--numel",
        str(NUMEL),
        "--repeats",
        "1",
        "--warmup",
        "0",
        "--json",
        str(folder / "allreduce.json"),
        "--save-dir",
        str(folder),
        cwd=folder,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    with open(folder / "allreduce.json") as f:
        return folder, result.stdout, json.load(f)


@pytest.mark.parametrize("processes", [2, 3])
@pytest.mark.parametrize("scheme", ["ring", "central"])
def test_both_schemes_give_every_process_the_plain_mean(measured, processes, scheme):
    folder, _, _ = measured
    plain_mean = torch.stack([allreduce.rank_gradient(rank, NUMEL) for rank in range(processes)]).mean(dim=0)
    for rank in range(processes):
        averaged = torch.load(folder / f"{scheme}-{processes}-rank{rank}.pt")
        torch.testing.assert_close(averaged, plain_mean, rtol=1e-6, atol=1e-6)
    assert len(plain_mean.unique()) == NUMEL  # distinct values: a wrong permutation would not pass


def test_the_table_and_the_json_give_each_count_and_scheme_with_the_computed_bytes(measured):
    _, stdout, results = measured
    size = NUMEL * 4
    rows = {(row["processes"], row["scheme"]): row for row in results["rows"]}
    assert sorted(rows) == [(2, "central"), (2, "ring"), (3, "central"), (3, "ring")]
    assert rows[(3, "ring")]["busiest_sent_bytes"] == rows[(3, "ring")]["busiest_received_bytes"] == 4 / 3 * size
    assert rows[(3, "central")]["busiest_sent_bytes"] == 2 * size
    assert all(row["median_ms"] > 0 and row["max_abs_error"] < 1e-5 for row in rows.values())
    assert [p["bytes_ratio"] for p in results["central_over_ring"]] == [1.0, 1.5]
    assert results["setup"]["numel"] == NUMEL and results["setup"]["backend"] == "gloo"
    assert "| 3 | central |" in stdout and "the traffic pattern of a cluster, not a cluster" in stdout


def test_the_figures_are_medians_of_the_timed_rounds_after_the_warm_up_and_central_over_ring(tmp_path):
    """Three timed rounds after two untimed ones, 2 and 4 processes: each row's median, minimum and maximum
    are of its three timed rounds; the time ratio is central over ring, and the claim point is found in the
    time ratios (the bytes ratio reaches 1.6 between 2 and 4 processes, the times of a tiny tensor not there)."""
    result = run_tool(
        "allreduce.py",
        *("--processes", "2", "4", "--numel", str(NUMEL), "--repeats", "3", "--warmup", "2"),
        *("--json", str(tmp_path / "allreduce.json")),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "allreduce.json").read_text())
    rows = {(row["processes"], row["scheme"]): row for row in results["rows"]}
    for row in rows.values():
        assert len(row["rounds_ms"]) == 3, "the timed rounds only, not the warm-up's"
        assert row["median_ms"] == statistics.median(row["rounds_ms"])
        assert (row["min_ms"], row["max_ms"]) == (min(row["rounds_ms"]), max(row["rounds_ms"]))
    points = results["central_over_ring"]
    for point in points:
        n = point["processes"]
        assert point["time_ratio"] == rows[n, "central"]["median_ms"] / rows[n, "ring"]["median_ms"]
    assert [p["bytes_ratio"] for p in points] == [1.0, 2.0]
    time_points = [(point["processes"], point["time_ratio"]) for point in points]
    assert results["central_60_percent_more_at"] == allreduce.crossing(time_points)
    assert results["setup"]["repeats"] == 3 and results["setup"]["warmup"] == 2
    assert results["setup"]["cpu"] == cpu_model() and results["setup"]["cpus"] == os.cpu_count()
    assert "median of 3 rounds after 2;" in result.stdout


def test_the_busiest_process_traffic_follows_the_algorithms():
    size = 1000
    for n in (2, 4, 8, 16):
        ring, central = allreduce.busiest_traffic("ring", n, size), allreduce.busiest_traffic("central", n, size)
        assert ring == (2 * (n - 1) / n * size,) * 2
        assert central == ((n - 1) * size,) * 2
        assert central[0] / ring[0] == pytest.approx(n / 2)
    assert allreduce.busiest_traffic("ring", 16, size)[0] < 2 * size  # the ring's never reaches 2 gradients


def test_the_default_size_is_the_nature_cnn_of_the_scripts():
    assert allreduce.NATURE_CNN_PARAMETERS == sum(p.numel() for p in multigpu.Agent(4).parameters()) == 1_686_693


def test_the_claim_point_is_interpolated_in_log2_of_the_count():
    assert allreduce.crossing([(2, 1.0), (4, 2.2)]) == pytest.approx(2**1.5)
    assert allreduce.crossing([(4, 2.0), (2, 1.7)]) == 2.0  # already there at the smallest count
    assert allreduce.crossing([(2, 1.1), (4, 1.5), (8, 1.2)]) is None
    assert math.isclose(allreduce.crossing([(2, 1.0), (4, 1.2), (8, 2.0)]), 2 ** (2 + 0.5))


def test_a_ratio_exactly_at_the_claim_at_the_smallest_count_is_the_claim_point():
    assert allreduce.crossing([(2, allreduce.CLAIM_RATIO), (4, 2.0)]) == 2.0
    assert allreduce.crossing([(2, 1.0), (4, allreduce.CLAIM_RATIO)]) == 4.0


def test_the_figure_is_written(measured, tmp_path):
    folder, _, _ = measured
    result = run_tool(
        "plot.py", "allreduce", str(folder / "allreduce.json"), "--out-dir", str(tmp_path / "img"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    image = matplotlib.image.imread(tmp_path / "img" / "allreduce.png")
    assert image.shape[0] > 300 and image.shape[1] > 600


def test_across_hosts_each_host_runs_one_worker_over_its_capped_link_and_counts_what_it_sent(measured, tmp_path):
    # --hosts: 2 hosts of benchmark/hosts.py, one worker each, every link capped at 100 Mbit/s: both schemes
    # still give the plain mean; each host's bytes per average, read from its link's counter, are the
    # algorithm's (plus the TCP/IP headers and acknowledgements), the run's totals (Cluster.bytes_sent) hold
    # every timed average, and the cap shows in the time.
    from benchmark.hosts import hosts_missing

    if reason := hosts_missing():
        pytest.skip(reason)
    numel, repeats = 100_003, 2
    result = run_tool(
        "allreduce.py",
        *("--hosts", str(tmp_path / "hosts"), "--processes", "2", "--rate", "100mbit", "--numel", str(numel)),
        *("--repeats", str(repeats), "--warmup", "1", "--json", str(tmp_path / "hosts.json")),
        *("--save-dir", str(tmp_path)),
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    plain_mean = torch.stack([allreduce.rank_gradient(rank, numel) for rank in range(2)]).mean(dim=0)
    for scheme in ("ring", "central"):
        for rank in range(2):
            torch.testing.assert_close(torch.load(tmp_path / f"{scheme}-2-rank{rank}.pt"), plain_mean)
    results = json.loads((tmp_path / "hosts.json").read_text())
    assert "a host each" in results["setup"]["transport"]
    (network,) = results["networks"]
    assert network["rate"] == "100mbit"
    size = numel * 4  # 2 processes: each sends the whole gradient once in either scheme
    for row in network["rows"]:
        assert row["busiest_sent_bytes"] == size
        assert all(size < sent < 1.1 * size for sent in row["sent_bytes_per_process"]), row
        # 400 kB at 12.5 MB/s, less what tbf's 125 kB bucket lets through at once: 22 ms at the least
        assert row["min_ms"] > 15, row
    (point,) = network["central_over_ring"]
    timed = [sum(repeats * row["sent_bytes_per_process"][i] for row in network["rows"]) for i in range(2)]
    assert all(total > sent for total, sent in zip(point["run_bytes_sent_per_host"], timed))
    assert "| 2 | central |" in result.stdout and "hosts' links capped at 100mbit" in result.stdout
    # The figure draws the loopback series and the capped one together.
    loopback = str(measured[0] / "allreduce.json")
    figure = run_tool(
        "plot.py", "allreduce", loopback, str(tmp_path / "hosts.json"), "--out-dir", str(tmp_path), cwd=tmp_path
    )
    assert figure.returncode == 0 and (tmp_path / "allreduce.png").exists(), figure.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--processes", "1", "2"], "each count must be 2 or more"),
        (["--repeats", "0"], "must be positive"),
        (["--numel", "-5"], "must be positive"),
        (["--backend", "mpi"], "invalid choice: 'mpi'"),
        (["--save-dir", "/nonexistent/folder"], "no such folder"),
        (["--json", "/nonexistent/folder/out.json"], "its folder does not exist"),
        (["--backend", "nccl", "--processes", "2"], "one process per GPU"),
        (["--rate", "1gbit"], "--rate caps the links of --hosts: add --hosts ROOT"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    if "nccl" in args and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs")
    assert_user_error(run_tool("allreduce.py", *args, cwd=tmp_path), message)


def test_a_file_that_is_not_a_result_is_a_one_line_error_of_the_figure(tmp_path):
    (tmp_path / "other.json").write_text(json.dumps({"rows": [{"script": "ppo_atari"}]}))
    result = run_tool("plot.py", "allreduce", str(tmp_path / "other.json"), "--out-dir", str(tmp_path), cwd=tmp_path)
    assert_user_error(result, "is not a `benchmark/allreduce.py --json` result")
    assert not os.path.exists(tmp_path / "allreduce.png")
