"""Specification of cleanrl/ppo_atari_envpool.py, and of the envpool behaviour it relies on."""

import numpy as np
import pytest
import torch
from checkpoints import assert_run_resumes_where_its_checkpoint_left_it
from evaluation import (
    assert_corrupt_checkpoint_rejected,
    assert_evaluation_warns_when_emulator_settings_differ,
    assert_saved_model_loads_identically,
    evaluate_saved_model,
    train_and_save_a_model,
)
from fake_envs import assert_time_limit_cuts_only_episodes_that_go_on, recording_make_envs
from references import assert_gae_matches_reference, assert_ppo_loss_matches_reference
from run_outputs import (
    assert_bf16_run_gives_finite_losses,
    assert_freed_memory_is_kept,
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
)

import cleanrl.ppo_atari_envpool as ppo_envpool

SCRIPT = "ppo_atari_envpool.py"
# A short run: 2 envs x 128 steps, 4 iterations. Random play finishes a few Breakout games in it.
SHORT_RUN = ["--num-envs", "2", "--num-steps", "128", "--total-timesteps", "1024"]


def breakout_score(ram: np.ndarray) -> int:
    """The score Breakout keeps in its own RAM: two BCD bytes, hundreds at 76, units and tens at 77."""
    bcd = lambda byte: (int(byte) >> 4) * 10 + (int(byte) & 15)
    return bcd(ram[76]) * 100 + bcd(ram[77])


# --- The math ---------------------------------------------------------------------------------
def test_gae_matches_the_textbook_definition():
    assert_gae_matches_reference(ppo_envpool.compute_gae, torch.tensor)


def test_ppo_loss_matches_the_clipped_objective_of_the_paper():
    assert_ppo_loss_matches_reference(ppo_envpool.ppo_loss, ppo_envpool.Args())


def test_a_truncated_step_bootstraps_from_the_value_of_the_observation_stored_after_it():
    rewards = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    values = torch.tensor([[0.5, 0.1], [0.2, 0.3], [0.4, 0.6]])
    truncations = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])
    next_value = torch.tensor([0.7, 0.9])
    bootstrapped = ppo_envpool.bootstrap_truncations(rewards, values, truncations, next_value, 0.5)
    expected = torch.tensor([[1.0 + 0.5 * 0.2, 0.0], [0.0, 1.0], [1.0, 1.0 + 0.5 * 0.9]])
    torch.testing.assert_close(bootstrapped, expected, rtol=0, atol=1e-7)
    # With done = 1 at the truncated step, its advantage is r + gamma * V(last observation) - V(s).
    dones = truncations
    advantages, _ = ppo_envpool.compute_gae(bootstrapped, values, dones, next_value, 0.5, 0.95)
    torch.testing.assert_close(advantages[0, 0], torch.tensor(1.0 + 0.5 * 0.2 - 0.5))


def test_the_time_limit_is_bootstrapped_only_where_the_learning_episode_goes_on():
    assert_time_limit_cuts_only_episodes_that_go_on(ppo_envpool)


def test_minibatches_hold_every_played_step_once_and_no_reset_step():
    played = torch.rand(128, 8, generator=torch.Generator().manual_seed(0)) > 0.05
    minibatches = ppo_envpool.played_minibatches(played, 4)
    assert len(minibatches) == 4
    assert max(len(m) for m in minibatches) - min(len(m) for m in minibatches) <= 1
    indices = torch.cat(minibatches)
    assert sorted(indices.tolist()) == torch.nonzero(played.reshape(-1)).flatten().tolist()


def test_the_update_learns_from_every_step_but_the_reset_steps_after_an_episode_ends(tmp_path, monkeypatch):
    # A run's update is given the steps played: all but those that follow a lost life, a game over or a
    # time-limit cut (envpool ignores their actions), also across the end of a rollout.
    monkeypatch.chdir(tmp_path)
    made, masks, real_played_minibatches = (
        recording_make_envs(ppo_envpool, monkeypatch),
        [],
        ppo_envpool.played_minibatches,
    )
    monkeypatch.setattr(
        ppo_envpool,
        "played_minibatches",
        lambda played, n: masks.append(played.clone()) or real_played_minibatches(played, n),
    )
    args = dict(num_envs=2, num_steps=64, num_minibatches=2, update_epochs=1, max_episode_steps=100, cuda=False)
    ppo_envpool.main(ppo_envpool.Args(env_id="Breakout-v5", total_timesteps=3 * 128, **args))
    ended = np.array([terminated | truncated for _, terminated, truncated, _ in made[0].steps])
    expected = np.concatenate([np.ones((1, 2), bool), ~ended[:-1]])
    assert len(masks) == 3 and (~expected).sum() >= 3, "lives lost and time limits hit: some reset steps"
    np.testing.assert_array_equal(torch.cat(masks).numpy(), expected)


