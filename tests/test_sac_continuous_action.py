"""Specification of cleanrl/sac_continuous_action.py."""

import glob
import os

import fake_envs  # noqa: F401  (registers the StepCount test envs)
import gymnasium as gym
import numpy as np
import pytest
import torch
import torch.nn as nn
from evaluation import eval_returns, evaluate_saved_model, saved_model_path, train_and_save_a_model
from run_outputs import (
    assert_episodes_0_1_8_recorded_and_uploaded,
    assert_progress_follows_the_convention,
    mujoco_offscreen_rendering_error,
    progress_steps,
    run_tracked_on_inverted_pendulum,
)
from running import assert_main_fails_with, assert_user_error, read_scalars, run_dirs, run_script

import cleanrl.sac_continuous_action as sac

SCRIPT = "sac_continuous_action.py"
SAC_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "losses/qf1_values",
    "losses/qf2_values",
    "losses/qf1_loss",
    "losses/qf2_loss",
    "losses/qf_loss",
    "losses/actor_loss",
    "losses/alpha",
    "losses/alpha_loss",
]


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def test_squashed_gaussian_log_prob_matches_torch_distributions():
    torch.manual_seed(0)
    mean, log_std = torch.randn(9, 2, dtype=torch.float64), 0.5 * torch.randn(9, 2, dtype=torch.float64)
    x = mean + log_std.exp() * torch.randn(9, 2, dtype=torch.float64)
    scale, bias = torch.tensor([2.0, 0.5], dtype=torch.float64), torch.tensor([0.0, 0.5], dtype=torch.float64)
    reference = torch.distributions.TransformedDistribution(
        torch.distributions.Normal(mean, log_std.exp()),
        [torch.distributions.TanhTransform(), torch.distributions.AffineTransform(bias, scale)],
    )
    action = torch.tanh(x) * scale + bias
    torch.testing.assert_close(
        sac.squashed_gaussian_log_prob(x, mean, log_std, scale), reference.log_prob(action).sum(-1)
    )


def test_squashed_gaussian_log_prob_stays_exact_where_tanh_rounds_to_one():
    x = torch.tensor([[20.0]])  # tanh(20) == 1.0 in floating point
    log_prob = sac.squashed_gaussian_log_prob(x, torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1))
    # log N(20; 0, 1) - log(1 - tanh(20)^2), and 1 - tanh(x)^2 = 4 / (e^x + e^-x)^2 ~ 4 e^(-2x)
    expected = -0.5 * 20.0**2 - 0.5 * np.log(2 * np.pi) - (np.log(4.0) - 40.0)
    assert torch.isfinite(log_prob).all()
    assert log_prob.item() == pytest.approx(expected, rel=1e-6)


def test_actor_samples_and_mean_actions_lie_in_the_action_bounds():
    torch.manual_seed(0)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    actor = sac.Actor(3, low, high)
    with torch.no_grad():
        actor.fc_mean.bias.fill_(5.0)  # pushes the squashed actions against the upper bounds
        action, log_prob, mean_action = actor.get_action(torch.randn(256, 3))
        mean, _ = actor(torch.randn(4, 3))
    assert (
        (action >= torch.tensor(low, dtype=torch.float32)) & (action <= torch.tensor(high, dtype=torch.float32))
    ).all()
    assert (mean_action <= torch.tensor(high, dtype=torch.float32)).all() and torch.isfinite(log_prob).all()
    assert mean_action[:, 1].min() > 0.99, "tanh(mean) * scale + bias: near the upper bound 1"


def test_actor_log_std_is_bounded():
    actor = sac.Actor(3, np.full(2, -1.0), np.full(2, 1.0))
    with torch.no_grad():
        actor.fc_logstd.bias.fill_(1e3)
        _, high = actor(torch.zeros(1, 3))
        actor.fc_logstd.bias.fill_(-1e3)
        _, low = actor(torch.zeros(1, 3))
    torch.testing.assert_close(high, torch.full((1, 2), sac.LOG_STD_MAX))
    torch.testing.assert_close(low, torch.full((1, 2), sac.LOG_STD_MIN))


