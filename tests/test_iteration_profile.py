"""benchmark/iteration_profile.py times the phases of a script's real iterations from outside: each phase
an iteration runs is measured, the phases fit in the iteration's wall time, and a change of a script's
public names breaks this test, not the next profile on a lent machine."""

import importlib.util
import os
import re

import pytest
import torch

from benchmark.iteration_profile import PHASES, SCRIPTS, flops_per_sample, onednn_summary
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
    # ... and "other" is the rest of it, to the table's rounding: the wall to 1 ms, each phase to 0.1 ms
    assert sum(phases.values()) == pytest.approx(wall, abs=0.5 + 0.05 * len(phases) + 1e-9)
    assert re.search(r"\| steps per second \| \d+ SPS", result.stdout), result.stdout


# The Nature CNN's multiply-adds per sample: conv 8x8/4 to 32 x 20 x 20, conv 4x4/2 to 64 x 9 x 9, conv 3x3 to
# 64 x 7 x 7, linear 3136 -> 512; then the heads 512 -> actions and 512 -> 1.
NATURE_CNN_MACS = 32 * 20 * 20 * (4 * 8 * 8) + 64 * 9 * 9 * (32 * 4 * 4) + 64 * 7 * 7 * (64 * 3 * 3) + 3136 * 512
BREAKOUT_ACTIONS = 4


def nature_cnn_flops(actions: int) -> tuple[float, float]:
    """(forward, backward) FLOPs of one sample: the backward computes each layer's weight gradient and
    its input gradient, but for the first conv, whose input (the observation) needs none."""
    forward = 2 * (NATURE_CNN_MACS + 512 * (actions + 1))
    first_conv_input_gradient = 2 * 32 * 20 * 20 * (4 * 8 * 8)
    return forward, 2 * forward - first_conv_input_gradient


@pytest.mark.parametrize("script", SCRIPTS)
def test_the_flop_count_is_the_nature_cnns(script):
    spec = importlib.util.spec_from_file_location(f"counted_{script[:-3]}", os.path.join(REPO_ROOT, "cleanrl", script))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    agent = module.Agent(6)
    counts = flops_per_sample(agent, (4, 84, 84), torch.uint8)
    forward, backward = nature_cnn_flops(6)
    assert counts == {"get_action_and_value": forward, "get_value": forward, "backward": backward}
    assert all(parameter.grad is None for parameter in agent.parameters())  # the count leaves no gradients


def test_both_precisions_side_by_side_with_the_operators_by_self_time_and_the_ceiling(tmp_path):
    options = ["--iterations", "2", "--ops", "--ceiling"]
    result = run_tool("iteration_profile.py", *options, *TINY, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.startswith("| phase"))
    assert "fp32 ms" in header and "bf16 ms" in header and "bf16 / fp32" in header, header
    assert re.search(r"\| iteration \| \*\*\d+\*\* \| 100% \| \*\*\d+\*\* \| 100% \| \*\*[\d.]+\*\* \|", result.stdout)
    for precision in ("fp32", "bf16"):
        assert f"{precision}: operators by self time, per iteration" in result.stdout
    assert "aten::convolution_backward" in result.stdout, result.stdout

    # --ceiling: per iteration of 2 envs x 16 steps, 32 rollout samples and the last value's 2 (no game
    # ends in 16 steps), and 4 epochs of all 32 samples in the update, each with its backward
    forward, backward = nature_cnn_flops(BREAKOUT_ACTIONS)
    rows = table_rows(result.stdout)
    assert rows["rollout forwards"][0] == f"{34 * forward / 1e9:.1f}", result.stdout
    assert rows["update forwards"][0] == f"{128 * forward / 1e9:.1f}", result.stdout
    assert rows["backward"][0] == f"{128 * backward / 1e9:.1f}", result.stdout
    assert re.search(r"\| matmul peak \| \| \d+ \| 100% \| \d+ \| 100% \|", result.stdout), result.stdout
    assert re.search(
        r"bf16 at the peak: at most [\d.]+x the measured fp32 iteration .*; both at the peak: [\d.]+x", result.stdout
    ), result.stdout


def test_bad_input_is_a_one_line_error(tmp_path):
    assert_user_error(run_tool("iteration_profile.py", "--script", "nope.py", cwd=tmp_path), "no script")
    dqn = os.path.join(REPO_ROOT, "cleanrl", "dqn.py")
    assert_user_error(run_tool("iteration_profile.py", "--script", dqn, cwd=tmp_path), "not one of")
    # the script's own user error comes through as its one line
    bad = run_tool("iteration_profile.py", "--precisions", "none", "--", "--num-minibatches", "3", cwd=tmp_path)
    assert_user_error(bad, "not divisible by num_minibatches = 3", "(in the fp32 run)")


def test_onednn_lines_are_summed_by_primitive_implementation_and_problem():
    log = "\n".join(
        [
            "onednn_verbose,v1,info,cpu,isa:Intel AVX-512 with AMX",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,"
            "src:bf16::blocked:acdb::f0 wei:bf16,,alg:convolution_direct,mb256_ic4oc32_ih84oh20kh8sh4,1.5",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,"
            "src:bf16::blocked:acdb::f0 wei:bf16,,alg:convolution_direct,mb256_ic4oc32_ih84oh20kh8sh4,2.5",
            "onednn_verbose,v1,primitive,exec,cpu,convolution,brg_conv_fwd:avx512_core_amx,forward_training,"
            "src:bf16::blocked:acdb::f0 wei:bf16,,alg:convolution_direct,mb8_ic4oc32_ih84oh20kh8sh4_iw84ow20,0.5",
            "onednn_verbose,v1,primitive,exec,cpu,reorder,jit:uni,undef,src:f32 dst:bf16,,,256x4x84x84,0.25",
            "onednn_verbose,v1,primitive,create:cache_miss,cpu,convolution,brg_conv_fwd:avx512_core_amx,x,y,9.0",
            "something else entirely",
        ]
    )
    rows = onednn_summary(log, iterations=2)
    assert rows == [
        ("convolution", "brg_conv_fwd:avx512_core_amx", "forward_training", "mb256_ic4oc32_ih84oh20kh8sh4", 1.0, 2.0),
        ("convolution", "brg_conv_fwd:avx512_core_amx", "forward_training", "mb8_ic4oc32_ih84oh20kh8sh4", 0.5, 0.25),
        ("reorder", "jit:uni", "undef", "256x4x84x84", 0.5, 0.125),
    ]