def test_fewer_played_steps_than_minibatches_give_fewer_minibatches_none_empty():
    # Tiny settings (1 env, 2 steps, 4 minibatches, --no-norm-adv) can leave 1 played step: no empty minibatch.
    played = torch.tensor([[False], [True]])
    assert [m.tolist() for m in ppo_envpool.played_minibatches(played, 4)] == [[1]]


def test_a_minibatch_left_with_one_played_step_gives_a_finite_loss():
    # Reset steps leave the update, so tiny settings can leave one sample in a minibatch: advantage
    # normalization must not divide by a NaN standard deviation.
    args = ppo_envpool.Args()
    one = lambda value: torch.tensor([value])
    loss, stats = ppo_envpool.ppo_loss(one(-1.0), one(1.2), one(0.5), one(-1.1), one(3.0), one(1.0), one(0.4), args)
    assert torch.isfinite(loss) and all(torch.isfinite(value) for value in stats.values())


# --- Environment ids --------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["Breakout-v5", "ALE/Breakout-v5", "BreakoutNoFrameskip-v4"])
def test_env_id_styles_name_the_same_envpool_task(env_id):
    assert ppo_envpool.envpool_task(env_id) == "Breakout-v5"


def test_multiword_env_ids_map_to_their_envpool_task():
    assert ppo_envpool.envpool_task("SpaceInvadersNoFrameskip-v4") == "SpaceInvaders-v5"
    assert ppo_envpool.envpool_task("ALE/MontezumaRevenge-v5") == "MontezumaRevenge-v5"


@pytest.mark.parametrize("env_id", ["NoSuchGame-v5", "Ant-v5", "CartPole-v1"])
def test_non_atari_or_unknown_ids_are_rejected(env_id):
    with pytest.raises(SystemExit, match="unknown Atari env id"):
        ppo_envpool.envpool_task(env_id)


# --- The envpool behaviour the script relies on ----------------------------------------------
def test_the_step_after_an_episode_ends_is_a_reset_step_that_ignores_the_action():
    # Without no-op starts and sticky actions two environments play the same game whatever their
    # seed, so different actions at the reset steps only would show if those actions were played.
    envs = ppo_envpool.make_envs("Breakout-v5", 2, 0.0, 1, 27_000, noop_max=1)
    obs, _ = envs.reset()
    rng = np.random.default_rng(0)
    reset_step, reset_steps = False, 0
    for _ in range(600):
        action = np.array([0, 3]) if reset_step else np.repeat(rng.integers(0, 4), 2)
        obs, reward, terminated, truncated, info = envs.step(action)
        assert (obs[0] == obs[1]).all()
        if reset_step:
            reset_steps += 1
            assert (reward == 0).all()
        reset_step = bool(terminated[0] | truncated[0])
    envs.close()
    assert reset_steps >= 5, "several lives lost and a game over within 600 steps of random play"


def test_episodic_life_terminates_at_each_lost_life_and_the_game_goes_on():
    envs = ppo_envpool.make_envs("Breakout-v5", 1, 0.0, 1, 27_000)
    envs.reset()
    lives_at_terminations, game_over_flags = [], []
    for _ in range(1000):  # NOOPs only: the ball is launched by envpool's FIRE after each lost life
        _, _, terminated, _, info = envs.step(np.zeros(1, dtype=np.int64))
        if terminated[0]:
            lives_at_terminations.append(int(info["lives"][0]))
            game_over_flags.append(bool(info["terminated"][0]))
        if info["terminated"][0]:
            break
    envs.close()
    assert lives_at_terminations == [4, 3, 2, 1, 0]
    assert game_over_flags == [False, False, False, False, True]


def test_the_step_after_a_lost_life_plays_random_no_ops_then_fire():
    # Breakout's RAM byte 90 counts frames: a played step advances it by 4 (the frame skip), the reset step
    # after a lost life by its random no-op frames plus FIRE's, frames in which the agent does not act.
    envs = ppo_envpool.make_envs("Breakout-v5", 1, 0.0, 1, 27_000)
    _, info = envs.reset()
    frame, reset_step, played, after_lost_lives = int(info["ram"][0][90]), False, [], []
    for _ in range(1000):
        _, _, terminated, truncated, info = envs.step(np.zeros(1, dtype=np.int64))
        frames, frame = (int(info["ram"][0][90]) - frame) % 256, int(info["ram"][0][90])
        if info["terminated"][0]:  # the game over resets the counter
            break
        (after_lost_lives if reset_step else played).append(frames)
        reset_step = bool(terminated[0] or truncated[0])
    envs.close()
    assert set(played) == {4}
    assert len(after_lost_lives) == 4 and all(1 <= f <= 30 for f in after_lost_lives), after_lost_lives
    assert len(set(after_lost_lives)) > 1, "the number of no-ops is drawn at random"


