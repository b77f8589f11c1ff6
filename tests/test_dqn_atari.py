"""Specification of cleanrl/dqn_atari.py."""

import glob
import os
import re
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from checkpoints import assert_the_newest_checkpoints_are_kept_by_their_number, mappings_once_removed
from evaluation import (
    assert_corrupt_checkpoint_rejected,
    assert_evaluation_warns_when_emulator_settings_differ,
    assert_saved_model_loads_identically,
    assert_tracked_evaluation_logs_under_the_models_env,
    evaluate_saved_model,
    train_and_save_a_model,
)
from interruptions import CutOff, cut_off_at, flushing_writer
from references import (
    assert_linear_epsilon_schedule,
    assert_target_update_copies_or_averages,
    assert_td_target_bootstraps_from_the_target_network,
    assert_td_target_matches_reference,
)
from run_outputs import (
    DQN_TAGS,
    assert_game_0_video_logged_as_wandb_media,
    assert_progress_follows_the_convention,
    assert_progress_lines_printed,
    assert_videos_show_whole_games_of_env_0,
    capped_cubic_games,
)
from running import (
    assert_atari_ranges_are_checked,
    assert_main_fails_with,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
    run_tracked,
)

import cleanrl.dqn_atari as dqn_atari

# One torch thread: the test machine is shared, where two threads per process spin-wait each
# other out (forward passes measured 5-10x slower).
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# A short run: 1 env, 600 steps, updates from step 400 on, every 4 steps: 50 updates.
# Epsilon ends at 0.5: an untrained greedy policy may never press FIRE, and the games must go on.
SHORT_RUN = ["--total-timesteps", "600", "--learning-starts", "400", "--buffer-size", "2000", "--end-e", "0.5"]


@dataclass
class Played:
    """Random Breakout play of 2 envs stored in a small memory, with what the env returned."""

    rb: dqn_atari.FrameReplayBuffer
    obs: np.ndarray  # (steps, envs, 4, 84, 84): the observation each step was taken in
    next_obs: np.ndarray  # the observation the step ended in (the real last one at a game over)
    reset_obs: np.ndarray  # what envs.step returned (a new game's first observation at a game over)
    game_over: np.ndarray  # (steps, envs)
    life_lost: np.ndarray  # (steps, envs), a life lost while the game goes on
    slot_of_step: np.ndarray  # (steps, envs): the position in each env's stream of written slots
    slots_written: np.ndarray  # (envs,)


NUM_ENVS, STEPS, SLOTS_PER_ENV = 2, 700, 256


@pytest.fixture(scope="module")
def played() -> Played:
    envs = dqn_atari.make_envs("BreakoutNoFrameskip-v4", NUM_ENVS, 0.0)
    rb = dqn_atari.FrameReplayBuffer(NUM_ENVS * SLOTS_PER_ENV, NUM_ENVS)
    rng = np.random.default_rng(0)
    obs, info = envs.reset(seed=5)
    rb.start(obs)
    lives = info["lives"].copy()
    record = {name: [] for name in ("obs", "next_obs", "reset_obs", "game_over", "life_lost", "slot")}
    stream_position = np.zeros(NUM_ENVS, dtype=np.int64)  # slots written before each env's current obs
    for t in range(STEPS):
        actions = rng.integers(0, 4, size=NUM_ENVS)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        game_over = terminated | truncated
        life_lost = info["lives"] < lives
        lives = info["lives"].copy()
        real_next = next_obs.copy()
        if game_over.any():
            real_next[game_over] = info["final_obs"][game_over]
        # the reward field carries the step's number, so that each stored step names itself
        ids = (t * NUM_ENVS + np.arange(NUM_ENVS)).astype(np.float32)
        rb.add(actions, ids, terminated | life_lost, next_obs, info.get("final_obs"), game_over)
        for name, value in zip(record, (obs, real_next, next_obs.copy(), game_over, life_lost, stream_position.copy())):
            record[name].append(value)
        stream_position += 1 + game_over  # a game over also writes the real last frame
        obs = next_obs
    envs.close()
    arrays = {name: np.stack(values) for name, values in record.items()}
    return Played(
        rb,
        arrays["obs"],
        arrays["next_obs"],
        arrays["reset_obs"],
        arrays["game_over"],
        arrays["life_lost"],
        arrays["slot"],
        stream_position + 1,
    )