def test_soft_td_target_matches_a_plain_reference_with_done_and_truncation_masks():
    # Three kinds of transitions: the episode goes on, it terminated, a time limit cut it. The
    # buffer stores terminated = 1 only for the second kind; the third bootstraps like the first.
    gamma, alpha = 0.99, 0.3
    kinds = ["running", "terminated", "truncated", "terminated", "running", "truncated"]
    rewards = [1.0, -2.0, 0.5, 3.0, 0.0, -1.0]
    next_q1 = [10.0, 4.0, -3.0, 7.0, 2.0, 6.0]
    next_q2 = [9.0, 5.0, -2.0, 8.0, 1.0, 6.5]
    next_log_pi = [-1.0, 0.5, 2.0, -0.2, 0.0, 1.5]
    expected = []
    for kind, r, q1, q2, log_pi in zip(kinds, rewards, next_q1, next_q2, next_log_pi):
        if kind == "terminated":
            expected.append(r)
        else:
            expected.append(r + gamma * (min(q1, q2) - alpha * log_pi))
    terminations = torch.tensor([float(kind == "terminated") for kind in kinds])
    target = sac.soft_td_target(
        torch.tensor(rewards),
        terminations,
        torch.tensor([next_q1, next_q2]),
        torch.tensor(next_log_pi),
        alpha,
        gamma,
    )
    torch.testing.assert_close(target, torch.tensor(expected))


def test_twin_critics_are_two_independent_networks_of_three_linear_layers():
    # Each critic starts as its own nn.Linear stack would (the same draws, in order) and computes that stack.
    torch.manual_seed(0)
    twin = sac.TwinSoftQNetwork(3, 2)
    torch.manual_seed(0)
    critics = [
        nn.Sequential(nn.Linear(5, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1)) for _ in range(2)
    ]
    obs, action = torch.randn(7, 3), torch.randn(7, 2)
    values = twin(obs, action)
    assert values.shape == (2, 7)
    for critic, value in zip(critics, values):
        torch.testing.assert_close(value, critic(torch.cat([obs, action], dim=1)).squeeze(-1))
    # a loss on Q1 alone gives Q2's weights no gradient: the critics share nothing
    values[0].sum().backward()
    for weight in twin.weights:
        assert weight.grad[0].abs().sum() > 0 and weight.grad[1].abs().sum() == 0


def test_soft_update_moves_the_target_tau_of_the_way():
    torch.manual_seed(0)
    online, target = sac.TwinSoftQNetwork(3, 2), sac.TwinSoftQNetwork(3, 2)
    before = [p.clone() for p in target.parameters()]
    sac.soft_update(target, online, 0.1)
    for new, old, param in zip(target.parameters(), before, online.parameters()):
        torch.testing.assert_close(new, 0.1 * param + 0.9 * old)


# ---------------------------------------------------------------------------------------------
# Replay buffer
# ---------------------------------------------------------------------------------------------
def add_numbered(rb: sac.ReplayBuffer, n: int):
    """Adds transitions 0..n-1; every field of transition i encodes i."""
    for i in range(n):
        rb.add(np.full(2, i), np.full(1, i + 0.5), float(-i), np.full(2, i + 1), i % 3 == 0)


def test_replay_buffer_samples_whole_stored_transitions_only():
    rb = sac.ReplayBuffer(10, 2, 1)
    add_numbered(rb, 6)
    batch = rb.sample(500, np.random.default_rng(0))
    i = batch["obs"][:, 0]
    assert set(i.tolist()) == set(range(6)), "uniform over the 6 stored, none of the 4 empty slots"
    np.testing.assert_array_equal(batch["obs"][:, 1], i)
    np.testing.assert_array_equal(batch["actions"][:, 0], i + 0.5)
    np.testing.assert_array_equal(batch["rewards"], -i)
    np.testing.assert_array_equal(batch["next_obs"], np.stack([i + 1, i + 1], axis=1))
    np.testing.assert_array_equal(batch["terminations"], (i % 3 == 0).astype(np.float32))


def test_replay_buffer_overwrites_the_oldest_transitions_when_full():
    rb = sac.ReplayBuffer(4, 2, 1)
    add_numbered(rb, 7)
    assert rb.size == 4
    batch = rb.sample(400, np.random.default_rng(1))
    assert set(batch["obs"][:, 0].tolist()) == {3, 4, 5, 6}
    np.testing.assert_array_equal(batch["next_obs"][:, 0], batch["obs"][:, 0] + 1)


