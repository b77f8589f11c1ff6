"""Specification of cleanrl/ddpg_continuous_action.py. The checks it shares with td3_continuous_action.py are
in deterministic_policies.py. --track and --capture-video (wandb, RecordVideo, the videos' numbering on
resume) are tested on TD3's run alone: their code is the same blocks in both scripts (tests/test_blocks.py)."""

import numpy as np
import pytest
import torch
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
    bad_input_id,
    targets_from_the_first_learning_step,
)
from run_outputs import assert_progress_follows_the_convention, progress_steps
from running import assert_main_fails_with, assert_user_error, read_scalars, run_dirs, run_script

import cleanrl.ddpg_continuous_action as ddpg

SCRIPT = "ddpg_continuous_action.py"
DDPG_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "losses/qf1_values",
    "losses/qf1_loss",
    "losses/actor_loss",
]


@pytest.fixture(autouse=True)
def one_torch_thread():
    torch.set_num_threads(1)  # conftest gives the default back after the test


# ---------------------------------------------------------------------------------------------
# The math: each check against a reference, and the check seen to fail on a wrong version
# ---------------------------------------------------------------------------------------------
def test_the_td_target_bootstraps_from_the_target_critic_but_at_a_termination():
    assert_td_target_matches_reference(ddpg.td_target, num_critics=1)


@pytest.mark.parametrize(
    "wrong",
    [lambda r, term, q, gamma: r + gamma * q, lambda r, term, q, gamma: r + (1 - term) * q],
    ids=["no-done-mask", "no-discount"],
)
def test_the_td_target_check_fails_on_a_wrong_target(wrong):
    assert_check_catches(lambda target: assert_td_target_matches_reference(target, 1), wrong)


def test_the_actor_and_the_targets_are_updated_every_policy_frequency_steps_the_critic_at_every_step():
    assert_update_schedule_matches_reference(ddpg.update_schedule)


@pytest.mark.parametrize("wrong", [actor_updated_every_step, targets_from_the_first_learning_step])
def test_the_schedule_check_fails_on_a_wrong_schedule(wrong):
    assert_check_catches(assert_update_schedule_matches_reference, wrong)


def test_soft_update_moves_every_target_parameter_tau_of_the_way():
    assert_polyak_averaging(ddpg.soft_update, lambda: ddpg.QNetwork(3, 2))


def test_the_actor_maps_its_output_onto_the_action_bounds():
    assert_actor_maps_onto_the_action_bounds(ddpg)


def test_the_critic_is_one_network_of_three_linear_layers_on_observation_and_action():
    torch.manual_seed(0)
    critic = ddpg.QNetwork(3, 2)
    obs, action = torch.randn(7, 3), torch.randn(7, 2)
    torch.testing.assert_close(critic(obs, action), critic.network(torch.cat([obs, action], dim=1))[:, 0])
    assert [layer.in_features for layer in critic.network if isinstance(layer, torch.nn.Linear)] == [5, 256, 256]


# ---------------------------------------------------------------------------------------------
# Replay buffer, truncation
# ---------------------------------------------------------------------------------------------
def test_replay_buffer_samples_whole_stored_transitions_and_overwrites_the_oldest():
    assert_replay_buffer_samples_whole_transitions_and_overwrites_the_oldest(ddpg)


def test_replay_buffer_survives_a_checkpoint(tmp_path):
    assert_replay_buffer_survives_a_checkpoint(ddpg, tmp_path)


def test_a_transition_cut_by_the_time_limit_keeps_its_real_final_observation_and_bootstraps(tmp_path, monkeypatch):
    assert_a_time_limit_cut_keeps_its_real_final_observation_and_bootstraps(ddpg, tmp_path, monkeypatch)


