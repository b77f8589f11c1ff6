"""benchmark/serial_bound.py follows the scripts it measures: its env-only and network-only
measurements run each script's own environment, networks and losses (a change of a script's API
breaks this test, not the next benchmark run), and give a time per step."""

import math

import pytest
import torch

import benchmark.serial_bound as serial_bound


@pytest.fixture
def one_thread():
    """As the tool measures (and as fast here: tiny matmuls on two threads of a busy machine crawl)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("script", list(serial_bound.SCRIPTS))
def test_env_network_and_loop_measurements_run_the_scripts_own_code(script, one_thread):
    env_id, _ = serial_bound.SCRIPTS[script]
    env_seconds = serial_bound.measure_env(script, env_id, steps=100)
    nn_seconds = serial_bound.measure_nn(script, env_id, scale=0.02)
    loop_seconds = serial_bound.measure_loop(script, env_id, scale=0.05)
    assert 0 < env_seconds < 0.1 and math.isfinite(env_seconds)
    assert 0 < nn_seconds < 1.0 and math.isfinite(nn_seconds)
    assert 0 < loop_seconds < 1.0 and math.isfinite(loop_seconds)


def test_dqn_acts_with_its_network_on_the_greedy_share_of_the_measured_steps():
    # dqn's real run: 30,000 steps, epsilon 1 -> 0.05 over the first 15,000, measured from step 2,500
    expected = 1.0 - sum(max(1.0 - 0.95 * t / 15000, 0.05) for t in range(2500, 30000)) / 27500
    assert serial_bound.greedy_fraction("dqn") == pytest.approx(expected, rel=1e-9)
    assert serial_bound.greedy_fraction("dqn_atari") == pytest.approx(0.99)  # past exploration when measured


def test_a_real_run_starts_past_its_warm_up():
    for script, (_, arguments) in serial_bound.SCRIPTS.items():
        total = int(arguments[arguments.index("--total-timesteps") + 1])
        starts = int(arguments[arguments.index("--learning-starts") + 1]) if "--learning-starts" in arguments else 0
        assert starts < serial_bound.REAL_FROM_STEP[script] < total, script
