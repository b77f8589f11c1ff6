"""Specification of cleanrl/ppo_atari_lstm.py: ppo_atari.py's PPO with an LSTM core, whose state is reset
where a learning episode begins, carried through the rollout, and replayed by whole env sequences."""

import dataclasses

import numpy as np
import pytest
import torch
from checkpoints import (
    assert_run_resumes_where_its_checkpoint_left_it,
    assert_the_newest_checkpoints_are_kept_by_their_number,
    assert_the_random_stream_goes_on_after_a_resume,
)
from evaluation import (
    assert_corrupt_checkpoint_rejected,
    assert_evaluation_warns_when_emulator_settings_differ,
    evaluate_saved_model,
    train_and_save_a_model,
)
from fake_envs import recording_make_envs
from references import assert_gae_matches_reference, assert_ppo_loss_matches_reference
from run_outputs import (
    assert_freed_memory_is_kept,
    assert_game_0_video_logged_as_wandb_media,
    assert_losses_are_finite,
    assert_progress_follows_the_convention,
    assert_progress_line_per_iteration,
    assert_rollout_acts_with_the_updated_weights,
    assert_short_atari_run_logged,
    assert_videos_show_whole_games_of_env_0,
    assert_warns_when_bf16_is_slow,
    capped_cubic_games,
)
from running import (
    assert_atari_ranges_are_checked,
    assert_ppo_ranges_are_checked,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
    run_tracked,
)

import cleanrl.ppo_atari_lstm as ppo_lstm

SCRIPT = "ppo_atari_lstm.py"
# A short run: 2 envs x 128 steps, one env's sequence a minibatch, 4 iterations. Random play finishes a
# few Breakout games in it.
SHORT_RUN = ["--num-envs", "2", "--num-steps", "128", "--num-minibatches", "2", "--total-timesteps", "1024"]


# --- The LSTM unroll ---------------------------------------------------------------------------
def reference_unroll(lstm, features, starts, lstm_state):
    """The LSTM written out, one env and one step at a time, in float64: before a step that begins an
    episode the state is zero; then i, f, g, o = W_ih x + b_ih + W_hh h + b_hh (torch's gate order),
    c = sigmoid(f) c + sigmoid(i) tanh(g), h = sigmoid(o) tanh(c)."""
    w_ih, w_hh = lstm.weight_ih_l0.double(), lstm.weight_hh_l0.double()
    bias = (lstm.bias_ih_l0 + lstm.bias_hh_l0).double()
    num_steps, num_envs = starts.shape
    outputs = torch.zeros(num_steps, num_envs, lstm.hidden_size, dtype=torch.float64)
    final_h, final_c = [], []
    for env in range(num_envs):
        h, c = lstm_state[0][env].double(), lstm_state[1][env].double()
        for t in range(num_steps):
            if starts[t, env]:
                h, c = torch.zeros_like(h), torch.zeros_like(c)
            i, f, g, o = (w_ih @ features[t, env].double() + w_hh @ h + bias).chunk(4)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outputs[t, env] = h
        final_h.append(h)
        final_c.append(c)
    return outputs, (torch.stack(final_h), torch.stack(final_c))


def rollout_data(num_steps=12, num_envs=4, seed=0):
    """An LSTM, features, starts and a non-zero initial state. Env 0 starts anew at steps 3 and 8, env 1
    at step 0 (its initial state must be dropped), env 2 at two steps in a row, env 3 never."""
    torch.manual_seed(seed)
    lstm = ppo_lstm.Agent(4).lstm.double()
    features = torch.randn(num_steps, num_envs, 512, dtype=torch.float64)
    starts = torch.zeros(num_steps, num_envs, dtype=torch.float64)
    starts[[3, 8], 0] = 1
    starts[0, 1] = 1
    starts[[5, 6], 2] = 1
    lstm_state = tuple(torch.randn(num_envs, 128, dtype=torch.float64) for _ in range(2))
    return lstm, features, starts, lstm_state


