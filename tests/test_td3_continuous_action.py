"""Specification of cleanrl/td3_continuous_action.py."""

import glob
import os

import numpy as np
import pytest
import torch
import torch.nn as nn
from checkpoints import assert_the_newest_checkpoints_are_kept_by_their_number
from deterministic_policies import (
    BAD_INPUT,
    ONE_THREAD,
    actor_updated_every_step,
    assert_a_saved_policy_of_an_env_not_here_is_a_one_line_error,
    assert_a_termination_is_stored_as_terminal,
    assert_a_time_limit_cut_keeps_its_real_final_observation_and_bootstraps,
    assert_actor_maps_onto_the_action_bounds,
    assert_check_catches,
    assert_evaluation_plays_the_saved_actors_action_without_noise,
    assert_exploration_adds_gaussian_noise_in_half_ranges_within_the_bounds,
    assert_loaded_actor_equals_saved_actor_bounds_included,
    assert_polyak_averaging,
    assert_replay_buffer_samples_whole_transitions_and_overwrites_the_oldest,
    assert_replay_buffer_survives_a_checkpoint,
    assert_run_resumes_where_its_checkpoint_left_it,
    assert_save_then_evaluate_reproduces_the_evaluation,
    assert_targets_move_only_with_the_actor_every_policy_frequency_steps,
    assert_td_target_matches_reference,
    assert_td_targets_come_from_the_target_networks,
    assert_the_actor_climbs_the_critic,
    assert_update_schedule_matches_reference,
    assert_videos_of_a_resumed_run_are_numbered_on,
    bad_input_id,
    targets_from_the_first_learning_step,
)
from run_outputs import (
    assert_episodes_0_1_8_recorded_and_uploaded,
    assert_freed_memory_is_kept,
    assert_progress_follows_the_convention,
    mujoco_offscreen_rendering_error,
    progress_steps,
    run_tracked_on_inverted_pendulum,
)
from running import assert_main_fails_with, assert_user_error, read_scalars, run_dirs, run_script

import cleanrl.td3_continuous_action as td3

SCRIPT = "td3_continuous_action.py"
TD3_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    torch.set_num_threads(1)  # conftest gives the default back after the test


# ---------------------------------------------------------------------------------------------
# The math: each check against a reference written out here, and the check seen to fail on a wrong version
# ---------------------------------------------------------------------------------------------
def reference_smoothed_action(target_action: float, eps: float, policy_noise: float, noise_clip: float, low, high):
    """One action dimension, plain Python: the noise policy_noise * eps clipped to [-noise_clip, noise_clip],
    in half-ranges of the bounds, added to the target actor's action, the sum clipped into the bounds."""
    noise = min(max(policy_noise * eps, -noise_clip), noise_clip) * (high - low) / 2
    return min(max(target_action + noise, low), high)


def assert_smoothing_matches_reference(smoothed_target_actions):
    """smoothed_target_actions(mu'(s'), eps, policy_noise, noise_clip, scale, bias) against the reference, on
    asymmetric bounds ([-2, 2] x [0, 1]), with noise both inside and beyond the clip and noisy actions both
    inside and beyond the bounds."""
    rng = np.random.default_rng(0)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    target_actions = rng.uniform(low, high, size=(200, 2))
    eps = 2.0 * rng.normal(size=(200, 2))
    policy_noise, noise_clip = 0.2, 0.5
    assert (np.abs(policy_noise * eps) > noise_clip).sum() > 20 and (np.abs(policy_noise * eps) < noise_clip).sum() > 20
    unclipped = target_actions + policy_noise * eps * (high - low) / 2
    assert ((unclipped < low) | (unclipped > high)).sum() > 20, "some noisy actions leave the bounds"
    scale, bias = torch.tensor((high - low) / 2), torch.tensor((high + low) / 2)
    got = smoothed_target_actions(
        torch.tensor(target_actions), torch.tensor(eps), policy_noise, noise_clip, scale, bias
    )
    expected = [
        [
            reference_smoothed_action(a, e, policy_noise, noise_clip, low[j], high[j])
            for j, (a, e) in enumerate(zip(*row))
        ]
        for row in zip(target_actions, eps)
    ]
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_target_policy_smoothing_clips_the_noise_then_the_action_as_the_reference_does():
    assert_smoothing_matches_reference(td3.smoothed_target_actions)


@pytest.mark.parametrize(
    "wrong",
    [
        lambda a, eps, sigma, c, scale, bias: torch.clamp(a + sigma * eps * scale, bias - scale, bias + scale),
        lambda a, eps, sigma, c, scale, bias: a + (sigma * eps).clamp(-c, c) * scale,
        lambda a, eps, sigma, c, scale, bias: torch.clamp(a + (sigma * eps).clamp(-c, c), bias - scale, bias + scale),
        lambda a, eps, sigma, c, scale, bias: torch.clamp(
            a + (sigma * eps * scale).clamp(-c, c), bias - scale, bias + scale
        ),
    ],
    ids=["noise-not-clipped", "action-not-clipped", "noise-not-in-half-ranges", "noise-clipped-after-scaling"],
)
def test_the_smoothing_check_fails_on_a_wrong_smoothing(wrong):
    assert_check_catches(assert_smoothing_matches_reference, wrong)