def test_replay_buffer_sampling_is_uniform():
    rb = sac.ReplayBuffer(8, 2, 1)
    add_numbered(rb, 8)
    counts = np.bincount(rb.sample(80_000, np.random.default_rng(2))["obs"][:, 0].astype(int), minlength=8)
    np.testing.assert_allclose(counts / 80_000, 1 / 8, atol=0.005)


class RecordingReplayBuffer(sac.ReplayBuffer):
    instances: list[sac.ReplayBuffer] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        RecordingReplayBuffer.instances.append(self)


def collected_buffer(env_id: str, tmp_path, monkeypatch) -> sac.ReplayBuffer:
    """The replay buffer of a 40-step run (30 random, 10 learning) on one of the step-count envs."""
    monkeypatch.chdir(tmp_path)
    RecordingReplayBuffer.instances = []
    monkeypatch.setattr(sac, "ReplayBuffer", RecordingReplayBuffer)
    sac.main(sac.Args(env_id=env_id, total_timesteps=40, learning_starts=30, batch_size=8, cuda=False))
    (rb,) = RecordingReplayBuffer.instances
    assert rb.size == 40
    return rb


def test_a_transition_cut_by_the_time_limit_keeps_its_real_final_observation_and_bootstraps(tmp_path, monkeypatch):
    rb = collected_buffer("StepCountTruncatedAfter4-v0", tmp_path, monkeypatch)
    t = rb.obs[:40, 0]
    np.testing.assert_array_equal(t, [i % 4 for i in range(40)])  # the next episode starts from its reset
    np.testing.assert_array_equal(rb.next_obs[:40, 0], t + 1)  # t = 4 at the cut, not the next reset's 0
    np.testing.assert_array_equal(rb.rewards[:40], t + 1)
    assert not rb.terminations[:40].any(), "a time limit is no termination"


def test_a_terminated_transition_is_stored_as_terminal(tmp_path, monkeypatch):
    rb = collected_buffer("StepCountTerminatesAfter5-v0", tmp_path, monkeypatch)
    t = rb.obs[:40, 0]
    np.testing.assert_array_equal(t, [i % 5 for i in range(40)])
    np.testing.assert_array_equal(rb.next_obs[:40, 0], t + 1)
    np.testing.assert_array_equal(rb.terminations[:40], (t == 4).astype(np.float32))


def test_a_target_update_moves_the_target_critics_towards_the_online_ones_not_the_reverse(tmp_path, monkeypatch):
    # With tau = 1 every step copies the critics into their targets. Copied the wrong way, the critics would be
    # reset to the targets' weights, the initial ones, after every update: those a run with q_lr 0 saves.
    saved = {}
    for q_lr in (0.0, 1e-3):
        folder = tmp_path / f"q_lr-{q_lr}"
        folder.mkdir()
        monkeypatch.chdir(folder)
        args = dict(total_timesteps=60, learning_starts=40, batch_size=16, tau=1.0, save_model=True, eval_episodes=1)
        sac.main(sac.Args(env_id="StepCountTerminatesAfter5-v0", q_lr=q_lr, **args, cuda=False))
        saved[q_lr] = torch.load(saved_model_path(SCRIPT, folder), weights_only=True)["model"]["qf"]
    assert saved[0.0].keys() == saved[1e-3].keys()
    assert not any(torch.equal(saved[0.0][name], saved[1e-3][name]) for name in saved[0.0])


def recorded_critics_and_actor_calls(monkeypatch) -> tuple[list, list]:
    """The next run's critics, as made (online and target), and its actor's get_action calls, as (obs, outputs)."""
    critics, actor_calls = [], []

    class RecordedCritic(sac.TwinSoftQNetwork):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            critics.append(self)

    class RecordedActor(sac.Actor):
        def get_action(self, obs):
            actor_calls.append((obs, super().get_action(obs)))
            return actor_calls[-1][1]

    monkeypatch.setattr(sac, "TwinSoftQNetwork", RecordedCritic)
    monkeypatch.setattr(sac, "Actor", RecordedActor)
    return critics, actor_calls