def assert_unroll_matches_the_reference(unroll):
    """unroll(lstm, features, starts, lstm_state) against reference_unroll: every output and the final state."""
    lstm, features, starts, lstm_state = rollout_data()
    with torch.no_grad():
        outputs, (h, c) = unroll(lstm, features, starts, lstm_state)
        expected, (expected_h, expected_c) = reference_unroll(lstm, features, starts, lstm_state)
    torch.testing.assert_close(outputs, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, expected_h, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(c, expected_c, rtol=1e-10, atol=1e-10)


def assert_minibatches_replay_each_env_from_the_rollouts_initial_state(unroll):
    """The update's replay: the envs split into minibatches in a shuffled order, each minibatch unrolled over
    its envs' whole sequences from the rollout's initial state of those envs (gathered by index), gives each
    env the outputs of the reference rollout of all envs."""
    lstm, features, starts, lstm_state = rollout_data()
    expected, _ = reference_unroll(lstm, features, starts, lstm_state)
    with torch.no_grad():
        for minibatch in (torch.tensor([2, 0]), torch.tensor([3, 1])):
            state = tuple(torch.index_select(s, 0, minibatch) for s in lstm_state)
            outputs, _ = unroll(lstm, features[:, minibatch], starts[:, minibatch], state)
            torch.testing.assert_close(outputs, expected[:, minibatch], rtol=1e-10, atol=1e-10)


def test_the_unroll_resets_the_state_where_an_episode_begins_and_carries_it_elsewhere():
    assert_unroll_matches_the_reference(ppo_lstm.lstm_unroll)


def test_minibatches_of_env_sequences_replay_the_rollouts_states():
    assert_minibatches_replay_each_env_from_the_rollouts_initial_state(ppo_lstm.lstm_unroll)


def test_the_rollouts_steps_one_at_a_time_give_the_states_of_the_whole_sequence():
    # The rollout calls the unroll with sequences of one step, carrying the state: the same numbers.
    lstm, features, starts, lstm_state = rollout_data()
    expected, _ = reference_unroll(lstm, features, starts, lstm_state)
    with torch.no_grad():
        for t in range(starts.shape[0]):
            output, lstm_state = ppo_lstm.lstm_unroll(lstm, features[t : t + 1], starts[t : t + 1], lstm_state)
            torch.testing.assert_close(output[0], expected[t], rtol=1e-10, atol=1e-10)


def never_resets(lstm, features, starts, lstm_state):
    return ppo_lstm.lstm_unroll(lstm, features, torch.zeros_like(starts), lstm_state)


def resets_one_step_late(lstm, features, starts, lstm_state):
    # the state zeroed after the step that begins the episode, not before it
    late = torch.cat([torch.zeros_like(starts[:1]), starts[:-1]])
    return ppo_lstm.lstm_unroll(lstm, features, late, lstm_state)


def replays_from_a_zero_state(lstm, features, starts, lstm_state):
    return ppo_lstm.lstm_unroll(lstm, features, starts, tuple(torch.zeros_like(s) for s in lstm_state))


@pytest.mark.parametrize("wrong_unroll", [never_resets, resets_one_step_late, replays_from_a_zero_state])
def test_an_unroll_that_resets_wrongly_is_caught(wrong_unroll):
    with pytest.raises(AssertionError):
        assert_unroll_matches_the_reference(wrong_unroll)
    with pytest.raises(AssertionError):
        assert_minibatches_replay_each_env_from_the_rollouts_initial_state(wrong_unroll)


def test_bf16_autocast_leaves_the_lstm_and_the_heads_in_fp32():
    # The state sums 128 steps of updates, and values and log-probabilities feed GAE and the ratio: under
    # bf16 autocast they are still the fp32 LSTM and heads applied to the (bf16) conv features.
    torch.manual_seed(0)
    agent = ppo_lstm.Agent(4)
    obs = torch.randint(0, 256, (6, 2, 1, 84, 84), dtype=torch.uint8)
    starts, action = torch.zeros(6, 2), torch.randint(0, 4, (6, 2))
    starts[3, 1] = 1
    lstm_state = agent.initial_state(2)
    with torch.autocast("cpu", torch.bfloat16):
        features = agent.hidden(obs.flatten(0, 1))
        _, logprob, _, value, _ = agent.get_action_and_value(obs, starts, lstm_state, action)
    assert features.dtype == torch.bfloat16
    outputs, _ = ppo_lstm.lstm_unroll(agent.lstm, features.float().view(6, 2, 512), starts, lstm_state)
    expected_logprob = torch.distributions.Categorical(logits=agent.actor(outputs)).log_prob(action)
    torch.testing.assert_close(value, agent.critic(outputs).squeeze(-1), rtol=0, atol=0)
    torch.testing.assert_close(logprob, expected_logprob, rtol=0, atol=0)


# --- GAE and the PPO loss: ppo_atari.py's ---------------------------------------------------------
def test_gae_matches_the_textbook_definition():
    assert_gae_matches_reference(ppo_lstm.compute_gae, torch.tensor)


def test_ppo_loss_matches_the_clipped_objective_of_the_paper():
    assert_ppo_loss_matches_reference(ppo_lstm.ppo_loss, ppo_lstm.Args())


# --- The training loop ----------------------------------------------------------------------------
def test_with_a_learning_rate_of_0_every_minibatch_replays_the_rollouts_probabilities_and_values(tmp_path, monkeypatch):
    # Weights that never change: each minibatch, in every epoch, replays its envs' sequences from the
    # rollout's initial state with the rollout's resets, so it must find the log-probabilities and values
    # the rollout stored, in the second iteration too (which starts from the state the first one left).
    monkeypatch.chdir(tmp_path)
    losses, unrolled_starts = [], []
    real_ppo_loss, real_unroll = ppo_lstm.ppo_loss, ppo_lstm.lstm_unroll

    def ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args):
        losses.append((newlogprob.detach(), logprobs, newvalue.detach(), values))
        return real_ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)

    def lstm_unroll(lstm, features, starts, lstm_state):
        if starts.shape[0] > 1:
            unrolled_starts.append(starts.clone())
        return real_unroll(lstm, features, starts, lstm_state)

    monkeypatch.setattr(ppo_lstm, "ppo_loss", ppo_loss)
    monkeypatch.setattr(ppo_lstm, "lstm_unroll", lstm_unroll)
    args = ppo_lstm.Args(num_envs=4, num_steps=64, num_minibatches=2, update_epochs=2, total_timesteps=512)
    ppo_lstm.main(dataclasses.replace(args, learning_rate=0.0, cuda=False))
    assert len(losses) == 2 * 2 * 2
    assert any(starts[1:].any() for starts in unrolled_starts), "some sequence starts anew inside the rollout"
    for newlogprob, logprobs, newvalue, values in losses:
        torch.testing.assert_close(newlogprob, logprobs, rtol=0, atol=1e-5)
        torch.testing.assert_close(newvalue, values, rtol=0, atol=1e-5)


