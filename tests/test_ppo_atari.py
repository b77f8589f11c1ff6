"""Specification of cleanrl/ppo_atari.py."""

import ale_py
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
    assert_saved_model_loads_identically,
    evaluate_saved_model,
    train_and_save_a_model,
)
from fake_envs import assert_rollout_dones_and_rewards, recording_make_envs
from references import assert_gae_matches_reference, assert_ppo_loss_matches_reference
from run_outputs import (
    assert_bf16_run_gives_finite_losses,
    assert_freed_memory_is_kept,
    assert_game_0_video_logged_as_wandb_media,
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

import cleanrl.ppo_atari as ppo_atari

# A short run: 2 envs x 128 steps, 4 iterations. Random play finishes a few Breakout games in it.
SHORT_RUN = ["--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1024"]


def test_gae_matches_the_textbook_definition():
    assert_gae_matches_reference(ppo_atari.compute_gae, torch.tensor)


def test_ppo_loss_matches_the_clipped_objective_of_the_paper():
    assert_ppo_loss_matches_reference(ppo_atari.ppo_loss, ppo_atari.Args())


def test_bf16_autocast_leaves_the_heads_in_fp32():
    # Values and log-probabilities feed GAE and the ratio: under bf16 autocast they must still be the
    # fp32 heads applied to the (bf16) hidden features, not bf16-rounded numbers.
    torch.manual_seed(0)
    agent = ppo_atari.Agent(4)
    obs = torch.randint(0, 256, (16, 4, 84, 84), dtype=torch.uint8)
    action = torch.randint(0, 4, (16,))
    with torch.autocast("cpu", torch.bfloat16):
        hidden = agent.hidden(obs)
        _, logprob, _, value = agent.get_action_and_value(obs, action)
    assert hidden.dtype == torch.bfloat16
    expected_value = agent.critic(hidden.float())
    expected_logprob = torch.distributions.Categorical(logits=agent.actor(hidden.float())).log_prob(action)
    torch.testing.assert_close(value, expected_value, rtol=0, atol=0)
    torch.testing.assert_close(logprob, expected_logprob, rtol=0, atol=0)


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "Breakout-v5"])
def test_env_id_styles_name_the_same_game(env_id):
    assert ppo_atari.atari_game(env_id) == "breakout"


def test_multiword_env_ids_map_to_their_rom():
    assert ppo_atari.atari_game("SpaceInvadersNoFrameskip-v4") == "space_invaders"
    assert ppo_atari.atari_game("ALE/MontezumaRevenge-v5") == "montezuma_revenge"


def replay_in_raw_emulator(seed: int, actions: list[int]) -> list[tuple[float, int]]:
    """Plays the same actions in a bare ALEInterface (fire on reset, 4 frames per action);
    returns (score, agent steps) of each finished game."""
    ale = ale_py.ALEInterface()
    ale.setInt("random_seed", seed)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(ale_py.roms.get_rom_path("breakout"))
    action_set = ale.getMinimalActionSet()
    ale.reset_game()
    ale.act(action_set[1])  # FIRE, as the vector env's fire reset
    games, score, length = [], 0.0, 0
    for action in actions:
        for _ in range(4):
            score += ale.act(action_set[action])
            if ale.game_over():
                break
        length += 1
        if ale.game_over():
            games.append((score, length))
            break  # the vector env reseeds its next game; comparing the first game per env is enough
    return games


def test_episode_statistics_are_whole_unclipped_games_of_the_raw_emulator():
    # Noop starts off, so the raw emulator can replay the exact same game.
    num_envs, seed = 3, 7
    envs = ppo_atari.make_envs("BreakoutNoFrameskip-v4", num_envs, 0.0, noop_max=0)
    stats = ppo_atari.EpisodeStatistics(num_envs)
    envs.reset(seed=seed)
    rng = np.random.default_rng(0)
    actions = [[] for _ in range(num_envs)]
    first_games = {}
    saw_life_loss_without_game_over = False
    lives = np.full(num_envs, 5)
    while len(first_games) < num_envs:
        action = rng.integers(0, 4, size=num_envs)
        for i in range(num_envs):
            if i not in first_games:
                actions[i].append(int(action[i]))
        _, reward, terminated, truncated, info = envs.step(action)
        life_lost = (info["lives"] < lives) & ~(terminated | truncated)
        saw_life_loss_without_game_over |= bool(life_lost.any())
        lives = info["lives"].copy()
        for i, episodic_return, episodic_length in stats.step(reward, terminated | truncated):
            first_games.setdefault(i, (episodic_return, episodic_length))
    envs.close()

    assert saw_life_loss_without_game_over, "a life loss must not end the game"
    for i in range(num_envs):
        raw_games = replay_in_raw_emulator(seed + i, actions[i])
        assert raw_games == [first_games[i]], f"env {i}"