def test_the_actor_follows_the_smaller_of_the_twin_critics(tmp_path, monkeypatch):
    # The logged actor loss of the last step is alpha * log_pi - min(Q1, Q2) at the actor's sampled actions, with
    # the critics as they end the run (the actor's update is the last thing to use them). Q1 alone would bring
    # back the overestimation the twin critics are there to curb.
    monkeypatch.chdir(tmp_path)
    critics, actor_calls = recorded_critics_and_actor_calls(monkeypatch)
    args = dict(total_timesteps=100, learning_starts=60, batch_size=32, autotune=False, alpha=0.2, cuda=False)
    sac.main(sac.Args(env_id="StepCountTerminatesAfter5-v0", **args))
    ((step, logged),) = read_scalars(run_dirs(tmp_path)[0])["losses/actor_loss"]
    assert step == 100
    online = next(critic for critic in critics if next(critic.parameters()).grad is not None)
    obs, (actions_pi, log_pi, _) = actor_calls[-1]  # the actor's update at step 100
    with torch.no_grad():
        q = online(obs, actions_pi)
        assert not torch.allclose(q.min(dim=0).values, q[0]), "the critics disagree: the test can tell them apart"
        np.testing.assert_allclose(logged, (0.2 * log_pi - q.min(dim=0).values).mean().item(), rtol=1e-5)


def test_the_soft_target_comes_from_the_target_critics_at_the_next_observations_sampled_actions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    critics, actor_calls = recorded_critics_and_actor_calls(monkeypatch)
    samples, checked = [], []

    class RecordedReplayBuffer(sac.ReplayBuffer):
        def sample(self, *args, **kwargs):
            samples.append(super().sample(*args, **kwargs))
            return samples[-1]

    soft_td_target = sac.soft_td_target

    def checked_soft_td_target(rewards, terminations, next_q, next_log_pi, alpha, gamma):
        next_obs, (next_actions, log_pi, _) = actor_calls[-1]
        np.testing.assert_array_equal(next_obs.numpy(), samples[-1]["next_obs"])
        assert next_log_pi is log_pi, "the entropy term is of the actions the target is taken at"
        stepped = [critic for critic in critics if next(critic.parameters()).grad is not None]
        if stepped:  # after the first update: the online critics hold gradients, the targets never do
            targets = [critic for critic in critics if critic not in stepped]
            (online,), (target,) = stepped, targets
            torch.testing.assert_close(next_q, target(next_obs, next_actions), rtol=0, atol=0)
            assert not torch.allclose(online(next_obs, next_actions), next_q), "the critics and their targets differ"
            checked.append(len(samples))
        return soft_td_target(rewards, terminations, next_q, next_log_pi, alpha, gamma)

    monkeypatch.setattr(sac, "ReplayBuffer", RecordedReplayBuffer)
    monkeypatch.setattr(sac, "soft_td_target", checked_soft_td_target)
    sac.main(
        sac.Args(env_id="StepCountTruncatedAfter4-v0", total_timesteps=40, learning_starts=30, batch_size=8, cuda=False)
    )
    assert len(critics) == 2 and len(checked) == len(samples) - 1 == 9


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
class RecordingEnv(gym.Wrapper):
    """Keeps each action the env is given, with the observation it was given in."""

    def __init__(self, env):
        super().__init__(env)
        self.last_obs, self.observations, self.actions = None, [], []

    def reset(self, **kwargs):
        self.last_obs, info = super().reset(**kwargs)
        return self.last_obs, info

    def step(self, action):
        self.observations.append(self.last_obs)
        self.actions.append(np.array(action))
        result = super().step(action)
        self.last_obs = result[0]
        return result