def test_a_terminated_transition_is_stored_as_terminal(tmp_path, monkeypatch):
    assert_a_termination_is_stored_as_terminal(ddpg, tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# The algorithm in a run
# ---------------------------------------------------------------------------------------------
def test_the_td_target_comes_from_the_target_critic_at_the_target_actors_action(tmp_path, monkeypatch):
    assert_td_targets_come_from_the_target_networks(ddpg, "QNetwork", "td_target", tmp_path, monkeypatch)


def test_the_actor_climbs_the_critic(tmp_path, monkeypatch):
    assert_the_actor_climbs_the_critic(ddpg, "QNetwork", lambda critic, obs, a: critic(obs, a), tmp_path, monkeypatch)


def test_the_targets_move_only_with_the_actor_every_policy_frequency_steps(tmp_path, monkeypatch):
    assert_targets_move_only_with_the_actor_every_policy_frequency_steps(ddpg, tmp_path, monkeypatch)


def test_exploration_adds_gaussian_noise_in_half_ranges_and_stays_within_the_bounds(tmp_path, monkeypatch):
    assert_exploration_adds_gaussian_noise_in_half_ranges_within_the_bounds(ddpg, "QNetwork", tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# A short MuJoCo run
# ---------------------------------------------------------------------------------------------
# Hopper-v5, 300 steps: 200 random, then a critic update (batches of 64) after each of the 100 others; the actor
# and the targets every 3rd step (steps 201, 204, ..., 300: 34 of them).
SHORT_RUN = ["--env-id", "Hopper-v5", "--total-timesteps", "300", "--learning-starts", "200", "--batch-size", "64"]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("short_run")
    args = [*SHORT_RUN, "--policy-frequency", "3", "--progress-interval", "0"]
    result = run_script(SCRIPT, *args, cwd=cwd, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return result, read_scalars(run_dir)


def test_short_run_updates_the_critic_every_step_and_the_actor_every_third(short_run):
    result, _ = short_run
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("finished 300 steps, 100 critic updates, 34 actor updates"), summary


def test_short_run_logs_every_tag_and_each_episode_at_its_own_step(short_run):
    _, scalars = short_run
    assert set(DDPG_TAGS) <= set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [100, 200, 300]
    for tag in DDPG_TAGS[3:]:
        assert [step for step, _ in scalars[tag]] == [300], tag
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag
    steps = [step for step, _ in scalars["charts/episodic_length"]]
    assert len(steps) >= 3 and steps == list(np.cumsum([length for _, length in scalars["charts/episodic_length"]]))
    assert [step for step, _ in scalars["charts/episodic_return"]] == steps


def test_short_run_prints_a_progress_line_at_each_log_point(short_run):
    result, _ = short_run
    assert progress_steps(result.stderr) == [100, 200, 300]


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ddpg.Progress, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
def test_loaded_actor_equals_saved_actor_bounds_included(tmp_path):
    assert_loaded_actor_equals_saved_actor_bounds_included(ddpg, "QNetwork", tmp_path)


def test_evaluation_plays_the_saved_actors_action_without_noise(tmp_path, monkeypatch):
    assert_evaluation_plays_the_saved_actors_action_without_noise(ddpg, "QNetwork", tmp_path, monkeypatch)


def test_save_then_evaluate_round_trip_reproduces_the_evaluation(tmp_path, monkeypatch, capsys):
    assert_save_then_evaluate_reproduces_the_evaluation(ddpg, tmp_path, monkeypatch, capsys)


def test_a_saved_policy_of_an_env_not_here_or_a_corrupt_one_is_a_one_line_error(tmp_path, monkeypatch):
    assert_a_saved_policy_of_an_env_not_here_is_a_one_line_error(ddpg, "QNetwork", tmp_path, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
def test_a_resumed_run_goes_on_where_its_checkpoint_left_it(tmp_path, monkeypatch, capsys):
    assert_run_resumes_where_its_checkpoint_left_it(ddpg, tmp_path, monkeypatch, capsys)


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(ddpg, tmp_path, "step", 9)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_from_the_command_line_is_a_one_line_error_without_traceback(tmp_path):
    result = run_script(SCRIPT, "--exploration-noise", "-0.1", cwd=tmp_path, env=ONE_THREAD, timeout=120)
    assert_user_error(result, "--exploration-noise must not be negative, got -0.1")


@pytest.mark.parametrize("overrides, fragment", BAD_INPUT, ids=bad_input_id)
def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, overrides, fragment):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(ddpg.main, ddpg.Args(**overrides), fragment)
