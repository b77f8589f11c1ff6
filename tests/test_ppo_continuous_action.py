"""Specification of cleanrl/ppo_continuous_action.py."""

import glob
import os

import numpy as np
import pytest
import torch
from evaluation import eval_returns, evaluate_saved_model, saved_model_path, train_and_save_a_model
from fake_envs import RecordingEnvs
from references import assert_gae_matches_reference, assert_ppo_loss_matches_reference
from run_outputs import (
    PPO_TAGS,
    assert_episodes_0_1_8_recorded_and_uploaded,
    assert_progress_follows_the_convention,
    mujoco_offscreen_rendering_error,
    progress_steps,
    run_tracked_on_inverted_pendulum,
)
from running import (
    assert_main_fails_with,
    assert_ppo_ranges_are_checked,
    assert_user_error,
    read_scalars,
    run_dirs,
    run_script,
)

import cleanrl.ppo_continuous_action as pca

SCRIPT = "ppo_continuous_action.py"
GAMMA = 0.99
# Hopper-v5: 4 iterations of 256 steps, 4 minibatches, 2 epochs; random play ends an episode every
# 20-60 steps.
SHORT_RUN = ["--env-id", "Hopper-v5", "--num-steps", "256", "--num-minibatches", "4", "--update-epochs", "2"]


TRUNCATION_LENGTH = 4  # of StepCountTruncatedAfter4-v0


def small_args(**overrides) -> pca.Args:
    """2 envs x 16 steps on StepCountTruncatedAfter4-v0, 2 iterations."""
    fields = dict(
        env_id="StepCountTruncatedAfter4-v0",
        num_envs=2,
        num_steps=16,
        num_minibatches=2,
        update_epochs=1,
        total_timesteps=64,
        eval_episodes=2,
        cuda=False,
    )
    return pca.Args(**{**fields, **overrides})


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def test_gaussian_log_prob_and_entropy_match_torch_distributions():
    torch.manual_seed(0)
    mean, log_std = torch.randn(7, 3, dtype=torch.float64), torch.randn(7, 3, dtype=torch.float64)
    action = mean + 3 * torch.randn(7, 3, dtype=torch.float64)
    reference = torch.distributions.Normal(mean, log_std.exp())
    log_prob, entropy = pca.gaussian_log_prob_and_entropy(action, mean, log_std)
    torch.testing.assert_close(log_prob, reference.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))


def test_agent_log_prob_is_that_of_its_state_independent_gaussian():
    torch.manual_seed(0)
    agent = pca.Agent(5, 3)
    with torch.no_grad():
        agent.actor_logstd.copy_(torch.tensor([[-0.5, 0.0, 0.7]]))
    obs = torch.randn(4, 5)
    action, logprob, entropy, _ = agent.get_action_and_value(obs)
    reference = torch.distributions.Normal(agent.actor_mean(obs), agent.actor_logstd.exp().expand(4, 3))
    torch.testing.assert_close(logprob, reference.log_prob(action).sum(-1))
    torch.testing.assert_close(entropy, reference.entropy().sum(-1))
    # the given action is scored, not resampled
    _, again, _, _ = agent.get_action_and_value(obs, action)
    torch.testing.assert_close(again, logprob)


def test_gae_matches_the_textbook_definition():
    assert_gae_matches_reference(pca.compute_gae, np.asarray)


def test_ppo_loss_matches_the_clipped_objective_of_the_paper():
    assert_ppo_loss_matches_reference(pca.ppo_loss, pca.Args())