def test_a_truncated_step_returns_the_real_last_observation_and_the_next_step_a_new_game():
    envs = ppo_envpool.make_envs("Breakout-v5", 1, 0.0, 1, 20)
    previous_obs, _ = envs.reset()
    for _ in range(20):
        obs, _, terminated, truncated, info = envs.step(np.array([2]))
        if truncated[0]:
            break
        previous_obs = obs
    assert truncated[0] and not terminated[0] and info["elapsed_step"][0] == 20 and info["lives"][0] == 5
    # The frame stack goes on: the truncated step's observation is the game's next frame, not a reset.
    assert (obs[0, :3] == previous_obs[0, 1:]).all()
    _, _, _, _, info = envs.step(np.array([2]))
    assert info["elapsed_step"][0] == 0
    envs.close()


# --- Episode statistics -----------------------------------------------------------------------
def test_episode_statistics_reset_the_score_at_game_over_or_time_limit_and_report_envpools_length():
    stats = ppo_envpool.EpisodeStatistics(2)
    info = lambda rewards, elapsed_steps: {"reward": np.array(rewards), "elapsed_step": np.array(elapsed_steps)}
    assert stats.step(info([1.0, 4.0], [1, 1]), np.array([False, False])) == []
    # env 0 truncated by the time limit: its score is not carried into its next game.
    assert stats.step(info([2.0, 0.0], [2, 2]), np.array([True, False])) == [(0, 3.0, 2)]
    assert stats.step(info([0.0, 0.0], [0, 3]), np.array([False, False])) == []
    assert stats.step(info([5.0, 1.0], [1, 4]), np.array([True, True])) == [(0, 5.0, 1), (1, 5.0, 4)]


def test_episode_statistics_are_each_games_own_score_and_length_including_truncated_games():
    # The loop of the script, on random actions, with a time limit that cuts some games; each finished
    # game is checked against the score in the game's RAM and the number of steps whose action was
    # played in it (counted here: the reset steps after its lost lives are not).
    num_envs, time_limit = 4, 160
    envs = ppo_envpool.make_envs("Breakout-v5", num_envs, 0.0, 3, time_limit)
    stats = ppo_envpool.EpisodeStatistics(num_envs)
    envs.reset()
    rng = np.random.default_rng(0)
    reset_step = np.zeros(num_envs, dtype=bool)
    played = np.zeros(num_envs, dtype=np.int64)
    after_scored_truncation = np.zeros(num_envs, dtype=bool)
    counts = {"game over": 0, "truncated": 0, "after a scored truncation": 0}
    for _ in range(3000):
        _, _, terminated, truncated, info = envs.step(rng.integers(0, 4, size=num_envs))
        game_over = info["terminated"].astype(bool) | truncated
        played += ~reset_step
        for i, episodic_return, episodic_length in stats.step(info, game_over):
            # A score carried over from a truncated game would exceed the RAM score of the next one.
            assert episodic_return == breakout_score(info["ram"][i]), f"env {i}"
            assert episodic_length == played[i], f"env {i}"
            if truncated[i]:
                assert episodic_length == time_limit and info["lives"][i] > 0
            else:
                assert info["lives"][i] == 0 and episodic_length < time_limit
            counts["truncated" if truncated[i] else "game over"] += 1
            counts["after a scored truncation"] += after_scored_truncation[i]
            after_scored_truncation[i] = truncated[i] and episodic_return > 0
        played[game_over] = 0
        reset_step = terminated | truncated
        if min(counts.values()) >= 3:
            break
    envs.close()
    assert min(counts.values()) >= 3, counts