def test_rollout_ends_episodes_at_life_losses_and_bootstraps_time_limits_with_the_state_of_that_step(
    tmp_path, monkeypatch
):
    # One iteration of 2 envs x 128 steps with a 60-step time limit: random play loses lives, finishes
    # games and hits the limit. Before the update (compute_gae sees the rollout), the agent that played
    # it replays the recorded observations: dones at every life loss, game over and time limit; rewards
    # clipped to their sign, plus gamma * V(the real last observation, seen with the LSTM state that
    # step left) where the time limit stopped a game that went on.
    monkeypatch.chdir(tmp_path)
    made = recording_make_envs(ppo_lstm, monkeypatch, observations=True)
    agents, real_agent = [], ppo_lstm.Agent
    monkeypatch.setattr(ppo_lstm, "Agent", lambda *a: agents.append(real_agent(*a)) or agents[-1])
    args = ppo_lstm.Args(num_envs=2, num_steps=128, num_minibatches=2, total_timesteps=256, max_episode_steps=60)
    checked = []
    real_compute_gae = ppo_lstm.compute_gae

    def compute_gae(rewards, values, dones, *rest):
        envs, agent = made[0], agents[0]
        lives = np.full(2, 5)
        start, lstm_state = torch.ones(2), agent.initial_state(2)
        life_losses = truncations = 0
        for t, (reward, terminated, truncated, info) in enumerate(envs.steps):
            obs = torch.from_numpy(envs.observations[t])
            with torch.no_grad():
                _, lstm_state = agent.core(obs[None], start[None], lstm_state)
                final_obs = torch.from_numpy(info["final_obs"]) if truncated.any() else None
                final_value = (
                    agent.get_value(final_obs[None], torch.zeros(1, 2), lstm_state)[0] if truncated.any() else 0
                )
            life_lost = (info["lives"] < lives) & ~(terminated | truncated)
            lives = info["lives"]
            done = terminated | truncated | life_lost
            np.testing.assert_array_equal(dones[t].numpy(), done.astype(np.float32), err_msg=f"step {t}")
            bootstrap = args.gamma * np.asarray(final_value) * (truncated & ~terminated)
            np.testing.assert_allclose(rewards[t].numpy(), np.sign(reward) + bootstrap, rtol=1e-5, atol=1e-5)
            start = torch.from_numpy(done).float()
            life_losses += life_lost.sum()
            truncations += (truncated & ~terminated).sum()
        checked.append((life_losses, truncations))
        return real_compute_gae(rewards, values, dones, *rest)

    monkeypatch.setattr(ppo_lstm, "compute_gae", compute_gae)
    ppo_lstm.main(args)
    ((life_losses, truncations),) = checked
    assert life_losses > 0 and truncations > 0, (life_losses, truncations)