def test_a_saved_policy_whose_env_cannot_be_made_here_is_a_one_line_error_before_any_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    actor = sac.Actor(2, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    sac.save_policy("sac.cleanrl_model", actor, sac.TwinSoftQNetwork(2, 2), sac.Args(env_id="NoSuchEnv-v0"))
    message = "cannot make the model's environment 'NoSuchEnv-v0'"
    assert_main_fails_with(sac.main, sac.Args(eval_checkpoint="sac.cleanrl_model"), message)
    assert not os.path.exists("runs")


def test_evaluation_plays_the_mean_action_of_the_saved_actor(tmp_path, monkeypatch):
    # --eval-checkpoint through main: every action is tanh(mean(obs)) * scale + bias of the saved actor
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    env = gym.make("Hopper-v5")
    actor = sac.Actor(11, env.action_space.low, env.action_space.high)
    sac.save_policy("sac.cleanrl_model", actor, sac.TwinSoftQNetwork(11, 3), sac.Args(env_id="Hopper-v5"))
    recorders, make_env = [], sac.make_env
    monkeypatch.setattr(
        sac, "make_env", lambda *a, **k: recorders.append(RecordingEnv(make_env(*a, **k))) or recorders[-1]
    )
    sac.main(sac.Args(eval_checkpoint="sac.cleanrl_model", eval_episodes=2, cuda=False))

    (run_dir,) = run_dirs(tmp_path)
    assert "Hopper-v5" in os.path.basename(run_dir), "the evaluation runs under the saved model's env"
    assert len(read_scalars(run_dir)["eval/episodic_return"]) == 2
    (recorder,) = recorders
    assert len(recorder.actions) > 10
    with torch.no_grad():
        hidden = actor.trunk(torch.as_tensor(np.array(recorder.observations), dtype=torch.float32))
        expected = torch.tanh(actor.fc_mean(hidden)) * actor.action_scale + actor.action_bias
    np.testing.assert_allclose(np.array(recorder.actions), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_loaded_actor_equals_saved_actor_bounds_included(tmp_path):
    torch.manual_seed(0)
    actor = sac.Actor(2, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    path = str(tmp_path / "sac.cleanrl_model")
    sac.save_policy(path, actor, sac.TwinSoftQNetwork(2, 2), sac.Args())
    loaded, _ = sac.load_policy(path, torch.device("cpu"))
    obs = torch.randn(5, 2)
    for got, want in zip(loaded(obs), actor(obs)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    torch.testing.assert_close(loaded.action_scale, torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(loaded.action_bias, torch.tensor([0.0, 0.5]))


def test_save_then_evaluate_round_trip_reproduces_the_evaluation(tmp_path):
    # The mean action and the same seed make evaluation deterministic: the saved actor must play
    # the very same episodes as the one that was trained.
    training, model_path = train_and_save_a_model(
        SCRIPT,
        "--env-id",
        "Hopper-v5",
        "--total-timesteps",
        "300",
        "--learning-starts",
        "290",
        "--batch-size",
        "64",
        "--eval-episodes",
        "1",
        "--progress-interval",
        "1e9",
        cwd=tmp_path,
    )
    evaluation = evaluate_saved_model(SCRIPT, model_path, 2, cwd=tmp_path)
    assert len(eval_returns(training.stdout)) == 1 and len(eval_returns(evaluation.stdout)) == 2
    assert eval_returns(evaluation.stdout)[:1] == eval_returns(training.stdout)
    # with a long interval, only the first and the last progress line
    assert progress_steps(training.stderr) == [100, 300]


# ---------------------------------------------------------------------------------------------
# Short MuJoCo runs
# ---------------------------------------------------------------------------------------------
# Hopper-v5, 500 steps: 370 random, then an update (of batches of 64) after each of the 130 others;
# the policy every 3rd step, 3 times in a row.
SHORT_RUN = [
    "--env-id",
    "Hopper-v5",
    "--total-timesteps",
    "500",
    "--learning-starts",
    "370",
    "--batch-size",
    "64",
    "--policy-frequency",
    "3",
    "--progress-interval",
    "0",
]


@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("short_run")
    result = run_script(SCRIPT, *SHORT_RUN, cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return result, read_scalars(run_dir)


def test_short_run_updates_the_critics_every_step_and_the_policy_as_often_though_delayed(short_run):
    result, _ = short_run
    # steps 371..500 update the critics; steps 372, 375, ..., 498 (43 of them) the policy, 3 times each
    summary = result.stdout.strip().splitlines()[-1]
    assert summary.startswith("finished 500 steps, 130 critic updates, 129 actor updates"), summary


def test_short_run_logs_every_tag(short_run):
    _, scalars = short_run
    assert set(SAC_TAGS) <= set(scalars)
    assert [step for step, _ in scalars["charts/SPS"]] == [100, 200, 300, 400, 500]
    for tag in SAC_TAGS[3:]:  # the losses, once learning has started
        assert [step for step, _ in scalars[tag]] == [400, 500], tag
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag


def test_short_run_tunes_alpha_from_1(short_run):
    _, scalars = short_run
    alphas = [value for _, value in scalars["losses/alpha"]]
    assert all(0 < a < 1 for a in alphas)
    assert len(set(alphas)) == len(alphas), "alpha changes with every policy update"


def test_short_run_logs_each_episode_at_its_own_step(short_run):
    _, scalars = short_run
    steps = [step for step, _ in scalars["charts/episodic_length"]]
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert len(steps) >= 5 and steps == list(np.cumsum(lengths))
    assert [step for step, _ in scalars["charts/episodic_return"]] == steps


def test_short_run_prints_a_progress_line_at_each_log_point(short_run):
    result, _ = short_run
    assert progress_steps(result.stderr) == [100, 200, 300, 400, 500]


def test_without_autotune_alpha_stays_fixed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sac.main(
        sac.Args(
            env_id="Hopper-v5",
            total_timesteps=300,
            learning_starts=150,
            batch_size=64,
            autotune=False,
            alpha=0.05,
            cuda=False,
        )
    )
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert [value for _, value in scalars["losses/alpha"]] == pytest.approx([0.05, 0.05])
    assert "losses/alpha_loss" not in scalars


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """150 steps on InvertedPendulum-v5, tracked offline, videos where MuJoCo can render."""
    cwd = tmp_path_factory.mktemp("tracked_run")
    run_tracked_on_inverted_pendulum(
        SCRIPT, "--total-timesteps", "150", "--learning-starts", "100", "--batch-size", "64", cwd=cwd
    )
    return cwd


def test_track_creates_a_wandb_run(tracked_run):
    assert glob.glob(str(tracked_run / "wandb" / "offline-run-*")), os.listdir(tracked_run)


@pytest.mark.skipif(
    mujoco_offscreen_rendering_error() is not None,
    reason=f"MuJoCo cannot render offscreen here: {mujoco_offscreen_rendering_error()}",
)
def test_capture_video_records_episodes_0_1_8_and_uploads_them(tracked_run):
    assert_episodes_0_1_8_recorded_and_uploaded(tracked_run)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(sac.Progress, monkeypatch)


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
def test_bad_input_from_the_command_line_is_a_one_line_error_without_traceback(tmp_path):
    assert_user_error(run_script(SCRIPT, "--env-id", "NoSuchEnv-v0", cwd=tmp_path, timeout=120), "NoSuchEnv-v0")


@pytest.mark.parametrize(
    "overrides, fragment",
    [
        (dict(env_id="NoSuchEnv-v0"), "NoSuchEnv-v0"),
        (dict(env_id="CartPole-v1"), "continuous (Box)"),
        (dict(total_timesteps=5000), "leaves no step to learn"),
        (dict(batch_size=0), "must be positive"),
        (dict(buffer_size=0), "must be positive"),
        (dict(policy_frequency=0), "must be positive"),
        (dict(learning_starts=-1), "at least 0"),
        (dict(tau=0.0), "--tau must be in (0, 1] and --gamma in [0, 1], got 0.0, 0.99"),
        (dict(eval_checkpoint="missing.cleanrl_model"), "does not exist"),
        (dict(seed=2**32), "--seed must lie in [0, 2**32), got 4294967296"),
        (dict(env_id="StepCountDictObservation-v0"), "observation space Dict("),
        (dict(env_id="nosuchpackage:Env-v0"), "cannot make environment 'nosuchpackage:Env-v0'"),
        (dict(q_lr=-1e-3), "--policy-lr, --q-lr and --alpha must not be negative, got 0.0003, -0.001, 0.2"),
        (dict(exp_name="a/b"), "--exp-name 'a/b' must be a name without '/'"),
    ],
    ids=[
        "unknown-env-id",
        "discrete-actions",
        "no-learning-step",
        "no-batch",
        "no-buffer",
        "no-policy-updates",
        "negative-learning-starts",
        "tau-zero",
        "missing-checkpoint",
        "seed-beyond-numpy",
        "dict-observations",
        "missing-module",
        "negative-q-lr",
        "exp-name-with-slash",
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, overrides, fragment):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(sac.main, sac.Args(**overrides), fragment)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(gamma=1.5), "--tau must be in (0, 1] and --gamma in [0, 1], got 0.005, 1.5"),
        (dict(alpha=-0.1), "--policy-lr, --q-lr and --alpha must not be negative, got 0.0003, 0.001, -0.1"),
    ],
    ids=["gamma-above-1", "negative-alpha"],
)
def test_a_discount_or_temperature_out_of_range_is_a_one_line_error_naming_the_flag(overrides, message):
    # check_args alone: were the check missing, main would train for the default million steps
    assert_main_fails_with(sac.check_args, sac.Args(**overrides), message)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    assert_main_fails_with(sac.main, sac.Args(eval_checkpoint="corrupt.cleanrl_model"), "not a readable")