def stored_steps(played: Played) -> tuple[np.ndarray, np.ndarray, dict]:
    """Every transition the memory holds: (step, env) of each, and the rebuilt batch."""
    envs, slots = np.nonzero(played.rb.valid)
    batch = played.rb.gather(envs, slots)
    ids = batch["rewards"].astype(np.int64)
    return ids // NUM_ENVS, ids % NUM_ENVS, batch


def test_the_play_covers_game_starts_life_losses_game_overs_and_a_wrapped_ring(played):
    assert played.game_over.sum(axis=0).min() >= 2
    assert (played.life_lost & ~played.game_over).sum(axis=0).min() >= 4
    assert played.slots_written.min() > 2 * SLOTS_PER_ENV


def test_rebuilt_stacks_equal_the_stacks_the_environment_returned(played):
    steps, envs, batch = stored_steps(played)
    assert len(steps) > SLOTS_PER_ENV
    np.testing.assert_array_equal(envs, np.nonzero(played.rb.valid)[0], "each stored step is in its env's ring")
    np.testing.assert_array_equal(batch["obs"], played.obs[steps, envs])
    np.testing.assert_array_equal(batch["next_obs"], played.next_obs[steps, envs])


def test_a_game_over_step_ends_in_the_real_last_frame_not_the_next_games_first(played):
    steps, envs, batch = stored_steps(played)
    at_game_over = played.game_over[steps, envs]
    assert at_game_over.sum() >= 2
    np.testing.assert_array_equal(batch["next_obs"][at_game_over], played.next_obs[steps, envs][at_game_over])
    # the next game's first observation is another picture: [0, 0, 0, first frame]
    assert (played.reset_obs[steps, envs][at_game_over][:, :3] == 0).all()
    assert (batch["next_obs"][at_game_over][:, :3] != 0).any(axis=(1, 2, 3)).all()


def test_a_stack_at_a_game_start_is_zero_padded_as_the_env_pads_it(played):
    steps, envs, batch = stored_steps(played)
    previous_step_ended_game = np.zeros_like(played.game_over)
    previous_step_ended_game[1:] = played.game_over[:-1]
    previous_step_ended_game[0] = True  # the first observation after reset
    starts = previous_step_ended_game[steps, envs]
    second = np.zeros_like(starts)  # one step into a game: two zero frames left
    second[steps > 0] = previous_step_ended_game[steps[steps > 0] - 1, envs[steps > 0]]
    assert starts.sum() >= 2 and second.sum() >= 2
    assert (batch["obs"][starts][:, :3] == 0).all() and (batch["obs"][starts][:, 3] != 0).any(axis=(1, 2)).all()
    assert (batch["obs"][second][:, :2] == 0).all() and (batch["obs"][second][:, 2:] != 0).any(axis=(2, 3)).all()


def test_a_stack_after_a_life_loss_goes_on_with_the_games_frames(played):
    steps, envs, batch = stored_steps(played)
    after_life_loss = np.zeros_like(steps, dtype=bool)
    after_life_loss[steps > 0] = (played.life_lost & ~played.game_over)[steps[steps > 0] - 1, envs[steps > 0]]
    assert after_life_loss.sum() >= 4
    # the game went on, so did the stack: no zero frame, the previous life's frames in it
    assert (batch["obs"][after_life_loss] != 0).any(axis=(2, 3)).all()
    np.testing.assert_array_equal(batch["obs"][after_life_loss], played.obs[steps, envs][after_life_loss])


def test_the_memory_keeps_exactly_the_newest_steps_with_intact_stacks(played):
    # Reference: env e's slots form one stream, the oldest overwritten first; a step is kept while
    # its own slot, the 3 before it and the one after are among the last SLOTS_PER_ENV written.
    expected = set()
    for e in range(NUM_ENVS):
        for t in range(STEPS):
            if played.slot_of_step[t, e] - 3 >= played.slots_written[e] - SLOTS_PER_ENV:
                expected.add((t, e))
    steps, envs, _ = stored_steps(played)
    assert set(zip(steps.tolist(), envs.tolist())) == expected