def test_the_td_target_is_the_smaller_twin_without_bootstrap_only_at_a_termination():
    assert_td_target_matches_reference(td3.clipped_double_q_target, num_critics=2)


@pytest.mark.parametrize(
    "wrong",
    [
        lambda r, term, q, gamma: r + gamma * (1 - term) * torch.max(q[0], q[1]),
        lambda r, term, q, gamma: r + gamma * (1 - term) * q[0],
        lambda r, term, q, gamma: r + gamma * torch.min(q[0], q[1]),
        lambda r, term, q, gamma: r + gamma * (1 - term) * q.mean(0),
    ],
    ids=["max-of-twins", "q1-only", "no-done-mask", "mean-of-twins"],
)
def test_the_td_target_check_fails_on_a_wrong_target(wrong):
    assert_check_catches(lambda target: assert_td_target_matches_reference(target, 2), wrong)


def test_the_actor_and_the_targets_are_updated_every_policy_frequency_steps_the_critics_at_every_step():
    assert_update_schedule_matches_reference(td3.update_schedule)


@pytest.mark.parametrize("wrong", [actor_updated_every_step, targets_from_the_first_learning_step])
def test_the_schedule_check_fails_on_a_wrong_schedule(wrong):
    assert_check_catches(assert_update_schedule_matches_reference, wrong)


def test_soft_update_moves_every_target_parameter_tau_of_the_way():
    assert_polyak_averaging(td3.soft_update, lambda: td3.TwinQNetwork(3, 2))
    assert_polyak_averaging(td3.soft_update, lambda: td3.Actor(3, np.full(2, -1.0), np.full(2, 1.0)))


def test_the_actor_maps_its_output_onto_the_action_bounds():
    assert_actor_maps_onto_the_action_bounds(td3)


def test_twin_critics_are_two_independent_networks_and_q1_is_the_first():
    # Each critic starts as its own nn.Linear stack would (the same draws, in order) and computes that stack.
    torch.manual_seed(0)
    twin = td3.TwinQNetwork(3, 2)
    torch.manual_seed(0)
    critics = [
        nn.Sequential(nn.Linear(5, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)) for _ in range(2)
    ]
    obs, action = torch.randn(7, 3), torch.randn(7, 2)
    values = twin(obs, action)
    assert values.shape == (2, 7)
    for critic, value in zip(critics, values):
        torch.testing.assert_close(value, critic(torch.cat([obs, action], dim=1)).squeeze(-1))
    torch.testing.assert_close(twin.q1(obs, action), values[0])
    # a loss on Q1 alone gives Q2's weights no gradient: the critics share nothing
    twin.q1(obs, action).sum().backward()
    for weight in twin.weights:
        assert weight.grad[0].abs().sum() > 0 and weight.grad[1].abs().sum() == 0


# ---------------------------------------------------------------------------------------------
# Replay buffer, truncation
# ---------------------------------------------------------------------------------------------
def test_replay_buffer_samples_whole_stored_transitions_and_overwrites_the_oldest():
    assert_replay_buffer_samples_whole_transitions_and_overwrites_the_oldest(td3)


def test_replay_buffer_survives_a_checkpoint(tmp_path):
    assert_replay_buffer_survives_a_checkpoint(td3, tmp_path)


def test_a_transition_cut_by_the_time_limit_keeps_its_real_final_observation_and_bootstraps(tmp_path, monkeypatch):
    assert_a_time_limit_cut_keeps_its_real_final_observation_and_bootstraps(td3, tmp_path, monkeypatch)


