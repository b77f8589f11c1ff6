"""Specification of cleanrl/dqn.py."""

import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from evaluation import (
    assert_corrupt_checkpoint_rejected,
    assert_tracked_evaluation_logs_under_the_models_env,
    evaluate_saved_model,
    saved_model_path,
    train_and_save_a_model,
)
from references import (
    assert_linear_epsilon_schedule,
    assert_target_update_copies_or_averages,
    assert_td_target_bootstraps_from_the_target_network,
    assert_td_target_matches_reference,
)
from run_outputs import DQN_TAGS, assert_progress_follows_the_convention, assert_progress_lines_printed
from running import assert_main_fails_with, assert_user_error, read_scalars, run_dirs, run_script, run_tracked

import cleanrl.dqn as dqn


class CountingEnv(gym.Env):
    """Observation [episode, t, 0]: which episode and how many steps into it. Reward 1 per step;
    terminates after `length` steps (never, if None: a TimeLimit truncates it instead)."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int | None = None):
        self.length, self.episode, self.t = length, -1, 0

    def obs(self):
        return np.array([self.episode, self.t, 0.0], np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self.obs(), {}

    def step(self, action):
        self.t += 1
        return self.obs(), 1.0, self.length is not None and self.t >= self.length, False, {}


TERMINATION_LENGTH = 5
TRUNCATION_LENGTH = 4
gym.register("DqnTerminatesAfter5-v0", entry_point=CountingEnv, kwargs={"length": TERMINATION_LENGTH})
gym.register("DqnTruncatedAfter4-v0", entry_point=CountingEnv, max_episode_steps=TRUNCATION_LENGTH)


def small_args(env_id: str, **overrides) -> dqn.Args:
    fields = dict(
        env_id=env_id,
        total_timesteps=400,
        learning_starts=100,
        train_frequency=10,
        target_network_frequency=50,
        batch_size=16,
        buffer_size=1000,
        cuda=False,
    )
    return dqn.Args(**{**fields, **overrides})


def recorded_buffers(monkeypatch) -> list:
    """Makes main() keep a reference to the replay buffers it creates."""
    buffers = []

    class RecordedReplayBuffer(dqn.ReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            buffers.append(self)

    monkeypatch.setattr(dqn, "ReplayBuffer", RecordedReplayBuffer)
    return buffers


def test_td_target_matches_a_plain_reference_with_done_and_truncation_masks():
    assert_td_target_matches_reference(dqn.td_target)


def test_real_next_obs_takes_the_final_observation_of_finished_envs_only():
    next_obs = np.array([[1.0], [2.0], [3.0]], np.float32)
    final_obs = np.array([None, np.array([20.0], np.float32), np.array([30.0], np.float32)], dtype=object)
    real = dqn.real_next_obs(next_obs, {"final_obs": final_obs}, np.array([False, True, True]))
    np.testing.assert_array_equal(real, [[1.0], [20.0], [30.0]])
    np.testing.assert_array_equal(next_obs, [[1.0], [2.0], [3.0]]), "the env's own array is left alone"


def test_truncated_transitions_keep_their_real_last_observation_and_are_not_done(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buffers = recorded_buffers(monkeypatch)
    dqn.main(small_args("DqnTruncatedAfter4-v0", num_envs=2, total_timesteps=40, learning_starts=20))
    (rb,) = buffers
    assert rb.count == 40
    obs, next_obs, dones = rb.obs[:40], rb.next_obs[:40], rb.dones[:40]
    # every transition goes one step further within its own episode, the truncating one included
    np.testing.assert_array_equal(next_obs[:, 0], obs[:, 0])
    np.testing.assert_array_equal(next_obs[:, 1], obs[:, 1] + 1)
    assert set(next_obs[:, 1]) == {1, 2, 3, TRUNCATION_LENGTH}
    assert not dones.any(), "a time limit is not a termination"


def test_terminating_transitions_are_done_and_the_others_not(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    buffers = recorded_buffers(monkeypatch)
    dqn.main(small_args("DqnTerminatesAfter5-v0", total_timesteps=40, learning_starts=20))
    (rb,) = buffers
    np.testing.assert_array_equal(rb.next_obs[:40, 1], rb.obs[:40, 1] + 1)
    np.testing.assert_array_equal(rb.dones[:40], rb.next_obs[:40, 1] == TERMINATION_LENGTH)


def test_replay_buffer_keeps_and_samples_only_the_newest_transitions():
    rb = dqn.ReplayBuffer(10, (1,))
    for step in range(7):  # 3 envs: 21 transitions, numbered 0..20, through a memory of 10
        numbers = np.arange(3 * step, 3 * step + 3, dtype=np.float32)[:, None]
        rb.add(numbers, numbers + 100, np.zeros(3, np.int64), numbers[:, 0], np.zeros(3))
    batch = rb.sample(1000, np.random.default_rng(0), "cpu")
    assert set(batch["obs"][:, 0].tolist()) == set(range(11, 21))
    torch.testing.assert_close(batch["next_obs"], batch["obs"] + 100)
    torch.testing.assert_close(batch["rewards"], batch["obs"][:, 0])


def test_a_partly_filled_replay_buffer_samples_only_the_transitions_written():
    rb = dqn.ReplayBuffer(100, (1,))
    numbers = np.arange(1, 6, dtype=np.float32)[:, None]  # 5 transitions in a memory of 100
    rb.add(numbers, numbers + 100, np.zeros(5, np.int64), numbers[:, 0], np.zeros(5))
    batch = rb.sample(1000, np.random.default_rng(0), "cpu")
    assert set(batch["obs"][:, 0].tolist()) == {1.0, 2.0, 3.0, 4.0, 5.0}


class CountingQNetwork(dqn.QNetwork):
    """Greedy action 2 of 3 for every state; counts the times acting ran the network."""

    calls = 0

    def __init__(self):
        super().__init__(2, 3)

    def greedy_actions(self, obs):
        CountingQNetwork.calls += 1
        return np.full(len(obs), 2, dtype=np.int64)


def test_epsilon_greedy_explores_uniformly_at_rate_epsilon_and_runs_the_network_only_when_needed():
    q_network, rng, obs = CountingQNetwork(), np.random.default_rng(0), np.zeros((4, 2), np.float32)
    actions = np.concatenate([dqn.epsilon_greedy(q_network, obs, 0.3, 3, rng) for _ in range(5000)])
    # greedy (action 2) with probability 0.7, plus a third of the random ones
    counts = np.bincount(actions, minlength=3) / len(actions)
    np.testing.assert_allclose(counts, [0.1, 0.1, 0.8], atol=0.01)
    assert actions.dtype == np.int64

    CountingQNetwork.calls = 0
    assert set(np.concatenate([dqn.epsilon_greedy(q_network, obs, 1.0, 3, rng) for _ in range(300)])) == {0, 1, 2}
    assert CountingQNetwork.calls == 0  # every env explored: the network never ran
    assert (dqn.epsilon_greedy(q_network, obs, 0.0, 3, rng) == 2).all()
    assert CountingQNetwork.calls == 1


def test_greedy_actions_are_the_argmax_of_the_forward_and_follow_every_update():
    """Acting runs the Q-network in numpy on views of its weights: the same actions as torch's forward,
    also after Adam's in-place steps and a load_state_dict, and again after the weights moved."""
    torch.manual_seed(0)
    q_network = dqn.QNetwork(4, 3)
    optimizer = torch.optim.Adam(q_network.parameters(), lr=0.05, fused=True)
    states = np.random.default_rng(0).normal(size=(4096, 4)).astype(np.float32)

    def torch_argmax():
        with torch.no_grad():
            return q_network(torch.from_numpy(states)).argmax(dim=1).numpy()

    for _ in range(3):
        actions = q_network.greedy_actions(states)
        assert actions.dtype == np.int64
        np.testing.assert_array_equal(actions, torch_argmax())
        # a large step towards another action: the next check fails if acting kept the old weights
        loss = -q_network(torch.from_numpy(states))[:, int(np.bincount(actions, minlength=3).argmin())].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    before = q_network.greedy_actions(states)
    q_network.load_state_dict(dqn.QNetwork(4, 3).state_dict())
    assert (q_network.greedy_actions(states) != before).any()
    np.testing.assert_array_equal(q_network.greedy_actions(states), torch_argmax())
    q_network.double().float()  # new parameter tensors: acting must not keep views of the old ones
    with torch.no_grad():
        q_network.network[-1].bias.add_(torch.tensor([0.0, 0.0, 100.0]))
    assert (q_network.greedy_actions(states) == 2).all()
    np.testing.assert_array_equal(q_network.greedy_actions(states[:1]), torch_argmax()[:1])  # one state, as acting