def test_sampling_draws_the_stored_steps_uniformly_and_nothing_else(played):
    rng = np.random.default_rng(1)
    drawn = np.concatenate([played.rb.sample(1000, rng, "cpu")["rewards"].numpy() for _ in range(20)])
    counts = np.bincount(drawn.astype(np.int64), minlength=STEPS * NUM_ENVS)
    held = np.zeros(STEPS * NUM_ENVS, dtype=bool)
    envs, slots = np.nonzero(played.rb.valid)
    held[played.rb.rewards[envs, slots].astype(np.int64)] = True
    assert counts[~held].sum() == 0
    # about 40 draws each: binomial spread, far from 0 and from a double share
    expected = len(drawn) / held.sum()
    assert expected * 0.35 < counts[held].min() and counts[held].max() < expected * 2


def test_the_memory_stores_one_uint8_frame_per_env_step():
    rb = dqn_atari.FrameReplayBuffer(1000, 4)
    assert rb.frames.dtype == np.uint8 and rb.frames.shape == (4, 250, 84, 84)
    assert rb.frames.nbytes == 1000 * 84 * 84


def replay_memory_at_the_end_of_a_run(args: dqn_atari.Args, folder) -> dqn_atari.FrameReplayBuffer:
    """dqn_atari.main(args), its run in `folder` (the current folder) with a checkpoint at its last step
    (args.checkpoint_every), and the replay memory that checkpoint holds."""
    dqn_atari.main(args)
    (run_dir,) = run_dirs(folder)
    checkpoint = os.path.join(run_dir, "checkpoints", f"step-{args.total_timesteps:09d}.pt")
    rb = dqn_atari.FrameReplayBuffer(args.buffer_size, args.num_envs)
    rb.load_state_dict(torch.load(checkpoint, weights_only=True)["replay_memory"])
    return rb


def test_stored_steps_are_what_the_env_did_with_life_losses_and_terminations_done_and_time_limits_not(
    tmp_path, monkeypatch
):
    # A real run (random play, a 150-step time limit) and the replay memory of its checkpoint, against the
    # same games replayed with the stored actions: each stored step has the clipped reward, done at a life
    # loss or a termination and not at a truncation, and a game over's next frame is the real last one.
    monkeypatch.chdir(tmp_path)
    args = dqn_atari.Args(
        num_envs=2,
        total_timesteps=1200,
        learning_starts=1190,
        buffer_size=2000,
        end_e=1.0,
        max_episode_steps=150,
        checkpoint_every=1200,
        cuda=False,
    )
    rb = replay_memory_at_the_end_of_a_run(args, tmp_path)
    envs = dqn_atari.make_envs(args.env_id, 2, args.repeat_action_probability, args.max_episode_steps)
    _, info = envs.reset(seed=args.seed)
    lives, slot = info["lives"].copy(), np.zeros(2, dtype=np.int64)
    seen = {"life loss": 0, "termination": 0, "truncation": 0}
    for t in range(600):
        _, reward, terminated, truncated, info = envs.step(rb.actions[[0, 1], slot].astype(np.int64))
        life_lost = (info["lives"] < lives) & ~(terminated | truncated)
        lives = info["lives"].copy()
        for e in range(2):
            assert rb.valid[e, slot[e]] and rb.rewards[e, slot[e]] == np.sign(reward[e]), (t, e)
            assert rb.dones[e, slot[e]] == (terminated[e] or life_lost[e]), (t, e)
            if terminated[e] or truncated[e]:
                np.testing.assert_array_equal(rb.frames[e, slot[e] + 1], info["final_obs"][e, -1])
                assert not rb.valid[e, slot[e] + 1] and rb.first[e, slot[e] + 2]
        seen["life loss"] += life_lost.sum()
        seen["termination"] += terminated.sum()
        seen["truncation"] += (truncated & ~terminated).sum()
        slot += 1 + (terminated | truncated)
    envs.close()
    assert min(seen.values()) > 0, seen
    assert (slot == rb.pos).all(), "every stored step was replayed"