def test_episode_statistics_count_every_step_and_reset_at_game_over():
    stats = ppo_lstm.EpisodeStatistics(2)
    assert stats.step(np.array([1.0, 4.0]), np.array([False, False])) == []
    assert stats.step(np.array([2.0, 0.0]), np.array([True, False])) == [(0, 3.0, 2)]
    assert stats.step(np.array([5.0, 1.0]), np.array([True, True])) == [(0, 5.0, 1), (1, 5.0, 3)]


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "Breakout-v5"])
def test_env_id_styles_name_the_same_game(env_id):
    assert ppo_lstm.atari_game(env_id) == "breakout"


def test_the_agent_sees_one_frame_a_step():
    envs = ppo_lstm.make_envs("BreakoutNoFrameskip-v4", 2, 0.0)
    obs, _ = envs.reset(seed=1)
    envs.close()
    assert obs.shape == (2, 1, 84, 84) and obs.dtype == np.uint8


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run for the tests of what a run logs, records, uploads and prints: videos on,
    tracked (wandb offline), a progress line every iteration."""
    cwd = tmp_path_factory.mktemp("short_run")
    return cwd, run_tracked(SCRIPT, *SHORT_RUN, "--capture-video", "--progress-interval", "0", cwd=cwd)


def test_short_training_run_logs_every_tag_for_every_iteration(short_run):
    cwd, result = short_run
    assert "finished 4 iterations, 1024 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    assert_short_atari_run_logged(run_dir, batch_size=256)


def test_wandb_offline_run_is_created_with_the_videos(short_run):
    cwd, _ = short_run
    assert_game_0_video_logged_as_wandb_media(cwd)


def test_capture_video_writes_rgb_videos_of_whole_games_of_env_0(short_run):
    cwd, _ = short_run
    # A video holds its game's first screen and one screen per step.
    assert_videos_show_whole_games_of_env_0(cwd, num_envs=2, extra_screens=1)


def test_off_a_terminal_progress_interval_0_prints_a_plain_progress_line_per_iteration(short_run):
    cwd, result = short_run
    assert_progress_line_per_iteration(result.stderr, read_scalars(run_dirs(cwd)[0]), batch_size=256, iterations=4)


def test_bf16_rollout_acts_with_the_weights_of_the_last_update_and_its_losses_are_finite(tmp_path):
    # One minibatch of every env's sequence, one epoch: the update's first forward (autocast on the fp32
    # weights, the whole sequences replayed) gives back the rollout's log-probabilities (a bf16 copy of
    # those weights, one step at a time), so approx-KL is nil at every iteration.
    one_minibatch = ["--num-minibatches", "1", "--update-epochs", "1", "--mixed-precision", "bf16"]
    result = run_script(SCRIPT, *SHORT_RUN[:-1], "768", *one_minibatch, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "finished 3 iterations" in result.stdout
    (run_dir,) = run_dirs(tmp_path)
    assert_losses_are_finite(run_dir)
    assert_rollout_acts_with_the_updated_weights(run_dir)


def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, capsys):
    assert_warns_when_bf16_is_slow(ppo_lstm, monkeypatch, capsys)


def test_freed_memory_is_kept_for_reuse():
    assert_freed_memory_is_kept(ppo_lstm)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ppo_lstm.Progress, monkeypatch)


def test_video_schedule_is_capped_cubic():
    assert [game for game in range(3001) if ppo_lstm.capped_cubic(game)] == capped_cubic_games(3001)


# --- Saving, evaluation, checkpoints ----------------------------------------------------------------
def test_save_then_evaluate_round_trip(tmp_path):
    result, model_path = train_and_save_a_model(SCRIPT, *SHORT_RUN[:-1], "256", "--eval-episodes", "1", cwd=tmp_path)
    assert result.stdout.count("eval_episode=") == 1
    evaluate_saved_model(SCRIPT, model_path, 2, cwd=tmp_path)


def test_loaded_model_equals_saved_model(tmp_path):
    torch.manual_seed(0)
    agent = ppo_lstm.Agent(4).to(memory_format=torch.channels_last)  # as load_model gives it
    path = str(tmp_path / "model.cleanrl_model")
    ppo_lstm.save_model(path, agent, ppo_lstm.Args())
    loaded, saved_args = ppo_lstm.load_model(path, torch.device("cpu"))
    assert saved_args["env_id"] == ppo_lstm.Args().env_id
    obs, starts = torch.randint(0, 256, (5, 3, 1, 84, 84), dtype=torch.uint8), torch.zeros(5, 3)
    starts[2, 0] = 1
    lstm_state = tuple(torch.randn(3, 128) for _ in range(2))
    torch.testing.assert_close(
        loaded.get_value(obs, starts, lstm_state), agent.get_value(obs, starts, lstm_state), rtol=0, atol=0
    )


def test_evaluation_plays_whole_games_and_resets_the_state_where_training_does(monkeypatch):
    # 3 envs play one game each to its end (all 5 lives, no time limit); the agent is asked to begin anew
    # at the first step and after every life loss and game over, nowhere else, and carries its state.
    made = recording_make_envs(ppo_lstm, monkeypatch)
    agent, calls = ppo_lstm.Agent(4), []
    real_get_action_and_value = agent.get_action_and_value

    def get_action_and_value(obs, starts, lstm_state, action=None):
        calls.append((starts.clone(), lstm_state))
        result = real_get_action_and_value(obs, starts, lstm_state, action)
        calls[-1] += (result[-1],)
        return result

    monkeypatch.setattr(agent, "get_action_and_value", get_action_and_value)
    returns = ppo_lstm.evaluate(agent, "BreakoutNoFrameskip-v4", 3, torch.device("cpu"), ppo_lstm.Args(), seed=1)
    assert len(returns) == 3 and all(r >= 0 for r in returns)
    (envs,) = made
    lives, expected_start, drops, scores = np.full(3, 5), np.ones(3), np.zeros(3), np.zeros(3)
    finished = np.zeros(3, bool)
    for t, (reward, terminated, truncated, info) in enumerate(envs.steps):
        starts, state_in, _ = calls[t]
        np.testing.assert_array_equal(starts[0].numpy(), expected_start, err_msg=f"step {t}")
        if t > 0:
            assert all(torch.equal(state_in[k], calls[t - 1][2][k]) for k in range(2)), "the state is carried"
        assert not truncated.any()
        life_lost = info["lives"] < lives
        drops += life_lost & ~terminated & ~finished
        scores += reward * ~finished
        finished |= terminated
        expected_start = (terminated | life_lost).astype(np.float32)
        lives = info["lives"]
    assert finished.all() and (drops == 4).all(), drops
    assert sorted(scores) == sorted(returns)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(ppo_lstm, tmp_path)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected(SCRIPT, tmp_path)


def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory(tmp_path, monkeypatch, capsys):
    args = dict(num_envs=2, num_steps=64, num_minibatches=2, cuda=False)
    assert_run_resumes_where_its_checkpoint_left_it(ppo_lstm, tmp_path, monkeypatch, capsys, args)


def test_after_a_resume_the_random_stream_goes_on_from_the_checkpoint(tmp_path, monkeypatch):
    assert_the_random_stream_goes_on_after_a_resume(ppo_lstm, tmp_path, monkeypatch)


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(ppo_lstm, tmp_path, "iteration", 7)


# --- Bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown Atari env id"),
        (["--num-envs", "6", "--num-minibatches", "4"], "--num-envs 6 is not divisible by --num-minibatches 4"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--num-envs", "1", "--num-steps", "1", "--num-minibatches", "1"], "cannot normalize advantages"),
        (["--update-epochs", "0"], "must be positive"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be 0 (never) or positive"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script(SCRIPT, *args, cwd=tmp_path), message)


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(
        ppo_lstm.check_args, lambda **o: ppo_lstm.Args(batch_size=1024, minibatch_size=256, num_iterations=9765, **o)
    )
    assert_ppo_ranges_are_checked(ppo_lstm.check_args, ppo_lstm.Args)
