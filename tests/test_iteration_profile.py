"""benchmark/iteration_profile.py times the phases of a script's real iterations from outside: each phase
an iteration runs is measured, the phases fit in the iteration's wall time, and a change of a script's
public names breaks this test, not the next profile on a lent machine."""

import os
import re

import pytest

from benchmark.iteration_profile import PHASES, SCRIPTS, onednn_summary
from tests.running import REPO_ROOT, assert_user_error, run_tool

TINY = ["--", "--num-envs", "2", "--num-steps", "16"]  # iterations of 32 steps


def table_rows(output: str) -> dict[str, list[str]]:
    """The cells of each markdown table row, by the row's first cell."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip().strip("*") for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) > 2:
            rows[cells[0]] = cells[1:]
    return rows


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_phase_of_an_iteration_is_measured_and_fits_in_its_wall_time(script, tmp_path):
    script_path = os.path.join(REPO_ROOT, "cleanrl", script)
    options = ["--script", script_path, "--iterations", "2", "--precisions", "none"]
    result = run_tool("iteration_profile.py", *options, *TINY, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "fp32: 2 iterations of 32 steps" in result.stdout, result.stdout
    rows = table_rows(result.stdout)
    wall = float(rows["iteration"][0])
    phases = {phase: float(rows[phase][0]) for phase in (*PHASES, "other")}
    for phase in ("env step", "rollout forwards", "GAE", "update forwards", "loss", "backward", "optimizer"):
        assert phases[phase] > 0, (phase, result.stdout)
    assert phases["other"] >= 0, result.stdout  # the phases fit in the wall time ...
    assert sum(phases.values()) == pytest.approx(wall, abs=0.6)  # ... and "other" is the rest of it
    assert re.search(r"\| steps per second \| \d+ SPS", result.stdout), result.stdout


def test_both_precisions_side_by_side_with_the_operators_by_self_time(tmp_path):
    result = run_tool("iteration_profile.py", "--iterations", "1", "--ops", *TINY, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("| phase"))
    assert "fp32 ms" in header and "bf16 ms" in header and "bf16 / fp32" in header, header
    assert re.search(r"\| iteration \| \*\*\d+\*\* \| 100% \| \*\*\d+\*\* \| 100% \| \*\*[\d.]+\*\* \|", result.stdout)
    for precision in ("fp32", "bf16"):
        assert f"{precision}: operators by self time, per iteration" in result.stdout
    assert "aten::convolution_backward" in result.stdout, result.stdout


def test_bad_input_is_a_one_line_error(tmp_path):
    assert_user_error(run_tool("iteration_profile.py", "--script", "nope.py", cwd=tmp_path), "no script")
    dqn = os.path.join(REPO_ROOT, "cleanrl", "dqn.py")
    assert_user_error(run_tool("iteration_profile.py", "--script", dqn, cwd=tmp_path), "not one of")
    # the script's own user error comes through as its one line
    bad = run_tool("iteration_profile.py", "--precisions", "none", "--", "--num-minibatches", "3", cwd=tmp_path)
    assert_user_error(bad, "not divisible by num_minibatches = 3", "(in the fp32 run)")


def test_onednn_lines_are_summed_by_primitive_and_implementation():
    log = "\n".join(
        [
            "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with AMX",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,"
            "src:bf16::blocked:acdb::f0 wei:bf16,,alg:convolution_direct,mb256_ic4oc32_ih84oh20kh8sh4,1.5",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,"
            "src:bf16::blocked:acdb::f0 wei:bf16,,alg:convolution_direct,mb256_ic4oc32_ih84oh20kh8sh4,2.5",
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32 dst:bf16,,,256x4x84x84,0.25",
            "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,brg_conv_fwd:avx512_core_amx,x,y,9.0",
            "something else entirely",
        ]
    )
    rows = onednn_summary(log, iterations=2)
    assert rows == [
        ("convolution", "brg_conv_fwd:avx512_core_amx", "forward_training", 1.0, 2.0),
        ("reorder", "jit:uni", "undef", 0.5, 0.125),
    ]