def test_td_target_matches_a_plain_reference_with_done_and_truncation_masks():
    assert_td_target_matches_reference(dqn_atari.td_target)


def test_the_td_target_bootstraps_from_the_target_network(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        args = dqn_atari.Args(
            total_timesteps=440,
            learning_starts=400,
            buffer_size=2000,
            end_e=0.5,
            target_network_frequency=10**6,
            learning_rate=0.01,
            cuda=False,
        )
        assert_td_target_bootstraps_from_the_target_network(dqn_atari, "FrameReplayBuffer", args, monkeypatch)
    finally:
        torch.set_num_threads(threads)


def test_epsilon_decays_linearly_then_stays_at_its_end():
    assert_linear_epsilon_schedule(dqn_atari.linear_schedule)


def test_target_update_copies_with_tau_one_and_averages_below():
    assert_target_update_copies_or_averages(dqn_atari.update_target, lambda: dqn_atari.QNetwork(4))


def test_epsilon_greedy_acts_greedily_at_zero_and_explores_every_env_at_one():
    q_network = dqn_atari.QNetwork(4)
    with torch.no_grad():
        q_network.network[-1].weight.zero_()
        q_network.network[-1].bias.copy_(torch.tensor([0.0, 0.0, 1.0, 0.0]))
    obs = np.zeros((64, 4, 84, 84), np.uint8)
    rng = np.random.default_rng(0)
    assert (dqn_atari.epsilon_greedy(q_network, obs, 0.0, rng, "cpu") == 2).all()
    random_actions = dqn_atari.epsilon_greedy(q_network, obs, 1.0, rng, "cpu")
    assert set(random_actions.tolist()) == {0, 1, 2, 3}


@pytest.mark.parametrize("env_id", ["BreakoutNoFrameskip-v4", "ALE/Breakout-v5", "Breakout-v5"])
def test_env_id_styles_name_the_same_game(env_id):
    assert dqn_atari.atari_game(env_id) == "breakout"


def test_short_run_executes_its_updates_and_logs_every_tag(tmp_path):
    result = run_script("dqn_atari.py", *SHORT_RUN, cwd=tmp_path, env=ONE_THREAD)
    assert result.returncode == 0, result.stderr
    assert "finished 600 steps and 50 updates" in result.stdout
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert set(DQN_TAGS) <= set(scalars)
    # a loss point per 100 steps that held updates (the first update is at step 404)
    assert [step for step, _ in scalars["losses/td_loss"]] == [500, 600]
    assert all(np.isfinite(v) for _, v in scalars["losses/td_loss"] + scalars["losses/q_values"])
    # whole unclipped games (all five lives) of random play
    assert all(length > 50 for _, length in scalars["charts/episodic_length"])
    assert all(r >= 0 and r == int(r) for _, r in scalars["charts/episodic_return"])


class BonusLives:
    """The script's vector env, but every game in play reports 5 more lives than a new game starts with, as
    after bonus lives (Ms. Pac-Man, Krull): a game the time limit cuts then has more lives than the next."""

    def __init__(self, envs):
        self.envs, self.truncations = envs, []

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def reset(self, **kwargs):
        obs, info = self.envs.reset(**kwargs)
        return obs, {**info, "lives": info["lives"] + 5}

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        self.truncations.append(bool(truncated[0] and not terminated[0]))
        lives = info["lives"] + 5 * ~(terminated | truncated)  # at a game's end: the new game's lives
        return obs, reward, terminated, truncated, {**info, "lives": lives}


def test_a_time_limit_is_not_a_death_when_the_cut_game_has_bonus_lives(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    made, real_make_envs = [], dqn_atari.make_envs
    monkeypatch.setattr(
        dqn_atari, "make_envs", lambda *a, **k: made.append(BonusLives(real_make_envs(*a, **k))) or made[-1]
    )
    args = dqn_atari.Args(
        total_timesteps=300,
        learning_starts=290,
        buffer_size=400,
        end_e=1.0,
        max_episode_steps=50,
        checkpoint_every=300,
        cuda=False,
    )
    rb = replay_memory_at_the_end_of_a_run(args, tmp_path)
    # a game's end takes two slots (its step, then its real last frame), every other step one
    slots = np.cumsum([0] + [1 + cut for cut in made[0].truncations[:-1]])
    cut_slots = slots[np.flatnonzero(made[0].truncations)]
    assert len(cut_slots) >= 5 and not rb.dones[0, cut_slots].any(), rb.dones[0, cut_slots]


def test_save_then_evaluate_round_trip(tmp_path):
    result, model_path = train_and_save_a_model(
        "dqn_atari.py", *SHORT_RUN, "--eval-episodes", "1", cwd=tmp_path, env=ONE_THREAD
    )
    assert result.stdout.count("eval_episode=") == 1
    evaluate_saved_model("dqn_atari.py", model_path, 2, cwd=tmp_path, env=ONE_THREAD)
    assert_tracked_evaluation_logs_under_the_models_env(
        "dqn_atari.py",
        model_path,
        "BreakoutNoFrameskip-v4",
        "PongNoFrameskip-v4",
        tmp_path / "evaluation",
        "--eval-episodes",
        "1",
        "--max-episode-steps",
        "300",
        env=ONE_THREAD,
    )


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(dqn_atari, tmp_path)


def test_loaded_model_equals_saved_model(tmp_path):
    assert_saved_model_loads_identically(dqn_atari, tmp_path)


def test_video_schedule_is_capped_cubic():
    assert [game for game in range(3001) if dqn_atari.capped_cubic(game)] == capped_cubic_games(3001)


def test_capture_video_writes_rgb_videos_of_whole_games_of_env_0(tmp_path):
    # the time limit makes sure games 0 and 1 end within the run
    result = run_script(
        "dqn_atari.py", *SHORT_RUN, "--max-episode-steps", "250", "--capture-video", cwd=tmp_path, env=ONE_THREAD
    )
    assert result.returncode == 0, result.stderr
    # A video holds its game's first screen and one screen per step.
    assert_videos_show_whole_games_of_env_0(tmp_path, num_envs=1, extra_screens=1)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A short run tracked by wandb (offline) with videos and a progress line at every chance."""
    cwd = tmp_path_factory.mktemp("tracked_run")
    result = run_tracked(
        "dqn_atari.py",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "290",
        "--buffer-size",
        "1000",
        "--max-episode-steps",
        "100",
        "--capture-video",
        "--progress-interval",
        "0",
        cwd=cwd,
        env=ONE_THREAD,
    )
    return cwd, result


def test_wandb_offline_run_is_created_with_the_videos(tracked_run):
    cwd, _ = tracked_run
    assert_game_0_video_logged_as_wandb_media(cwd)


def test_progress_lines_are_printed_off_a_terminal(tracked_run):
    _, result = tracked_run
    assert_progress_lines_printed(result.stderr, ["100/300", "200/300", "300/300"])


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(dqn_atari.Progress, monkeypatch)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchGameNoFrameskip-v4"], "unknown Atari env id"),
        (["--num-envs", "3", "--buffer-size", "1000"], "not divisible by --num-envs 3"),
        (["--total-timesteps", "50000"], "would never update"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--gamma", "1.5"], "--gamma must lie in [0, 1], got 1.5"),
    ],
    ids=["unknown-env-id", "buffer-not-divisible", "no-update-in-budget", "missing-checkpoint", "gamma-above-1"],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script("dqn_atari.py", *args, cwd=tmp_path, env=ONE_THREAD), message)


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(dqn_atari.check_args, dqn_atari.Args)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(batch_size=0), "--batch-size must be positive"),
        (dict(train_frequency=-4), "--train-frequency must be positive"),
        (dict(target_network_frequency=0), "--target-network-frequency must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(eval_episodes=0), "--eval-episodes must be positive"),
        (dict(buffer_size=14, num_envs=2), "fewer than 8 steps per env"),
        (dict(tau=1.5), "--tau must lie in (0, 1]"),
        (dict(gamma=-0.1), "--gamma must lie in [0, 1], got -0.1"),
        (dict(start_e=-0.1), "--start-e must lie in [0, 1]"),
        (dict(learning_starts=-1), "--learning-starts -1 must lie in [0, total_timesteps"),
        (
            dict(total_timesteps=1003, learning_starts=1001),
            "first update would come at step 1,004, after the run's 1,003",
        ),
    ],
    ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None,
)
def test_bad_sizes_and_rates_are_rejected_with_a_message_naming_the_flag(overrides, message):
    assert_main_fails_with(dqn_atari.check_args, dqn_atari.Args(**overrides), message)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected("dqn_atari.py", tmp_path)


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
def test_the_memory_survives_a_checkpoint_and_a_resumed_run_starts_new_games_in_it(played, tmp_path):
    path = str(tmp_path / "memory.pt")
    torch.save(played.rb.state_dict(), path)
    loaded = dqn_atari.FrameReplayBuffer(NUM_ENVS * SLOTS_PER_ENV, NUM_ENVS)
    loaded.load_state_dict(torch.load(path, weights_only=True, mmap=True))
    for name in (*dqn_atari.FrameReplayBuffer.SLOT_ARRAYS, "pos", "used"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(played.rb, name))
    batch, again = (rb.sample(64, np.random.default_rng(3), "cpu") for rb in (played.rb, loaded))
    for name in batch:
        torch.testing.assert_close(again[name], batch[name])

    # resumed: each env's new game starts in the slot after its last stored observation
    valid_before, last = loaded.valid.copy(), loaded.pos.copy()
    new_game = np.zeros((NUM_ENVS, 4, 84, 84), dtype=np.uint8)
    new_game[:, -1] = 7
    loaded.start(new_game, resumed=True)
    assert (loaded.pos == (last + 1) % loaded.slots).all()
    envs = np.arange(NUM_ENVS)
    assert loaded.first[envs, loaded.pos].all() and (loaded.frames[envs, loaded.pos] == 7).all()
    assert not loaded.valid[envs, last].any(), "the last observation before the checkpoint has no step"
    # only the stacks that reached into the overwritten slot are lost
    assert 0 <= valid_before.sum() - loaded.valid.sum() <= NUM_ENVS * 4
    loaded.add(
        np.zeros(NUM_ENVS), np.zeros(NUM_ENVS), np.zeros(NUM_ENVS, bool), new_game, None, np.zeros(NUM_ENVS, bool)
    )
    step = loaded.gather(envs, (loaded.pos - 1) % loaded.slots)
    np.testing.assert_array_equal(step["obs"], new_game), "the new game's stack is zero-padded, not the old game's"


def test_a_checkpoint_of_a_partly_written_memory_holds_only_the_written_slots(tmp_path):
    # 2 envs of 2,000 slots (28 MB of frames) with 11 slots written: the file holds those, not the
    # unwritten slots that one tensor of both envs' written slots would span
    rb = dqn_atari.FrameReplayBuffer(2 * 2000, 2)
    frames, go_on = np.full((2, 4, 84, 84), 9, dtype=np.uint8), np.zeros(2, bool)
    rb.start(frames)
    for _ in range(10):
        rb.add(np.zeros(2), np.zeros(2), go_on, frames, None, go_on)
    path = tmp_path / "memory.pt"
    torch.save(rb.state_dict(), path)
    assert rb.used == 11 and os.path.getsize(path) < 2 * 20 * 84 * 84
    loaded = dqn_atari.FrameReplayBuffer(2 * 2000, 2)
    loaded.load_state_dict(torch.load(path, weights_only=True, mmap=True))
    for name in (*dqn_atari.FrameReplayBuffer.SLOT_ARRAYS, "pos", "used"):
        np.testing.assert_array_equal(getattr(loaded, name), getattr(rb, name))


def test_a_resumed_run_goes_on_in_its_directory_with_each_step_logged_once(tmp_path, monkeypatch, capsys):
    # 800 steps, updates from step 200 every 4 steps, a checkpoint every 400. The first attempt is cut off at
    # step 500 (the machine went away; only the newest checkpoint is kept, so a finished run has no middle
    # one), after its checkpoint at 400 and with the 100 steps past it logged and on disk.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(dqn_atari, "SummaryWriter", flushing_writer(dqn_atari))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    args = dict(total_timesteps=800, learning_starts=200, buffer_size=2000, end_e=0.5, checkpoint_every=400, cuda=False)
    try:
        uncut = cut_off_at(dqn_atari, monkeypatch, 500)
        with pytest.raises(CutOff):
            dqn_atari.main(dqn_atari.Args(**args))
        uncut()
        (run_dir,) = run_dirs(tmp_path)
        checkpoints = os.path.join(run_dir, "checkpoints")
        assert sorted(os.listdir(checkpoints)) == ["lock", "step-000000400.pt"]
        resumed_from = os.path.join(checkpoints, "step-000000400.pt")
        saved = torch.load(resumed_from, weights_only=True)
        assert saved["num_updates"] == 50 and saved["optimizer"]["state"], "Adam's moments of 50 updates"
        capsys.readouterr()

        # a process that is still running the run keeps a second one from resuming it
        lock = dqn_atari.lock_run(checkpoints)
        assert_main_fails_with(dqn_atari.main, dqn_atari.Args(**args, resume="auto"), "checkpoints is in use")
        lock.close()
        # The resumed run writes a checkpoint every 100 steps (how a run is saved may change): the one it was
        # resumed from is removed at 500, and the run, which copied everything out of it, maps none of it.
        mapped, watcher = mappings_once_removed(resumed_from)
        resumed = dict(args, checkpoint_every=100, capture_video=True, progress_interval=0.0)
        dqn_atari.main(dqn_atari.Args(**resumed, resume="auto"))
        output, progress = capsys.readouterr()
        watcher.join(timeout=10)
        assert not watcher.is_alive() and mapped == [], "the removed checkpoint's disk space is held by the run"
        assert "has changed since the checkpoint" not in output
        assert re.search(r"resuming \S+ at step 400 from runs/\S+/checkpoints/step-000000400\.pt", output), output
        assert "finished 800 steps and 150 updates" in output

        assert run_dirs(tmp_path) == [run_dir], "the resumed run goes on in its own directory"
        scalars = read_scalars(run_dir)
        for tag in ("charts/SPS", "charts/epsilon"):
            assert [step for step, _ in scalars[tag]] == list(range(100, 801, 100)), tag
        assert [step for step, _ in scalars["losses/td_loss"]] == list(range(300, 801, 100))
        epsilon_schedule = [dqn_atari.linear_schedule(1.0, 0.5, 80, step - 1) for step in range(100, 801, 100)]
        np.testing.assert_allclose([value for _, value in scalars["charts/epsilon"]], epsilon_schedule)
        games = scalars["charts/episodic_return"]
        game_steps = [step for step, _ in games]
        assert game_steps == sorted(set(game_steps)), "every game once, none from the cut-off attempt past 400"
        assert sorted(os.listdir(checkpoints)) == ["lock", "step-000000800.pt"], "only the newest checkpoint is kept"
        # the recent returns go on from the checkpoint's: the resumed run's first progress line counts them
        recent = (saved["recent_returns"] + [r for step, r in games if 400 < step <= 500])[-20:]
        first_line = next(line for line in progress.splitlines() if line.startswith("500/800 steps"))
        assert f"return (last {len(recent)}) {np.mean(recent):.2f}" in first_line, first_line
        # videos go on in the run's folder, numbered on from the games env 0 finished before the checkpoint
        assert saved["env0_games"] == len([step for step in game_steps if step <= 400]) > 0
        assert os.listdir("videos") == [os.path.basename(run_dir)]
        numbers = [
            int(name[len("game-") : -len(".mp4")])
            for name in os.listdir(os.path.join("videos", os.path.basename(run_dir)))
        ]
        assert all(dqn_atari.capped_cubic(number) for number in numbers), numbers
        assert min(numbers) == saved["env0_games"], "the resumed run's first game (recorded) is numbered on"
        # Adam went on counting from the checkpoint's updates, not from zero
        last_path = os.path.join(checkpoints, "step-000000800.pt")
        last = torch.load(last_path, weights_only=True)
        assert all(int(state["step"]) == 150 for state in last["optimizer"]["state"].values())

        # Resumed from its last checkpoint, the run has nothing left to learn: the model it saves is the
        # checkpoint's, bit for bit; a script changed since the checkpoint is named.
        torch.save({**last, "script_sha256": "another version of the file"}, last_path)
        dqn_atari.main(dqn_atari.Args(**args, resume="auto", save_model=True, eval_episodes=1))
        output = capsys.readouterr().out
        assert "finished 800 steps and 150 updates" in output
        assert "warning: dqn_atari.py has changed since the checkpoint" in output
        model = torch.load(os.path.join(run_dir, "dqn_atari.cleanrl_model"), weights_only=True)["model"]
        for name, value in last["model"].items():
            assert torch.equal(model[name], value), name

        # a checkpoint continues only the run it was written by
        assert_main_fails_with(
            dqn_atari.main,
            dqn_atari.Args(**{**args, "learning_rate": 3e-4}, resume=last_path),
            "the checkpoint's run has learning_rate=0.0001, this command 0.0003",
        )
        missing = dqn_atari.Args(**args, resume="nothing.pt")
        assert_main_fails_with(dqn_atari.main, missing, "--resume 'nothing.pt': no such checkpoint file")
        (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
        assert_main_fails_with(dqn_atari.main, dqn_atari.Args(**args, resume="corrupt.pt"), "not a readable")

        # The resumed run draws from the checkpoint's random state (exploration, sampling): resumed from a copy
        # of the checkpoint at 400 that holds another, its first 50 steps explore otherwise.
        (tmp_path / "other").mkdir()
        monkeypatch.chdir(tmp_path / "other")
        torch.save({**saved, "numpy_rng": np.random.default_rng(12345).bit_generator.state}, "other_rng.pt")
        uncut = cut_off_at(dqn_atari, monkeypatch, 500)
        with pytest.raises(CutOff):
            dqn_atari.main(dqn_atari.Args(**dict(args, checkpoint_every=50), resume="other_rng.pt"))
        uncut()
        (other_rng,) = glob.glob("runs/*/checkpoints/step-000000450.pt")
        first = int(saved["replay_memory"]["pos"][0]) + 1  # the slot of the resumed run's first step
        resumed_actions = last["replay_memory"]["actions"][0][first : first + 50]
        other_actions = torch.load(other_rng, weights_only=True)["replay_memory"]["actions"][0][first : first + 50]
        assert not torch.equal(resumed_actions, other_actions)
    finally:
        torch.set_num_threads(threads)


def test_a_resumed_run_takes_its_td_targets_from_the_checkpoints_target_network(tmp_path, monkeypatch):
    # Target updates at steps 300 and 600: the checkpoint at 400 holds the Q-network of step 300 as its target.
    # The run resumed from it writes a checkpoint at 500, before its next target update, with that same target
    # network (a fresh one would be the initial weights, and bootstrap from them until step 600).
    monkeypatch.chdir(tmp_path)
    args = dict(total_timesteps=800, learning_starts=200, buffer_size=2000, target_network_frequency=300, cuda=False)
    uncut = cut_off_at(dqn_atari, monkeypatch, 500)
    with pytest.raises(CutOff):
        dqn_atari.main(dqn_atari.Args(**args, checkpoint_every=400))
    uncut()
    (resumed_from,) = glob.glob("runs/*/checkpoints/step-000000400.pt")
    target = torch.load(resumed_from, weights_only=True)["target_network"]
    uncut = cut_off_at(dqn_atari, monkeypatch, 600)
    with pytest.raises(CutOff):
        dqn_atari.main(dqn_atari.Args(**args, checkpoint_every=100, resume="auto"))
    uncut()
    (later,) = glob.glob("runs/*/checkpoints/step-000000500.pt")
    assert not os.path.exists(resumed_from)
    for name, value in torch.load(later, weights_only=True)["target_network"].items():
        assert torch.equal(value, target[name]), name


def test_the_newest_checkpoints_are_kept_by_their_number(tmp_path):
    assert_the_newest_checkpoints_are_kept_by_their_number(dqn_atari, tmp_path, "step", 9)