def test_a_terminated_transition_is_stored_as_terminal(tmp_path, monkeypatch):
    assert_a_termination_is_stored_as_terminal(td3, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The algorithm in a run
# ---------------------------------------------------------------------------------------------
def test_the_td_target_comes_from_the_target_critics_at_the_target_actors_smoothed_actions(tmp_path, monkeypatch):
    assert_td_targets_come_from_the_target_networks(
        td3, "TwinQNetwork", "clipped_double_q_target", tmp_path, monkeypatch
    )


def test_the_actor_climbs_q1_not_the_smaller_twin(tmp_path, monkeypatch):
    online, obs, actions = assert_the_actor_climbs_the_critic(
        td3, "TwinQNetwork", lambda critic, obs, actions: critic.q1(obs, actions), tmp_path, monkeypatch
    )
    with torch.no_grad():
        q = online(obs, actions)
    assert not torch.allclose(q.min(dim=0).values, q[0]), "the critics disagree: the test can tell them apart"


def test_the_targets_move_only_with_the_actor_every_policy_frequency_steps(tmp_path, monkeypatch):
    assert_targets_move_only_with_the_actor_every_policy_frequency_steps(td3, tmp_path, monkeypatch)


def test_exploration_adds_gaussian_noise_in_half_ranges_and_stays_within_the_bounds(tmp_path, monkeypatch):
    assert_exploration_adds_gaussian_noise_in_half_ranges_within_the_bounds(td3, "TwinQNetwork", tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# A short MuJoCo run: tracked, videos where MuJoCo can render, a progress line at every log point
# ---------------------------------------------------------------------------------------------
# InvertedPendulum-v5, 300 steps: 200 random, then a critic update (batches of 64) after each of the 100 others;
# the actor and the targets every 3rd step (steps 201, 204, ..., 300: 34 of them).
SHORT_RUN = ["--total-timesteps", "300", "--learning-starts", "200", "--batch-size", "64", "--policy-frequency", "3"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("short_run")
    result = run_tracked_on_inverted_pendulum(SCRIPT, *SHORT_RUN, "--progress-interval", "0", cwd=cwd, env=ONE_THREAD)
    (run_dir,) = run_dirs(cwd)
    return cwd, result, read_scalars(run_dir)


def test_short_run_updates_the_critics_every_step_and_the_actor_every_third(short_run):
    _, result, _ = short_run
    (summary,) = [line for line in result.stdout.splitlines() if line.startswith("finished")]
    assert summary.startswith("finished 300 steps, 100 critic updates, 34 actor updates"), summary


def test_short_run_logs_every_tag(short_run):
    _, _, scalars = short_run
    assert set(TD3_TAGS) <= set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [100, 200, 300]
    for tag in TD3_TAGS[3:]:  # the losses, once learning has started
        assert [step for step, _ in scalars[tag]] == [300], tag
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag


def test_short_run_logs_each_episode_at_its_own_step(short_run):
    _, _, scalars = short_run
    steps = [step for step, _ in scalars["charts/episodic_length"]]
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert len(steps) >= 9 and steps == list(np.cumsum(lengths))
    assert [step for step, _ in scalars["charts/episodic_return"]] == steps


def test_short_run_prints_a_progress_line_at_each_log_point(short_run):
    _, result, _ = short_run
    assert progress_steps(result.stderr) == [100, 200, 300]


def test_track_creates_a_wandb_run(short_run):
    cwd, _, _ = short_run
    assert glob.glob(str(cwd / "wandb" / "offline-run-*")), os.listdir(cwd)


@pytest.mark.skipif(
    mujoco_offscreen_rendering_error() is not None,
    reason=f"MuJoCo cannot render offscreen here: {mujoco_offscreen_rendering_error()}",
)
def test_capture_video_records_episodes_0_1_8_and_uploads_them(short_run):
    cwd, _, _ = short_run
    assert_episodes_0_1_8_recorded_and_uploaded(cwd)


@pytest.mark.skipif(
    mujoco_offscreen_rendering_error() is not None,
    reason=f"MuJoCo cannot render offscreen here: {mujoco_offscreen_rendering_error()}",
)
def test_the_videos_of_a_resumed_run_are_numbered_on_from_its_checkpoints_episodes(tmp_path):
    assert_videos_of_a_resumed_run_are_numbered_on(td3, tmp_path)


def test_freed_memory_is_kept_for_the_next_update():
    assert_freed_memory_is_kept(td3)  # the same block in ddpg_continuous_action.py (tests/test_blocks.py)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(td3.Progress, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
def test_loaded_actor_equals_saved_actor_bounds_included(tmp_path):
    assert_loaded_actor_equals_saved_actor_bounds_included(td3, "TwinQNetwork", tmp_path)


def test_evaluation_plays_the_saved_actors_action_without_noise(tmp_path, monkeypatch):
    assert_evaluation_plays_the_saved_actors_action_without_noise(td3, "TwinQNetwork", tmp_path, monkeypatch)


def test_save_then_evaluate_round_trip_reproduces_the_evaluation(tmp_path, monkeypatch, capsys):
    assert_save_then_evaluate_reproduces_the_evaluation(td3, tmp_path, monkeypatch, capsys)


def test_a_saved_policy_of_an_env_not_here_or_a_corrupt_one_is_a_one_line_error(tmp_path, monkeypatch):
    assert_a_saved_policy_of_an_env_not_here_is_a_one_line_error(td3, "TwinQNetwork", tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
def test_a_resumed_run_goes_on_where_its_checkpoint_left_it(tmp_path, monkeypatch, capsys):
    assert_run_resumes_where_its_checkpoint_left_it(td3, tmp_path, monkeypatch, capsys)


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(td3, tmp_path, "step", 9)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_from_the_command_line_is_a_one_line_error_without_traceback(tmp_path):
    result = run_script(SCRIPT, "--noise-clip", "-0.5", cwd=tmp_path, env=ONE_THREAD, timeout=120)
    assert_user_error(result, "--noise-clip must not be negative, got -0.5")


@pytest.mark.parametrize(
    "overrides, fragment",
    BAD_INPUT + [(dict(policy_noise=-0.2), "--policy-noise must not be negative, got -0.2")],
    ids=bad_input_id,
)
def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, overrides, fragment):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(td3.main, td3.Args(**overrides), fragment)
