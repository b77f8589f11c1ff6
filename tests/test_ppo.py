"""Specification of cleanrl/ppo.py."""

import glob
import os

import gymnasium as gym
import numpy as np
import pytest
import torch
from references import assert_gae_matches_reference, assert_ppo_loss_matches_reference
from run_outputs import (
    PPO_TAGS,
    assert_progress_follows_the_convention,
    assert_progress_lines_off_a_terminal,
    mp4_frames,
)
from running import (
    assert_main_fails_with,
    assert_ppo_ranges_are_checked,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
)

import cleanrl.ppo as ppo

GAMMA = 0.99


class FixedLengthEnv(gym.Env):
    """Reward 1 per step; terminates after exactly `length` steps (never, if length is None).
    The observation is constant, so the critic gives every state the same value."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int | None = None):
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.ones(3, np.float32), {}

    def step(self, action):
        self.t += 1
        terminated = self.length is not None and self.t >= self.length
        return np.ones(3, np.float32), 1.0, terminated, False, {}


TERMINATION_LENGTH = 5
TRUNCATION_LENGTH = 4
gym.register("TerminatesAfter5-v0", entry_point=FixedLengthEnv, kwargs={"length": TERMINATION_LENGTH})
gym.register("TruncatedAfter4-v0", entry_point=FixedLengthEnv, max_episode_steps=TRUNCATION_LENGTH)


def small_args(env_id: str, **overrides) -> ppo.Args:
    """2 envs x 16 steps, 2 iterations."""
    fields = dict(env_id=env_id, num_envs=2, num_steps=16, num_minibatches=2, total_timesteps=64, cuda=False)
    return ppo.Args(**{**fields, **overrides})


def test_gae_matches_the_textbook_definition():
    assert_gae_matches_reference(ppo.compute_gae, torch.tensor)


def test_gae_with_lambda_one_returns_the_discounted_rewards_plus_bootstrap():
    rng = np.random.default_rng(1)
    num_steps, gamma = 10, 0.9
    rewards, values = rng.normal(size=(2, num_steps, 2))
    next_value = rng.normal(size=2)
    _, returns = ppo.compute_gae(
        torch.tensor(rewards),
        torch.tensor(values),
        torch.zeros(num_steps, 2, dtype=torch.float64),
        torch.tensor(next_value),
        gamma,
        1.0,
    )
    for t in range(num_steps):
        discounts = gamma ** np.arange(num_steps - t)
        expected = (discounts[:, None] * rewards[t:]).sum(axis=0) + gamma ** (num_steps - t) * next_value
        np.testing.assert_allclose(returns[t].numpy(), expected, rtol=1e-10, atol=1e-10)


def test_ppo_loss_matches_the_clipped_objective_of_the_paper():
    assert_ppo_loss_matches_reference(ppo.ppo_loss, ppo.Args())


def test_the_learning_rate_anneals_linearly_to_0_from_its_full_value_at_the_first_iteration(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ppo.main(small_args("TerminatesAfter5-v0", total_timesteps=128))  # 4 iterations of 32 steps
    learning_rates = read_scalars(run_dirs(tmp_path)[0])["charts/learning_rate"]
    assert [step for step, _ in learning_rates] == [32, 64, 96, 128]
    np.testing.assert_allclose([lr for _, lr in learning_rates], [2.5e-4 * (1 - i / 4) for i in range(4)], rtol=1e-6)


def test_a_max_grad_norm_of_0_clips_every_gradient_to_0_so_the_policy_never_changes(tmp_path, monkeypatch):
    # Adam's steps do not shrink with the gradient's size, only a zero gradient leaves the weights alone:
    # with --max-grad-norm 0 every update must be a no-op, whatever the learning rate.
    monkeypatch.chdir(tmp_path)
    ppo.main(small_args("CartPole-v1", total_timesteps=128, learning_rate=0.01, max_grad_norm=0.0))
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert len(scalars["losses/approx_kl"]) == 4
    assert all(abs(kl) < 1e-9 for _, kl in scalars["losses/approx_kl"] + scalars["losses/old_approx_kl"])
    assert all(clipfrac == 0 for _, clipfrac in scalars["losses/clipfrac"])


def rollouts_of_a_run(monkeypatch, args: ppo.Args) -> list[tuple[torch.Tensor, ...]]:
    """Runs main(args) and returns (rewards, values, dones) of each rollout, as compute_gae got them."""
    rollouts = []
    compute_gae = ppo.compute_gae

    def recording_gae(rewards, values, dones, next_value, gamma, gae_lambda):
        rollouts.append((rewards.clone(), values.clone(), dones.clone()))
        return compute_gae(rewards, values, dones, next_value, gamma, gae_lambda)

    monkeypatch.setattr(ppo, "compute_gae", recording_gae)
    ppo.main(args)
    return rollouts


def test_terminated_episodes_end_the_trajectory_without_a_bootstrap(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rollouts = rollouts_of_a_run(monkeypatch, small_args("TerminatesAfter5-v0", num_steps=20, total_timesteps=80))
    assert len(rollouts) == 2
    for rewards, _, dones in rollouts:
        terminal = torch.tensor([float(t % 5 == 4) for t in range(20)])[:, None].expand(20, 2)
        torch.testing.assert_close(dones, terminal)
        torch.testing.assert_close(rewards, torch.ones(20, 2), rtol=0, atol=0)


def test_truncated_episodes_end_the_trajectory_and_bootstrap_from_the_critic(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rollouts = rollouts_of_a_run(monkeypatch, small_args("TruncatedAfter4-v0", gamma=GAMMA))

    assert len(rollouts) == 2
    for rewards, values, dones in rollouts:
        truncated = torch.tensor([(t + 1) % TRUNCATION_LENGTH == 0 for t in range(16)])[:, None].expand(16, 2)
        torch.testing.assert_close(dones, truncated.float())
        # no fake transitions: every step is a real one with reward 1
        torch.testing.assert_close(rewards[~truncated], torch.ones(int((~truncated).sum())))
        # the observation never changes, so V(final obs) is the value of any step of the same rollout
        assert values.abs().min() > 1e-4, "an all-zero critic could not tell a bootstrap from none"
        torch.testing.assert_close(rewards[truncated], 1.0 + GAMMA * values[truncated])

    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert {length for _, length in scalars["charts/episodic_length"]} == {TRUNCATION_LENGTH}
    # the logged return is the environment's, without the bootstrap
    assert {ret for _, ret in scalars["charts/episodic_return"]} == {float(TRUNCATION_LENGTH)}


def test_every_episode_is_logged_once_with_its_return_and_length_at_its_own_step(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ppo.main(small_args("TerminatesAfter5-v0"))

    scalars = read_scalars(run_dirs(tmp_path)[0])
    returns, lengths = scalars["charts/episodic_return"], scalars["charts/episodic_length"]
    # 32 steps per env: episodes end at vector steps 5, 10, ..., 30; env i's step there is global
    # step (vector step - 1) * num_envs + i + 1
    expected_steps = [(n - 1) * 2 + i + 1 for n in range(5, 33, 5) for i in range(2)]
    assert [step for step, _ in returns] == expected_steps
    assert [step for step, _ in lengths] == expected_steps
    assert all(value == TERMINATION_LENGTH for _, value in returns + lengths)


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--env-id", "NoSuchEnv-v0"], "NoSuchEnv-v0"),
        (["--num-minibatches", "3"], "num_minibatches"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--num-envs", "0"], "must be positive"),
        (["--clip-coef", "-0.1"], "--clip-coef must not be negative, got -0.1"),
    ],
    ids=["unknown-env-id", "batch-not-divisible", "budget-below-one-batch", "no-envs", "negative-clip-coef"],
)
def test_bad_input_exits_with_a_one_line_error(tmp_path, args, fragment):
    assert_user_error(run_script("ppo.py", *args, cwd=tmp_path, timeout=120), fragment)


@pytest.mark.parametrize(
    "env_id, message",
    [
        ("FrozenLake-v1", "FrozenLake-v1 has observation space Discrete(16); this script needs a flat Box"),
        ("nosuchpackage:Env-v0", "cannot make environment 'nosuchpackage:Env-v0'"),
    ],
    ids=["discrete-observations", "missing-module"],
)
def test_an_env_this_script_cannot_run_is_a_one_line_error(tmp_path, monkeypatch, env_id, message):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(ppo.main, ppo.Args(env_id=env_id), message)
    assert not os.path.exists("runs")


def test_a_seed_numpy_cannot_take_is_a_one_line_error():
    assert_main_fails_with(ppo.check_args, ppo.Args(seed=-1), "--seed must lie in [0, 2**32), got -1")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(max_grad_norm=-0.5), "--max-grad-norm must not be negative, got -0.5"),
        (dict(learning_rate=-1.0), "--learning-rate must not be negative, got -1.0"),
        (dict(exp_name="a/b"), "--exp-name 'a/b' must be a name without '/'"),
    ],
    ids=["negative-gradient-norm", "negative-learning-rate", "exp-name-with-slash"],
)
def test_values_out_of_range_are_one_line_errors_naming_the_flag(overrides, message):
    assert_main_fails_with(ppo.check_args, ppo.Args(**overrides), message)


def test_coefficients_and_discounts_out_of_range_are_one_line_errors_naming_the_flag():
    assert_ppo_ranges_are_checked(ppo.check_args, ppo.Args)


def test_short_cartpole_run_finishes_its_iterations_and_logs_every_tag(tmp_path):
    result = run_script("ppo.py", "--total-timesteps", "2048", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("finished 4 iterations, 2048 steps")
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    assert set(PPO_TAGS) <= set(scalars)
    assert len(scalars["charts/SPS"]) == 4


def test_progress_lines_are_printed_off_a_terminal(tmp_path):
    assert_progress_lines_off_a_terminal(
        "ppo.py", ["--total-timesteps", "2048"], ["512/2,048", "1,024/2,048", "1,536/2,048", "2,048/2,048"], tmp_path
    )


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(ppo.Progress, monkeypatch)


def test_capture_video_records_episodes_0_and_1_of_env_0(tmp_path):
    result = run_script("ppo.py", "--total-timesteps", "2048", "--capture-video", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    lengths = read_scalars(run_dirs(tmp_path)[0])["charts/episodic_length"]
    env0_lengths = [int(length) for step, length in lengths if (step - 1) % 4 == 0]  # 4 envs
    videos = sorted(glob.glob(str(tmp_path / "videos" / "*" / "*.mp4")))
    assert len(videos) >= 2 and len(env0_lengths) >= 2
    for video, length in zip(videos[:2], env0_lengths):  # rl-video-episode-0.mp4, -1.mp4
        frames = mp4_frames(video)
        assert frames.shape[-1] == 3 and len(frames) == length + 1, video
