"""Bad input to the benchmark tools that run for minutes: a one-line error before any measurement, not
a traceback at the end (or a silent wrong figure)."""

import pytest
from running import assert_user_error, run_tool


@pytest.mark.parametrize(
    "tool, args, message",
    [
        ("serial_bound.py", ["--scripts", "dqn", "--rounds", "0"], "--rounds must be at least 1"),
        ("throughput.py", ["--scripts", "ppo_atari", "--rounds", "0"], "--rounds must be at least 1"),
        (
            "throughput.py",
            ["--scripts", "ppo_atari", "--json", "no/such/folder/x.json"],
            "--json no/such/folder/x.json: its folder does not exist",
        ),
        ("learning.py", ["--script", "nosuch"], "--script nosuch: there is no cleanrl/nosuch.py"),
        # returns[-0:] would be every episode of the run, not the last none
        ("learning.py", ["--script", "ppo", "--last", "0"], "--last must be at least 1, got 0"),
    ],
    ids=["serial-bound-no-rounds", "throughput-no-rounds", "throughput-json-folder", "unknown-script", "last-0"],
)
def test_bad_input_is_a_one_line_error_before_anything_runs(tmp_path, tool, args, message):
    assert_user_error(run_tool(tool, *args, cwd=tmp_path), message)