def test_running_mean_std_equals_the_statistics_of_all_samples_seen():
    rng = np.random.default_rng(0)
    batches = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (1, 5, 2, 17)]
    rms = pca.RunningMeanStd((4,))
    for batch in batches:
        rms.update(batch)
    everything = np.concatenate(batches)
    assert rms.count == len(everything)
    np.testing.assert_allclose(rms.mean, everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(rms.var, everything.var(axis=0), rtol=1e-12)


def test_normalized_observations_are_standardized_then_clipped():
    mean, var = np.array([1.0, -2.0, 0.0]), np.array([4.0, 0.25, 1e-12])
    obs = np.array([[3.0, -2.5, 5.0]])
    expected = [[(3.0 - 1.0) / np.sqrt(4.0 + 1e-8), (-2.5 + 2.0) / np.sqrt(0.25 + 1e-8), 10.0]]
    normalized = pca.normalize_obs(obs, mean, var)
    assert normalized.dtype == np.float32
    np.testing.assert_allclose(normalized, expected, rtol=1e-6)


def test_rewards_are_divided_by_the_std_of_the_discounted_return_that_restarts_each_episode():
    rng = np.random.default_rng(0)
    num_steps, num_envs, gamma = 30, 2, 0.9
    rewards = rng.normal(1.0, 3.0, size=(num_steps, num_envs))
    dones = rng.random((num_steps, num_envs)) < 0.2
    assert dones.sum() >= 5
    normalizer = pca.RewardNormalizer(num_envs, gamma)
    running = [0.0] * num_envs
    seen_returns = []
    for t in range(num_steps):
        scaled = normalizer(rewards[t], dones[t])
        for env in range(num_envs):
            running[env] = gamma * running[env] + rewards[t, env]
            seen_returns.append(running[env])
        std = np.sqrt(np.var(seen_returns) + 1e-8)
        for env in range(num_envs):
            assert scaled[env] == pytest.approx(np.clip(rewards[t, env] / std, -10, 10), rel=1e-5)
            if dones[t, env]:  # terminated or truncated: the next episode's return starts at 0
                running[env] = 0.0


# ---------------------------------------------------------------------------------------------
# Episodes, normalization statistics, saving and evaluation
# ---------------------------------------------------------------------------------------------
class StepCountCritic(pca.Agent):
    """V(obs) = obs[0] (0 x the real critic keeps the value loss differentiable)."""

    def get_value(self, x):
        return x[:, :1] + 0.0 * self.critic(x)

    def get_action_and_value(self, x, action=None):
        action, logprob, entropy, _ = super().get_action_and_value(x, action)
        return action, logprob, entropy, self.get_value(x)


def record_rewards_and_rollouts(monkeypatch):
    """Makes main() keep each scaled reward of its normalizer and a copy of each rollout's
    (rewards, values, dones) as GAE gets them."""
    scaled_rewards, rollouts = [], []
    reward_normalizer_call, compute_gae = pca.RewardNormalizer.__call__, pca.compute_gae

    def recording_normalizer(self, rewards, dones):
        scaled_rewards.append(reward_normalizer_call(self, rewards, dones))
        return scaled_rewards[-1]

    def recording_gae(rewards, values, dones, next_value, gamma, gae_lambda):
        rollouts.append(tuple(np.array(array) for array in (rewards, values, dones)))  # copies
        return compute_gae(rewards, values, dones, next_value, gamma, gae_lambda)

    monkeypatch.setattr(pca.RewardNormalizer, "__call__", recording_normalizer)
    monkeypatch.setattr(pca, "compute_gae", recording_gae)
    return scaled_rewards, rollouts


def test_truncated_episodes_bootstrap_from_the_real_final_observation(tmp_path, monkeypatch):
    # Observations enter the critic raw here, so V(final obs) = 4 while V(next episode's first) = 0.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(pca, "normalize_obs", lambda obs, mean, var: np.asarray(obs, dtype=np.float32))
    monkeypatch.setattr(pca, "Agent", StepCountCritic)
    scaled_rewards, rollouts = record_rewards_and_rollouts(monkeypatch)
    rollouts_of = lambda: [tuple(torch.tensor(a) for a in rollout) for rollout in rollouts]
    pca.main(small_args(gamma=GAMMA))

    assert len(rollouts) == 2
    scaled = torch.tensor(np.array(scaled_rewards)).reshape(2, 16, 2)
    step_in_episode = torch.tensor([t % TRUNCATION_LENGTH for t in range(16)], dtype=torch.float32)[:, None]
    truncated = (step_in_episode == TRUNCATION_LENGTH - 1).expand(16, 2)
    for (rewards, values, dones), scaled_rollout in zip(rollouts_of(), scaled):
        torch.testing.assert_close(values, step_in_episode.expand(16, 2))
        torch.testing.assert_close(dones, truncated.float())
        torch.testing.assert_close(rewards, scaled_rollout + GAMMA * TRUNCATION_LENGTH * truncated)


def test_terminated_episodes_end_without_a_bootstrap(tmp_path, monkeypatch):
    # StepCountTerminatesAfter5-v0 ends every 5 steps by termination: done there, reward as scaled
    monkeypatch.chdir(tmp_path)
    scaled_rewards, rollouts = record_rewards_and_rollouts(monkeypatch)
    pca.main(small_args(env_id="StepCountTerminatesAfter5-v0", num_steps=20, total_timesteps=80))

    scaled = np.array(scaled_rewards).reshape(2, 20, 2)
    terminal = np.array([[float(t % 5 == 4)] * 2 for t in range(20)])
    for (rewards, _, dones), scaled_rollout in zip(rollouts, scaled, strict=True):
        np.testing.assert_array_equal(dones, terminal)
        np.testing.assert_array_equal(rewards, scaled_rollout)


@pytest.mark.parametrize("env_id, length", [("StepCountTruncatedAfter4-v0", 4), ("StepCountTerminatesAfter5-v0", 5)])
def test_logged_returns_are_the_raw_rewards_of_whole_episodes(tmp_path, monkeypatch, env_id, length):
    # the reward of step t is t: the normalized rewards the update sees would give other numbers
    monkeypatch.chdir(tmp_path)
    pca.main(small_args(env_id=env_id, num_steps=20, total_timesteps=80))
    scalars = read_scalars(run_dirs(tmp_path)[0])
    assert len(scalars["charts/episodic_return"]) == 2 * (80 // 2 // length)
    assert {value for _, value in scalars["charts/episodic_return"]} == {length * (length + 1) / 2}
    assert {value for _, value in scalars["charts/episodic_length"]} == {length}


def test_saved_observation_statistics_are_those_of_every_observation_the_policy_acted_on(tmp_path, monkeypatch):
    # 2 envs x 32 steps: each env acted on t = 0, 1, 2, 3, 0, ... (reset observations included),
    # then the observation after the last step; the final observations (t = 4) are not counted.
    monkeypatch.chdir(tmp_path)
    pca.main(small_args(save_model=True))
    _, obs_rms, saved_args = pca.load_policy(saved_model_path(SCRIPT, tmp_path), torch.device("cpu"))

    acted_on = np.array([[t % TRUNCATION_LENGTH, 1.0] for t in range(33)] * 2)
    assert obs_rms.count == len(acted_on) == 66
    np.testing.assert_allclose(obs_rms.mean, acted_on.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(obs_rms.var, acted_on.var(axis=0), rtol=1e-12, atol=1e-12)
    assert saved_args["env_id"] == "StepCountTruncatedAfter4-v0"


class ActionRecordingEnvs(RecordingEnvs):
    """RecordingEnvs that also keeps every action the env is given."""

    def __init__(self, envs):
        super().__init__(envs, observations=True)
        self.actions = []

    def step(self, actions):
        self.actions.append(np.array(actions, copy=True))
        return super().step(actions)


def test_evaluation_plays_the_mean_action_on_the_saved_observation_statistics_frozen(tmp_path, monkeypatch):
    # --eval-checkpoint through main: every action of the evaluation is the mean action of the saved network
    # on the raw observation normalized with the saved statistics; any update of them during the
    # evaluation would change the later actions.
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(0)
    agent = pca.Agent(11, 3)  # Hopper-v5
    obs_rms = pca.RunningMeanStd((11,))
    obs_rms.mean, obs_rms.var, obs_rms.count = rng.normal(0, 0.5, 11), rng.uniform(0.5, 3.0, 11), 1234
    pca.save_policy("agent.cleanrl_model", agent, obs_rms, pca.Args(env_id="Hopper-v5"))
    made, real_make_envs = [], pca.make_envs
    monkeypatch.setattr(
        pca, "make_envs", lambda *a, **k: made.append(ActionRecordingEnvs(real_make_envs(*a, **k))) or made[-1]
    )
    pca.main(pca.Args(eval_checkpoint="agent.cleanrl_model", eval_episodes=2, cuda=False))

    assert len(read_scalars(run_dirs(tmp_path)[0])["eval/episodic_return"]) == 2
    (envs,) = made
    raw = np.concatenate(envs.observations[: len(envs.actions)])
    normalized = np.clip((raw - obs_rms.mean) / np.sqrt(obs_rms.var + 1e-8), -10, 10)
    assert np.abs(normalized).max() < 10, "the statistics must matter, not the clipping"
    with torch.no_grad():
        expected = agent.actor_mean(torch.tensor(normalized, dtype=torch.float32)).clamp(-1.0, 1.0)
    np.testing.assert_allclose(np.concatenate(envs.actions), expected.numpy(), rtol=1e-5, atol=1e-6)


def test_loaded_model_equals_saved_model(tmp_path):
    torch.manual_seed(0)
    agent, obs_rms = pca.Agent(11, 3), pca.RunningMeanStd((11,))
    obs_rms.update(np.random.default_rng(0).normal(size=(9, 11)))
    path = str(tmp_path / "agent.cleanrl_model")
    pca.save_policy(path, agent, obs_rms, pca.Args(env_id="Hopper-v5"))
    loaded, loaded_rms, saved_args = pca.load_policy(path, torch.device("cpu"))
    obs = torch.randn(5, 11)
    torch.testing.assert_close(loaded.actor_mean(obs), agent.actor_mean(obs), rtol=0, atol=0)
    torch.testing.assert_close(loaded.get_value(obs), agent.get_value(obs), rtol=0, atol=0)
    torch.testing.assert_close(loaded.actor_logstd, agent.actor_logstd, rtol=0, atol=0)
    np.testing.assert_array_equal(loaded_rms.mean, obs_rms.mean)
    np.testing.assert_array_equal(loaded_rms.var, obs_rms.var)
    assert loaded_rms.count == 9 and saved_args["env_id"] == "Hopper-v5"


def test_save_then_evaluate_round_trip_reproduces_the_evaluation(tmp_path):
    # The mean action and the same seed make evaluation deterministic: the saved model, with its
    # observation statistics, must play the very same episodes as the model that was trained.
    training, model_path = train_and_save_a_model(
        SCRIPT,
        *SHORT_RUN,
        "--total-timesteps",
        "512",
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
    assert progress_steps(training.stderr) == [256, 512]


# ---------------------------------------------------------------------------------------------
# A short MuJoCo run
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def short_run(tmp_path_factory):
    """Hopper-v5, 4 iterations of 256 steps, a progress line after each."""
    cwd = tmp_path_factory.mktemp("short_run")
    result = run_script(SCRIPT, *SHORT_RUN, "--total-timesteps", "1024", "--progress-interval", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    (run_dir,) = run_dirs(cwd)
    return result, read_scalars(run_dir)


def test_short_run_finishes_its_iterations_and_logs_every_tag_after_each(short_run):
    result, scalars = short_run
    assert result.stdout.strip().splitlines()[-1].startswith("finished 4 iterations, 1024 steps")
    assert set(PPO_TAGS) <= set(scalars)
    for tag in PPO_TAGS[2:]:  # everything but the episode statistics: once per update
        assert [step for step, _ in scalars[tag]] == [256, 512, 768, 1024], tag
    assert all(np.isfinite(value) for tag in PPO_TAGS[4:] for _, value in scalars[tag])


def test_short_run_anneals_the_learning_rate_from_3e_4(short_run):
    _, scalars = short_run
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], [3e-4 * (1 - i / 4) for i in range(4)])


def test_short_run_logs_each_episode_at_its_own_step(short_run):
    _, scalars = short_run
    steps = [step for step, _ in scalars["charts/episodic_length"]]
    lengths = [length for _, length in scalars["charts/episodic_length"]]
    assert len(steps) >= 5 and steps == sorted(set(steps))
    # one env: an episode ends at the step where its length adds up
    assert steps == list(np.cumsum(lengths))
    assert [step for step, _ in scalars["charts/episodic_return"]] == steps


def test_short_run_prints_a_progress_line_after_each_iteration(short_run):
    result, _ = short_run
    assert progress_steps(result.stderr) == [256, 512, 768, 1024]


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory):
    """2 iterations of 64 steps on InvertedPendulum-v5, tracked offline, videos where MuJoCo can render."""
    cwd = tmp_path_factory.mktemp("tracked_run")
    run_tracked_on_inverted_pendulum(
        SCRIPT, "--num-steps", "64", "--num-minibatches", "2", "--total-timesteps", "128", cwd=cwd
    )
    return cwd


def test_track_creates_a_wandb_run(tracked_run):
    assert glob.glob(str(tracked_run / "wandb" / "offline-run-*")), os.listdir(tracked_run)


@pytest.mark.skipif(
    mujoco_offscreen_rendering_error() is not None,
    reason=f"MuJoCo cannot render offscreen here: {mujoco_offscreen_rendering_error()}",
)
def test_capture_video_records_episodes_0_1_8_of_env_0_and_uploads_them(tracked_run):
    assert_episodes_0_1_8_recorded_and_uploaded(tracked_run)


def test_progress_follows_the_convention(monkeypatch):
    assert_progress_follows_the_convention(pca.Progress, monkeypatch)


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
        (dict(num_minibatches=3), "not divisible"),
        (dict(total_timesteps=100), "smaller than one batch"),
        (dict(num_steps=4, num_minibatches=4), "cannot normalize advantages"),
        (dict(update_epochs=0), "must be positive"),
        (dict(num_envs=0), "must be positive"),
        (dict(eval_episodes=0), "must be positive"),
        (dict(eval_checkpoint="missing.cleanrl_model"), "does not exist"),
        (dict(seed=-1), "--seed must lie in [0, 2**32), got -1"),
        (dict(env_id="StepCountDictObservation-v0"), "observation space Dict("),
        (dict(env_id="nosuchpackage:Env-v0"), "cannot make environment 'nosuchpackage:Env-v0'"),
        (dict(exp_name="sweep/lr"), "--exp-name 'sweep/lr' must be a name without '/'"),
        (dict(max_grad_norm=-0.5), "--max-grad-norm must not be negative, got -0.5"),
    ],
    ids=[
        "unknown-env-id",
        "discrete-actions",
        "not-divisible",
        "below-one-batch",
        "minibatch-of-1",
        "no-epochs",
        "no-envs",
        "no-eval-episodes",
        "missing-checkpoint",
        "negative-seed",
        "dict-observations",
        "missing-module",
        "exp-name-with-slash",
        "negative-gradient-norm",
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, monkeypatch, overrides, fragment):
    monkeypatch.chdir(tmp_path)
    assert_main_fails_with(pca.main, pca.Args(**overrides), fragment)


def test_coefficients_and_discounts_out_of_range_are_one_line_errors_naming_the_flag():
    assert_ppo_ranges_are_checked(pca.check_args, pca.Args)


def test_a_saved_policy_whose_env_cannot_be_made_here_is_a_one_line_error_before_any_output(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pca.save_policy("agent.cleanrl_model", pca.Agent(2, 2), pca.RunningMeanStd((2,)), pca.Args(env_id="NoSuchEnv-v0"))
    message = "cannot make the model's environment 'NoSuchEnv-v0'"
    assert_main_fails_with(pca.main, pca.Args(eval_checkpoint="agent.cleanrl_model"), message)
    assert not os.path.exists("runs")


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    assert_main_fails_with(pca.main, pca.Args(eval_checkpoint="corrupt.cleanrl_model"), "not a readable")