def test_episode_statistics_count_every_step_and_reset_at_game_over():
    stats = ppo_atari.EpisodeStatistics(2)
    assert stats.step(np.array([1.0, 4.0]), np.array([False, False])) == []
    assert stats.step(np.array([2.0, 0.0]), np.array([True, False])) == [(0, 3.0, 2)]
    assert stats.step(np.array([5.0, 1.0]), np.array([True, True])) == [(0, 5.0, 1), (1, 5.0, 3)]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run for the tests of what a run logs, records, uploads and prints: videos on,
    tracked (wandb offline), a progress line every iteration."""
    cwd = tmp_path_factory.mktemp("short_run")
    return cwd, run_tracked("ppo_atari.py", *SHORT_RUN, "--capture-video", "--progress-interval", "0", cwd=cwd)


def test_short_training_run_logs_every_tag_for_every_iteration(short_run):
    cwd, result = short_run
    assert "finished 4 iterations, 1024 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    assert_short_atari_run_logged(run_dir, batch_size=256)


def test_bf16_training_run_gives_finite_losses(tmp_path):
    assert_bf16_run_gives_finite_losses("ppo_atari.py", *SHORT_RUN[:-1], "512", cwd=tmp_path)


def test_bf16_rollout_acts_with_the_weights_of_the_last_update(tmp_path):
    one_minibatch = ["--num-minibatches", "1", "--update-epochs", "1", "--mixed-precision", "bf16"]
    result = run_script("ppo_atari.py", *SHORT_RUN, *one_minibatch, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_rollout_acts_with_the_updated_weights(run_dirs(tmp_path)[0])


def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, capsys):
    assert_warns_when_bf16_is_slow(ppo_atari, monkeypatch, capsys)


def test_freed_memory_is_kept_for_reuse():
    assert_freed_memory_is_kept(ppo_atari)


def test_save_then_evaluate_round_trip(tmp_path):
    result, model_path = train_and_save_a_model(
        "ppo_atari.py", *SHORT_RUN[:-1], "256", "--eval-episodes", "2", cwd=tmp_path
    )
    assert result.stdout.count("eval_episode=") == 2
    evaluate_saved_model("ppo_atari.py", model_path, 3, cwd=tmp_path)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(ppo_atari, tmp_path)


def test_loaded_model_equals_saved_model(tmp_path):
    assert_saved_model_loads_identically(ppo_atari, tmp_path)


def test_evaluation_plays_the_requested_number_of_whole_games(monkeypatch):
    made = recording_make_envs(ppo_atari, monkeypatch)
    agent = ppo_atari.Agent(4)
    returns = ppo_atari.evaluate(agent, "BreakoutNoFrameskip-v4", 3, torch.device("cpu"), ppo_atari.Args(), seed=1)
    assert len(returns) == 3 and all(r >= 0 for r in returns)
    # Each of the 3 envs played one game to its end: all 5 lives lost, no time limit, and the
    # returns are those games' whole scores.
    (envs,) = made
    lives = np.full(3, 5)
    for env in range(3):
        drops, score = 0, 0.0
        for reward, terminated, truncated, info in envs.steps:
            assert not truncated[env]
            score += reward[env]
            if terminated[env]:
                break
            drops += info["lives"][env] < lives[env]
            lives[env] = info["lives"][env]
        assert terminated[env] and drops == 4, (env, drops)
        assert score in returns


def test_rollout_ends_episodes_at_life_losses_and_bootstraps_only_time_limits(tmp_path, monkeypatch):
    # One iteration of 2 envs x 128 steps with a 60-step time limit: random play loses lives,
    # finishes games and hits the limit.
    monkeypatch.chdir(tmp_path)
    args = ppo_atari.Args(num_envs=2, num_steps=128, total_timesteps=256, max_episode_steps=60)
    assert_rollout_dones_and_rewards(ppo_atari, monkeypatch, ppo_atari.main, args)


def test_wandb_offline_run_is_created_with_the_videos(short_run):
    cwd, _ = short_run
    # game 0 of env 0 ends within 256 steps of random play
    assert_game_0_video_logged_as_wandb_media(cwd)


def test_video_schedule_is_capped_cubic():
    assert [game for game in range(3001) if ppo_atari.capped_cubic(game)] == capped_cubic_games(3001)


def test_capture_video_writes_rgb_videos_of_whole_games_of_env_0(short_run):
    cwd, _ = short_run
    # A video holds its game's first screen and one screen per step.
    assert_videos_show_whole_games_of_env_0(cwd, num_envs=2, extra_screens=1)


def test_off_a_terminal_progress_interval_0_prints_a_plain_progress_line_per_iteration(short_run):
    cwd, result = short_run
    assert_progress_line_per_iteration(result.stderr, read_scalars(run_dirs(cwd)[0]), batch_size=256, iterations=4)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ppo_atari.Progress, monkeypatch)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown Atari env id"),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--num-envs", "1", "--num-steps", "4", "--num-minibatches", "4"], "cannot normalize advantages"),
        (["--update-epochs", "0"], "must be positive"),
        (["--eval-episodes", "0"], "must be positive"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be 0 (never) or positive"),
        (["--max-episode-steps", "0"], "--max-episode-steps must be positive"),
        (["--clip-coef", "-0.1"], "--clip-coef must not be negative, got -0.1"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script("ppo_atari.py", *args, cwd=tmp_path), message)


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(
        ppo_atari.check_args, lambda **o: ppo_atari.Args(batch_size=1024, minibatch_size=256, num_iterations=9765, **o)
    )
    assert_ppo_ranges_are_checked(ppo_atari.check_args, ppo_atari.Args)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected("ppo_atari.py", tmp_path)


def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory(tmp_path, monkeypatch, capsys):
    args = dict(num_envs=2, num_steps=128, cuda=False)
    assert_run_resumes_where_its_checkpoint_left_it(ppo_atari, tmp_path, monkeypatch, capsys, args)


def test_after_a_resume_the_random_stream_goes_on_from_the_checkpoint(tmp_path, monkeypatch):
    assert_the_random_stream_goes_on_after_a_resume(ppo_atari, tmp_path, monkeypatch)


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(ppo_atari, tmp_path, "iteration", 7)