# --- Whole runs of the script -----------------------------------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """One short run for the tests of what a run logs, records and prints: videos on, a progress
    line every iteration."""
    cwd = tmp_path_factory.mktemp("short_run")
    result = run_script(SCRIPT, *SHORT_RUN, "--capture-video", "--progress-interval", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    return cwd, result


def test_short_training_run_logs_every_tag_for_every_iteration(short_run):
    cwd, result = short_run
    assert "finished 4 iterations, 1024 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    scalars = assert_short_atari_run_logged(run_dir, batch_size=256)
    # Each game is logged at the global step where it ended, not all at the end of an iteration.
    assert any(step % 256 for step, _ in scalars["charts/episodic_return"])


def test_time_limit_truncates_training_games(tmp_path):
    result = run_script(SCRIPT, *SHORT_RUN[:-1], "256", "--max-episode-steps", "40", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    scalars = read_scalars(run_dirs(tmp_path)[0])
    # Random play loses all five lives in well over 40 steps: every game ends at the limit, and
    # each env finishes 3 of them in 128 steps (a reset step follows each lost life and each game).
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    assert lengths == [40] * len(lengths) and len(lengths) >= 4


def test_bf16_training_run_gives_finite_losses(tmp_path):
    assert_bf16_run_gives_finite_losses(SCRIPT, *SHORT_RUN[:-1], "512", cwd=tmp_path)


def test_bf16_rollout_acts_with_the_weights_of_the_last_update(tmp_path):
    one_minibatch = ["--num-minibatches", "1", "--update-epochs", "1", "--mixed-precision", "bf16"]
    result = run_script(SCRIPT, *SHORT_RUN, *one_minibatch, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert_rollout_acts_with_the_updated_weights(run_dirs(tmp_path)[0])


def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, capsys):
    assert_warns_when_bf16_is_slow(ppo_envpool, monkeypatch, capsys)


def test_freed_memory_is_kept_for_reuse():
    assert_freed_memory_is_kept(ppo_envpool)


def test_save_then_evaluate_round_trip(tmp_path):
    result, model_path = train_and_save_a_model(SCRIPT, *SHORT_RUN[:-1], "256", "--eval-episodes", "2", cwd=tmp_path)
    assert result.stdout.count("eval_episode=") == 2
    evaluate_saved_model(SCRIPT, model_path, 3, cwd=tmp_path)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(ppo_envpool, tmp_path)


def test_loaded_model_equals_saved_model(tmp_path):
    assert_saved_model_loads_identically(ppo_envpool, tmp_path)


def test_evaluation_plays_the_requested_number_of_whole_games(monkeypatch):
    made = recording_make_envs(ppo_envpool, monkeypatch)
    agent = ppo_envpool.Agent(4)
    returns = ppo_envpool.evaluate(agent, "Breakout-v5", 3, torch.device("cpu"), ppo_envpool.Args(), seed=1)
    assert len(returns) == 3 and all(r >= 0 and r == int(r) for r in returns)
    # Each of the 3 envs played one game to its real end: 5 lives lost (episodic life ends an
    # episode at each), no time limit, and the returns are those games' whole unclipped scores.
    (envs,) = made
    for env in range(3):
        lives_lost, score = 0, 0.0
        for _, terminated, truncated, info in envs.steps:
            assert not truncated[env]
            score += info["reward"][env]
            lives_lost += terminated[env]
            if info["terminated"][env]:
                break
        assert info["terminated"][env] and lives_lost == 5, (env, lives_lost)
        assert score in returns


def test_video_schedule_is_capped_cubic():
    assert [game for game in range(3001) if ppo_envpool.capped_cubic(game)] == capped_cubic_games(3001)


def test_capture_video_writes_rgb_videos_of_whole_games_of_env_0(short_run):
    cwd, _ = short_run
    # A whole game shows its first screen, one per step, and the screens of the 4 reset steps
    # after its first 4 lost lives (not counted in its length: their action is ignored).
    assert_videos_show_whole_games_of_env_0(cwd, num_envs=2, extra_screens=5)


def test_off_a_terminal_progress_interval_0_prints_a_plain_progress_line_per_iteration(short_run):
    cwd, result = short_run
    assert_progress_line_per_iteration(result.stderr, read_scalars(run_dirs(cwd)[0]), batch_size=256, iterations=4)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ppo_envpool.Progress, monkeypatch)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGame-v5"], "unknown Atari env id"),
        (["--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--max-episode-steps", "0"], "must be positive"),
        (["--update-epochs", "0"], "must be positive"),
        (["--eval-episodes", "0"], "must be positive"),
        (["--num-steps", "1"], "at least 2"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--checkpoint-every", "-1"], "--checkpoint-every must be 0 (never) or positive"),
        (["--clip-coef", "-0.1"], "--clip-coef must not be negative, got -0.1"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script(SCRIPT, *args, cwd=tmp_path), message)


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(
        ppo_envpool.check_args,
        lambda **o: ppo_envpool.Args(batch_size=1024, minibatch_size=256, num_iterations=9765, **o),
    )
    assert_ppo_ranges_are_checked(ppo_envpool.check_args, ppo_envpool.Args)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected(SCRIPT, tmp_path)


def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory(tmp_path, monkeypatch, capsys):
    args = dict(num_envs=2, num_steps=128, cuda=False)
    assert_run_resumes_where_its_checkpoint_left_it(ppo_envpool, tmp_path, monkeypatch, capsys, args)