def test_greedy_actions_stop_a_network_edited_without_its_numpy_layers():
    """A researcher who changes QNetwork's layers and not numpy_q_values gets an error at the first
    greedy action, not silently another policy."""
    edited = dqn.QNetwork(4, 3)
    edited.network[1] = torch.nn.Tanh()
    with pytest.raises(RuntimeError, match="numpy_q_values no longer computes forward"):
        edited.greedy_actions(np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32))


def test_epsilon_decays_linearly_then_stays_at_its_end():
    assert_linear_epsilon_schedule(dqn.linear_schedule)


def test_target_update_copies_with_tau_one_and_averages_below():
    assert_target_update_copies_or_averages(dqn.update_target, lambda: dqn.QNetwork(3, 2))


@pytest.mark.parametrize(
    "num_envs, loss_steps",
    # a loss point at the first vector step past each multiple of 100 env steps with updates
    # since the previous point (the first update is at step 160)
    [(1, [200, 300, 400, 500, 600]), (3, [201, 300, 402, 501, 600])],
)
def test_updates_and_target_updates_follow_the_schedule_in_env_steps(tmp_path, monkeypatch, num_envs, loss_steps):
    monkeypatch.chdir(tmp_path)
    calls = {"td_target": 0, "update_target": 0}
    for name in calls:
        original = getattr(dqn, name)

        def counted(*args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(dqn, name, counted)
    args = small_args("CartPole-v1", num_envs=num_envs, total_timesteps=600, learning_starts=150)
    dqn.main(args)
    steps = range(args.learning_starts + 1, args.total_timesteps // num_envs * num_envs + 1)
    assert calls["td_target"] == sum(s % args.train_frequency == 0 for s in steps) == 45
    assert calls["update_target"] == sum(s % args.target_network_frequency == 0 for s in steps) == 9

    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert [step for step, _ in scalars["losses/td_loss"]] == loss_steps
    assert all(np.isfinite(v) for _, v in scalars["losses/td_loss"] + scalars["losses/q_values"])


def test_the_td_target_bootstraps_from_the_target_network(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = small_args("CartPole-v1", total_timesteps=300, target_network_frequency=10**6, learning_rate=0.01)
    assert_td_target_bootstraps_from_the_target_network(dqn, "ReplayBuffer", args, monkeypatch)


def test_a_target_update_copies_the_q_network_into_the_target_not_the_target_into_it(tmp_path, monkeypatch):
    # The run ends on a target update (step 400, a multiple of 50) right after a Q-network update: the model it
    # saves is what the Q-network learned. Copied the wrong way, the update would reset the Q-network to the
    # target's weights, the initial ones: those a run with learning rate 0 saves.
    saved = {}
    for learning_rate in (0.0, 0.01):
        folder = tmp_path / f"lr-{learning_rate}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        dqn.main(small_args("CartPole-v1", learning_rate=learning_rate, save_model=True, eval_episodes=1))
        saved[learning_rate] = torch.load(saved_model_path("dqn.py", folder), weights_only=True)["model"]
    assert saved[0.0].keys() == saved[0.01].keys()
    assert not any(torch.equal(saved[0.0][name], saved[0.01][name]) for name in saved[0.0])


def test_epsilon_is_logged_along_its_schedule(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = small_args("CartPole-v1", total_timesteps=1000, exploration_fraction=0.5, start_e=1.0, end_e=0.1)
    dqn.main(args)
    scalars = read_scalars(run_dirs(tmp_path)[0])
    for step, epsilon in scalars["charts/epsilon"]:
        # logged after the step's action, which was chosen with the epsilon of step - 1
        assert epsilon == pytest.approx(max(1.0 - 0.9 * (step - 1) / 500, 0.1), abs=1e-6)


def test_every_episode_is_logged_once_with_its_return_and_length_at_its_own_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dqn.main(small_args("DqnTerminatesAfter5-v0", num_envs=2, total_timesteps=40, learning_starts=20))
    scalars = read_scalars(run_dirs(tmp_path)[0])
    # 20 vector steps: episodes end at vector steps 5, 10, 15, 20; env i's step there is global
    # step (vector step - 1) * num_envs + i + 1
    expected_steps = [(n - 1) * 2 + i + 1 for n in range(5, 21, 5) for i in range(2)]
    for tag in ["charts/episodic_return", "charts/episodic_length"]:
        assert [step for step, _ in scalars[tag]] == expected_steps
        assert all(value == TERMINATION_LENGTH for _, value in scalars[tag])


def test_evaluation_plays_the_requested_episodes_greedily_at_epsilon_zero():
    q_network = dqn.QNetwork(4, 2)
    with torch.no_grad():  # always push left: CartPole falls within a few steps, the same each time
        q_network.network[-1].weight.zero_()
        q_network.network[-1].bias.copy_(torch.tensor([1.0, 0.0]))
    returns = dqn.play_episodes(q_network, "CartPole-v1", 3, epsilon=0.0, seed=1)
    assert len(returns) == 3 and all(r < 15 for r in returns)
    random_returns = dqn.play_episodes(q_network, "CartPole-v1", 20, epsilon=1.0, seed=1)
    assert np.mean(random_returns) > np.mean(returns)


def test_a_saved_model_whose_env_cannot_be_made_here_is_a_one_line_error_before_any_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dqn.save_model("q.cleanrl_model", dqn.QNetwork(4, 2), dqn.Args(env_id="NoSuchEnv-v0"))
    message = "cannot make the model's environment 'NoSuchEnv-v0'"
    assert_main_fails_with(dqn.main, dqn.Args(eval_checkpoint="q.cleanrl_model"), message)
    assert not os.path.exists("runs")


def test_loaded_model_equals_saved_model(tmp_path):
    q_network, args = dqn.QNetwork(4, 2), dqn.Args()
    path = str(tmp_path / "q.cleanrl_model")
    dqn.save_model(path, q_network, args)
    loaded, saved_args = dqn.load_model(path, torch.device("cpu"))
    assert saved_args["env_id"] == args.env_id
    obs = torch.randn(5, 4)
    torch.testing.assert_close(loaded(obs), q_network(obs), rtol=0, atol=0)


def test_short_run_logs_every_tag_progress_and_summary_then_saves_and_evaluates(tmp_path):
    result, model_path = train_and_save_a_model(
        "dqn.py",
        "--total-timesteps",
        "1000",
        "--learning-starts",
        "500",
        "--eval-episodes",
        "2",
        cwd=tmp_path,
        timeout=300,
    )
    assert "finished 1000 steps and 50 updates" in result.stdout
    assert result.stdout.count("eval_episode=") == 2
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert set(DQN_TAGS) <= set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == list(range(100, 1001, 100))
    assert len(scalars["losses/td_loss"]) == 5
    assert os.path.dirname(model_path) == run_dir
    evaluate_saved_model("dqn.py", model_path, 3, cwd=tmp_path)


def test_an_evaluation_under_track_reaches_wandb_and_is_named_after_the_models_env(tmp_path):
    _, model_path = train_and_save_a_model(
        "dqn.py",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "200",
        "--eval-episodes",
        "1",
        cwd=tmp_path,
        timeout=300,
    )
    assert_tracked_evaluation_logs_under_the_models_env(
        "dqn.py", model_path, "CartPole-v1", "Acrobot-v1", tmp_path / "evaluation", "--eval-episodes", "2"
    )


def test_progress_lines_are_printed_off_a_terminal(tracked_run):
    _, result = tracked_run
    assert_progress_lines_printed(result.stderr, ["100/300", "200/300", "300/300"])


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(dqn.Progress, monkeypatch)


def test_capture_video_writes_mp4_files(tmp_path):
    result = run_script(
        "dqn.py", "--total-timesteps", "300", "--learning-starts", "200", "--capture-video", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    videos = glob.glob(str(tmp_path / "videos" / "*" / "*.mp4"))
    assert videos and all(os.path.getsize(v) > 1000 for v in videos)


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """A short run tracked by wandb (offline) with videos and a progress line at every chance."""
    cwd = tmp_path_factory.mktemp("tracked_run")
    args = ["--total-timesteps", "300", "--learning-starts", "200", "--capture-video", "--progress-interval", "0"]
    return cwd, run_tracked("dqn.py", *args, cwd=cwd)


def test_wandb_offline_run_is_created_with_the_videos(tracked_run):
    cwd, _ = tracked_run
    (wandb_run,) = glob.glob(str(cwd / "wandb" / "offline-run-*"))
    assert glob.glob(os.path.join(wandb_run, "files", "videos", "*", "*.mp4"))


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--env-id", "Pendulum-v1"], "needs a Discrete one"),
        (["--total-timesteps", "5000"], "would never update"),
        (["--eval-checkpoint", "missing.cleanrl_model"], "does not exist"),
        (["--gamma", "1.5"], "--gamma must lie in [0, 1], got 1.5"),
    ],
    ids=["unknown-env-id", "continuous-actions", "no-update-in-budget", "missing-checkpoint", "gamma-above-1"],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script("dqn.py", *args, cwd=tmp_path, timeout=120), message)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(seed=-1), "--seed must lie in [0, 2**32), got -1"),
        (dict(batch_size=0), "--batch-size must be positive"),
        (dict(train_frequency=0), "--train-frequency must be positive"),
        (dict(target_network_frequency=0), "--target-network-frequency must be positive"),
        (dict(buffer_size=-1), "--buffer-size must be positive"),
        (dict(num_envs=0), "--num-envs must be positive"),
        (dict(eval_episodes=0), "--eval-episodes must be positive"),
        (dict(tau=0.0), "--tau must lie in (0, 1]"),
        (dict(gamma=-0.1), "--gamma must lie in [0, 1], got -0.1"),
        (dict(end_e=1.5), "--end-e must lie in [0, 1]"),
        (dict(exploration_fraction=-0.1), "--exploration-fraction must lie in [0, 1]"),
        (dict(learning_starts=-1), "--learning-starts -1 must lie in [0, total_timesteps"),
        (dict(num_envs=8, total_timesteps=4, learning_starts=0), "less than one step of the 8 envs"),
        (dict(num_envs=8, buffer_size=4), "--buffer-size 4 is smaller than one step of the 8 envs"),
        (
            dict(total_timesteps=1005, learning_starts=1001),
            "first update would come at step 1,010, after the run's 1,005",
        ),
        (
            dict(num_envs=4, total_timesteps=1003, learning_starts=1001, train_frequency=1),
            "first update would come at step 1,002, after the run's 1,000 steps",
        ),
        (dict(exp_name="sweep/lr"), "--exp-name 'sweep/lr' must be a name without '/'"),
        (dict(learning_rate=-1e-3), "--learning-rate must not be negative, got -0.001"),
    ],
    ids=lambda value: "-".join(f"{k}={v}" for k, v in value.items()) if isinstance(value, dict) else None,
)
def test_bad_sizes_and_rates_are_rejected_with_a_message_naming_the_flag(overrides, message):
    # the same fail() as above, checked in-process (a subprocess per case costs seconds)
    assert_main_fails_with(dqn.check_args, dqn.Args(**overrides), message)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    assert_corrupt_checkpoint_rejected("dqn.py", tmp_path)
