"""The checks that td3_continuous_action.py and ddpg_continuous_action.py share: a deterministic tanh policy
explored with Gaussian noise, a replay buffer checkpointed with the run, target networks updated with the
actor every `policy_frequency` steps, the saved policy and its evaluation. Each check takes the script's
module (and, where the two differ, its critic's class name)."""

import gc
import glob
import os
import re
import shutil

import fake_envs  # noqa: F401  (registers the StepCount test envs)
import gymnasium as gym
import numpy as np
import pytest
import torch
from checkpoints import mappings_once_removed
from evaluation import eval_returns
from interruptions import CutOff, cut_off_at, flushing_writer
from running import assert_main_fails_with, read_scalars, run_dirs

# One torch thread for the runs the tests start: the test machine's 2 cores are shared, where a second thread's
# spin-waits slow a process down many times.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


# ---------------------------------------------------------------------------------------------
# The math
# ---------------------------------------------------------------------------------------------
def reference_td_target(reward: float, kind: str, next_q: list[float], gamma: float) -> float:
    """One transition, plain Python: a termination has no future; a running or truncated transition (the
    buffer holds the real last observation of a time limit's cut) bootstraps from the smallest of the target
    critics' values (the one critic's, for DDPG)."""
    return reward if kind == "terminated" else reward + gamma * min(next_q)


def assert_td_target_matches_reference(td_target, num_critics: int):
    """A script's target(rewards, terminations, next_q, gamma), next_q (num_critics, batch) or (batch,) for one
    critic, fed the termination flags its buffer stores (1 only for "terminated"), against reference_td_target on
    running, terminated and truncated transitions; the critics disagree in both directions."""
    rng = np.random.default_rng(0)
    kinds = ["running", "terminated", "truncated"] * 8
    rewards, next_q = rng.normal(size=24), rng.normal(size=(num_critics, 24))
    if num_critics == 2:
        assert (next_q[0] < next_q[1]).any() and (next_q[0] > next_q[1]).any()
    terminations = torch.tensor([float(kind == "terminated") for kind in kinds], dtype=torch.float64)
    q = torch.tensor(next_q if num_critics > 1 else next_q[0])
    target = td_target(torch.tensor(rewards), terminations, q, 0.9)
    expected = [reference_td_target(r, kind, list(qs), 0.9) for r, kind, qs in zip(rewards, kinds, next_q.T)]
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-12, atol=1e-12)


def reference_update_schedule(total_steps: int, learning_starts: int, policy_frequency: int) -> tuple[list, list]:
    """The delayed schedule of TD3 (Fujimoto et al., 2018, Algorithm 1) and of CleanRL's DDPG, written as the
    steps of each kind: the critics learn at every step after learning_starts (steps counted from 1); the actor
    and the target networks at every policy_frequency-th step of the run among those."""
    critic_steps = list(range(learning_starts + 1, total_steps + 1))
    actor_steps = [
        step for step in range(policy_frequency, total_steps + 1, policy_frequency) if step > learning_starts
    ]
    return critic_steps, actor_steps


def assert_update_schedule_matches_reference(update_schedule):
    """update_schedule(global_step, learning_starts, policy_frequency) -> (critics, actor and targets), against
    reference_update_schedule for learning starts that are and are not multiples of the frequency."""
    for learning_starts, policy_frequency in [(10, 2), (11, 2), (10, 3), (0, 1), (7, 4), (25, 1)]:
        decisions = [update_schedule(step, learning_starts, policy_frequency) for step in range(1, 61)]
        critic_steps = [step for step, (critic, _) in enumerate(decisions, 1) if critic]
        actor_steps = [step for step, (_, actor) in enumerate(decisions, 1) if actor]
        expected = reference_update_schedule(60, learning_starts, policy_frequency)
        assert (critic_steps, actor_steps) == expected, (learning_starts, policy_frequency)


def assert_check_catches(check, wrong_version):
    """`check(function)` fails on a deliberately wrong version of the function: the check can tell."""
    with pytest.raises(AssertionError):
        check(wrong_version)


def actor_updated_every_step(global_step: int, learning_starts: int, policy_frequency: int) -> tuple[bool, bool]:
    learning = global_step > learning_starts
    return learning, learning


def targets_from_the_first_learning_step(global_step: int, learning_starts: int, policy_frequency: int):
    # counted from learning_starts instead of the run's first step: another phase whenever it is no multiple
    learning = global_step > learning_starts
    return learning, learning and (global_step - learning_starts - 1) % policy_frequency == 0


def assert_polyak_averaging(soft_update, make_network):
    """soft_update(target, online, tau): target <- tau * online + (1 - tau) * target, every parameter; a copy at 1."""
    torch.manual_seed(0)
    online, target = make_network(), make_network()
    before = [p.clone() for p in target.parameters()]
    soft_update(target, online, 0.25)
    for new, old, param in zip(target.parameters(), before, online.parameters()):
        torch.testing.assert_close(new, 0.25 * param + 0.75 * old)
    soft_update(target, online, 1.0)
    for new, param in zip(target.parameters(), online.parameters()):
        torch.testing.assert_close(new, param, rtol=0, atol=0)


def assert_actor_maps_onto_the_action_bounds(module):
    """mu(s) = tanh(fc_mu(trunk(s))) * scale + bias, inside asymmetric bounds and reaching them."""
    torch.manual_seed(0)
    low, high = np.array([-2.0, 0.0]), np.array([2.0, 1.0])
    actor = module.Actor(3, low, high)
    obs = torch.randn(64, 3)
    with torch.no_grad():
        expected = torch.tanh(actor.fc_mu(actor.trunk(obs))) * torch.tensor([2.0, 0.5]) + torch.tensor([0.0, 0.5])
        torch.testing.assert_close(actor(obs), expected)
        actor.fc_mu.bias.fill_(50.0)
        torch.testing.assert_close(actor(obs), torch.tensor(high, dtype=torch.float32).expand(64, 2))
        actor.fc_mu.bias.fill_(-50.0)
        torch.testing.assert_close(actor(obs), torch.tensor(low, dtype=torch.float32).expand(64, 2))


# ---------------------------------------------------------------------------------------------
# Replay buffer
# ---------------------------------------------------------------------------------------------
def add_numbered(rb, n: int):
    """Adds transitions 0..n-1; every field of transition i encodes i."""
    for i in range(n):
        rb.add(np.full(2, i), np.full(1, i + 0.5), float(-i), np.full(2, i + 1), i % 3 == 0)


def assert_replay_buffer_samples_whole_transitions_and_overwrites_the_oldest(module):
    rb = module.ReplayBuffer(10, 2, 1)
    add_numbered(rb, 6)
    batch = rb.sample(500, np.random.default_rng(0))
    i = batch["obs"][:, 0]
    assert set(i.tolist()) == set(range(6)), "uniform over the 6 stored, none of the 4 empty slots"
    np.testing.assert_array_equal(batch["obs"][:, 1], i)
    np.testing.assert_array_equal(batch["actions"][:, 0], i + 0.5)
    np.testing.assert_array_equal(batch["rewards"], -i)
    np.testing.assert_array_equal(batch["next_obs"], np.stack([i + 1, i + 1], axis=1))
    np.testing.assert_array_equal(batch["terminations"], (i % 3 == 0).astype(np.float32))
    full = module.ReplayBuffer(4, 2, 1)
    add_numbered(full, 7)
    assert full.size == 4
    assert set(full.sample(400, np.random.default_rng(1))["obs"][:, 0].tolist()) == {3, 4, 5, 6}


def assert_replay_buffer_survives_a_checkpoint(module, tmp_path):
    """state_dict -> torch.save -> torch.load (memory-mapped, as a resume reads it) -> load_state_dict: the same
    rows, position and samples, and the buffer goes on overwriting where it left off. A checkpoint of a partly
    filled buffer holds only its stored rows, not its capacity."""
    for capacity, added in [(10_000, 6), (4, 7)]:
        rb = module.ReplayBuffer(capacity, 2, 1)
        add_numbered(rb, added)
        path = str(tmp_path / "buffer.pt")
        torch.save(rb.state_dict(), path)
        if capacity == 10_000:
            assert os.path.getsize(path) < 10_000, "the 6 rows, not the 10,000 of the capacity"
        loaded = module.ReplayBuffer(capacity, 2, 1)
        loaded.load_state_dict(torch.load(path, weights_only=True, mmap=True))
        assert (loaded.pos, loaded.size) == (rb.pos, rb.size)
        for name in module.ReplayBuffer.FIELDS:
            np.testing.assert_array_equal(getattr(loaded, name), getattr(rb, name))
        for got, want in zip(*(b.sample(32, np.random.default_rng(3)).values() for b in (loaded, rb))):
            np.testing.assert_array_equal(got, want)
        add_numbered(loaded, 1)
        assert loaded.obs[rb.pos, 0] == 0 and loaded.size == min(rb.size + 1, capacity)


def collected_buffer(module, env_id: str, tmp_path, monkeypatch):
    """The replay buffer of a 40-step run (30 random, 10 learning) on one of the step-count envs."""
    monkeypatch.chdir(tmp_path)
    buffers = []

    class RecordingReplayBuffer(module.ReplayBuffer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            buffers.append(self)

    monkeypatch.setattr(module, "ReplayBuffer", RecordingReplayBuffer)
    module.main(module.Args(env_id=env_id, total_timesteps=40, learning_starts=30, batch_size=8, cuda=False))
    (rb,) = buffers
    assert rb.size == 40
    return rb


def assert_a_time_limit_cut_keeps_its_real_final_observation_and_bootstraps(module, tmp_path, monkeypatch):
    rb = collected_buffer(module, "StepCountTruncatedAfter4-v0", tmp_path, monkeypatch)
    t = rb.obs[:40, 0]
    np.testing.assert_array_equal(t, [i % 4 for i in range(40)])  # the next episode starts from its reset
    np.testing.assert_array_equal(rb.next_obs[:40, 0], t + 1)  # t = 4 at the cut, not the next reset's 0
    np.testing.assert_array_equal(rb.rewards[:40], t + 1)
    assert not rb.terminations[:40].any(), "a time limit is no termination"


def assert_a_termination_is_stored_as_terminal(module, tmp_path, monkeypatch):
    rb = collected_buffer(module, "StepCountTerminatesAfter5-v0", tmp_path, monkeypatch)
    t = rb.obs[:40, 0]
    np.testing.assert_array_equal(t, [i % 5 for i in range(40)])
    np.testing.assert_array_equal(rb.next_obs[:40, 0], t + 1)
    np.testing.assert_array_equal(rb.terminations[:40], (t == 4).astype(np.float32))


def assert_videos_of_a_resumed_run_are_numbered_on(module, tmp_path):
    """make_env(env_id, folder, first_episode): RecordVideo numbers the episodes from first_episode on (a resumed
    run's env starts after the episodes its checkpoint had finished), so the first attempt's videos are not
    overwritten with other episodes, and the schedule goes on (episode 27 is recorded, 28 not)."""
    env = module.make_env("InvertedPendulum-v5", str(tmp_path / "videos"), 27)
    env.reset(seed=0)
    for _ in range(2):
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
        env.reset()
    env.close()
    assert os.listdir(tmp_path / "videos") == ["rl-video-episode-27.mp4"]


# ---------------------------------------------------------------------------------------------
# Runs on the step-count envs, their networks watched
# ---------------------------------------------------------------------------------------------
def recorded_networks(module, critic_class: str, monkeypatch) -> tuple[list, list, list]:
    """The next run's actors and critics as made (the online one first, then its target), and the online
    actor's calls, (obs, action)."""
    actors, critics, actor_calls = [], [], []

    class RecordedActor(module.Actor):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            actors.append(self)

        def forward(self, obs):
            action = super().forward(obs)
            if self is actors[0]:
                actor_calls.append((obs, action))
            return action

    class RecordedCritic(getattr(module, critic_class)):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            critics.append(self)

    monkeypatch.setattr(module, "Actor", RecordedActor)
    monkeypatch.setattr(module, critic_class, RecordedCritic)
    return actors, critics, actor_calls


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


def recording_make_env(module, monkeypatch) -> list[RecordingEnv]:
    recorders, make_env = [], module.make_env
    monkeypatch.setattr(
        module, "make_env", lambda *a, **k: recorders.append(RecordingEnv(make_env(*a, **k))) or recorders[-1]
    )
    return recorders


def assert_exploration_adds_gaussian_noise_in_half_ranges_within_the_bounds(
    module, critic_class, tmp_path, monkeypatch
):
    # A learning rate of 0 keeps the actor as it starts: past learning_starts, each action less mu(obs) is the
    # noise, N(0, (exploration_noise * half-range)^2) per dimension, here half-ranges 2 and 0.5. Then the noise
    # of a huge exploration_noise must be clipped into the bounds: the step-count env rejects any action outside.
    monkeypatch.chdir(tmp_path)
    actors, _, _ = recorded_networks(module, critic_class, monkeypatch)
    recorders = recording_make_env(module, monkeypatch)
    args = dict(env_id="StepCountTruncatedAfter4-v0", total_timesteps=400, learning_starts=100, batch_size=8)
    module.main(module.Args(**args, learning_rate=0.0, exploration_noise=0.1, cuda=False))
    (recorder,) = recorders
    observations = torch.tensor(np.array(recorder.observations[100:]), dtype=torch.float32)
    with torch.no_grad():
        noise = np.array(recorder.actions[100:]) - actors[0](observations).numpy()
    np.testing.assert_allclose(noise.mean(axis=0), [0.0, 0.0], atol=0.03)
    np.testing.assert_allclose(noise.std(axis=0), [0.2, 0.05], rtol=0.15)
    assert abs(np.corrcoef(noise[:-1, 0], noise[1:, 0])[0, 1]) < 0.15, "independent draws, not a slow process"

    recorders.clear()
    module.main(module.Args(**args, exploration_noise=10.0, cuda=False))  # the env fails on an action out of bounds
    actions = np.array(recorders[0].actions[100:])
    assert (actions[:, 1] == 0.0).any() and (actions[:, 1] == 1.0).any(), "clipped onto both bounds"


def assert_targets_move_only_with_the_actor_every_policy_frequency_steps(module, tmp_path, monkeypatch):
    # Every soft update is logged with the step it happens at: the actor's target and the critics' targets,
    # once each, at the actor's steps (multiples of policy_frequency past learning_starts), and never between.
    monkeypatch.chdir(tmp_path)
    steps, updates = [], []
    update_schedule, soft_update = module.update_schedule, module.soft_update

    def watched_schedule(global_step, learning_starts, policy_frequency):
        steps.append(global_step)
        return update_schedule(global_step, learning_starts, policy_frequency)

    def watched_soft_update(target, online, tau):
        updates.append((steps[-1], type(online).__name__))
        soft_update(target, online, tau)

    monkeypatch.setattr(module, "update_schedule", watched_schedule)
    monkeypatch.setattr(module, "soft_update", watched_soft_update)
    args = dict(total_timesteps=60, learning_starts=31, batch_size=8, policy_frequency=4, cuda=False)
    module.main(module.Args(env_id="StepCountTerminatesAfter5-v0", **args))
    critic = next(name for _, name in updates if "Actor" not in name)
    expected = [(step, name) for step in (32, 36, 40, 44, 48, 52, 56, 60) for name in ("Actor", critic)]
    assert sorted(updates) == sorted(expected)


def assert_the_actor_climbs_the_critic(module, critic_class, q_of, tmp_path, monkeypatch):
    """The logged actor loss of the last step is -mean(q_of(online critic, obs, mu(obs))) with the critic as it
    ends the run (the actor's update is the last thing to use it) and mu the actor before its step."""
    monkeypatch.chdir(tmp_path)
    _, critics, actor_calls = recorded_networks(module, critic_class, monkeypatch)
    module.main(module.Args(env_id="StepCountTerminatesAfter5-v0", total_timesteps=100, learning_starts=60, cuda=False))
    ((step, logged),) = read_scalars(run_dirs(tmp_path)[0])["losses/actor_loss"]
    assert step == 100
    online = critics[0]
    assert next(online.parameters()).grad is not None
    obs, actions = actor_calls[-1]  # the actor's update at step 100
    assert len(obs) == module.Args().batch_size
    with torch.no_grad():
        np.testing.assert_allclose(logged, -q_of(online, obs, actions).mean().item(), rtol=1e-5)
    return online, obs, actions


def assert_td_targets_come_from_the_target_networks(module, critic_class, target_function, tmp_path, monkeypatch):
    """Every TD target bootstraps from the target critic(s) at the sampled next observations and the target
    actor's actions there (TD3: smoothed, by smoothed_target_actions with the run's noise settings), never
    from the online networks, which differ from them once they have learned."""
    monkeypatch.chdir(tmp_path)
    actors, critics, _ = recorded_networks(module, critic_class, monkeypatch)
    samples, next_actions, checked = [], [], []
    args = module.Args(env_id="StepCountTruncatedAfter4-v0", total_timesteps=60, learning_starts=40, cuda=False)

    class RecordedReplayBuffer(module.ReplayBuffer):
        def sample(self, *a, **k):
            samples.append(super().sample(*a, **k))
            return samples[-1]

    def sampled_next_obs():
        return torch.from_numpy(samples[-1]["next_obs"])

    if hasattr(module, "smoothed_target_actions"):
        smoothed_target_actions = module.smoothed_target_actions

        def checked_smoothing(target_actions, standard_noise, policy_noise, noise_clip, scale, bias):
            torch.testing.assert_close(target_actions, actors[1](sampled_next_obs()), rtol=0, atol=0)
            assert standard_noise.shape == target_actions.shape and standard_noise.std() > 0.5
            assert (policy_noise, noise_clip) == (args.policy_noise, args.noise_clip)
            torch.testing.assert_close(torch.stack([scale, bias]), torch.tensor([[2.0, 0.5], [0.0, 0.5]]))
            next_actions.append(
                smoothed_target_actions(target_actions, standard_noise, policy_noise, noise_clip, scale, bias)
            )
            return next_actions[-1]

        monkeypatch.setattr(module, "smoothed_target_actions", checked_smoothing)
    target = getattr(module, target_function)

    def checked_target(rewards, terminations, next_q, gamma):
        obs = sampled_next_obs()
        actions = next_actions[-1] if next_actions else actors[1](obs)
        torch.testing.assert_close(next_q, critics[1](obs, actions), rtol=0, atol=0)
        if next(critics[0].parameters()).grad is not None:  # learned: the online critic and its target differ
            assert not torch.allclose(critics[0](obs, actions), next_q)
            checked.append(len(samples))
        np.testing.assert_array_equal(rewards.numpy(), samples[-1]["rewards"])
        np.testing.assert_array_equal(terminations.numpy(), samples[-1]["terminations"])
        assert gamma == args.gamma
        return target(rewards, terminations, next_q, gamma)

    monkeypatch.setattr(module, "ReplayBuffer", RecordedReplayBuffer)
    monkeypatch.setattr(module, target_function, checked_target)
    module.main(args)
    assert len(actors) == 2 and len(critics) == 2 and len(checked) == len(samples) - 1 == 19
    assert not torch.equal(next(actors[0].parameters()), next(actors[1].parameters())), "the actor has learned"


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
def assert_loaded_actor_equals_saved_actor_bounds_included(module, critic_class, tmp_path):
    torch.manual_seed(0)
    actor = module.Actor(2, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    path = str(tmp_path / "model.cleanrl_model")
    module.save_policy(path, actor, getattr(module, critic_class)(2, 2), module.Args())
    loaded, saved_args = module.load_policy(path, torch.device("cpu"))
    assert saved_args["env_id"] == module.Args().env_id
    obs = torch.randn(5, 2)
    torch.testing.assert_close(loaded(obs), actor(obs), rtol=0, atol=0)
    torch.testing.assert_close(loaded.action_scale, torch.tensor([2.0, 0.5]))
    torch.testing.assert_close(loaded.action_bias, torch.tensor([0.0, 0.5]))


def assert_evaluation_plays_the_saved_actors_action_without_noise(module, critic_class, tmp_path, monkeypatch):
    # --eval-checkpoint through main: every action is mu(obs) of the saved actor, under the saved model's env
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    env = gym.make("Hopper-v5")
    actor = module.Actor(11, env.action_space.low, env.action_space.high)
    module.save_policy(
        "model.cleanrl_model", actor, getattr(module, critic_class)(11, 3), module.Args(env_id="Hopper-v5")
    )
    recorders = recording_make_env(module, monkeypatch)
    module.main(module.Args(eval_checkpoint="model.cleanrl_model", eval_episodes=2, cuda=False))
    (run_dir,) = run_dirs(tmp_path)
    assert "Hopper-v5" in os.path.basename(run_dir), "the evaluation runs under the saved model's env"
    assert len(read_scalars(run_dir)["eval/episodic_return"]) == 2
    (recorder,) = recorders
    assert len(recorder.actions) > 10
    with torch.no_grad():
        expected = actor(torch.as_tensor(np.array(recorder.observations), dtype=torch.float32))
    np.testing.assert_allclose(np.array(recorder.actions), expected.numpy(), rtol=1e-5, atol=1e-6)


def assert_save_then_evaluate_reproduces_the_evaluation(module, tmp_path, monkeypatch, capsys):
    """The policy's action and the same seed make an evaluation deterministic: the saved actor, loaded by
    --eval-checkpoint, plays the very same episodes as the evaluation right after training."""
    monkeypatch.chdir(tmp_path)
    args = dict(env_id="Hopper-v5", total_timesteps=300, learning_starts=250, batch_size=32, cuda=False)
    module.main(module.Args(**args, save_model=True, eval_episodes=1))
    training = capsys.readouterr().out
    (model_path,) = glob.glob(
        os.path.join("runs", "*", os.path.basename(module.__file__).replace(".py", ".cleanrl_model"))
    )
    module.main(module.Args(eval_checkpoint=model_path, eval_episodes=2, cuda=False))
    evaluation = capsys.readouterr().out
    assert len(eval_returns(training)) == 1 and len(eval_returns(evaluation)) == 2
    assert eval_returns(evaluation)[:1] == eval_returns(training)
    assert "eval: mean return" in evaluation


def assert_a_saved_policy_of_an_env_not_here_is_a_one_line_error(module, critic_class, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    actor = module.Actor(2, np.array([-2.0, 0.0]), np.array([2.0, 1.0]))
    module.save_policy(
        "m.cleanrl_model", actor, getattr(module, critic_class)(2, 2), module.Args(env_id="NoSuchEnv-v0")
    )
    message = "cannot make the model's environment 'NoSuchEnv-v0'"
    assert_main_fails_with(module.main, module.Args(eval_checkpoint="m.cleanrl_model"), message)
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    assert_main_fails_with(module.main, module.Args(eval_checkpoint="corrupt.cleanrl_model"), "not a readable")
    assert not os.path.exists("runs")


# ---------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------
# (Args overrides, a fragment of the one-line error): the cases of both scripts.
BAD_INPUT = [
    (dict(env_id="NoSuchEnv-v0"), "NoSuchEnv-v0"),
    (dict(env_id="CartPole-v1"), "continuous (Box)"),
    (dict(env_id="StepCountDictObservation-v0"), "observation space Dict("),
    (dict(env_id="nosuchpackage:Env-v0"), "cannot make environment 'nosuchpackage:Env-v0'"),
    (dict(total_timesteps=25_000), "--learning-starts 25000 leaves no step to learn"),
    (dict(batch_size=0), "--batch-size must be positive, got 0"),
    (dict(buffer_size=0), "--buffer-size must be positive, got 0"),
    (dict(policy_frequency=0), "--policy-frequency must be positive, got 0"),
    (dict(eval_episodes=0), "--eval-episodes must be positive, got 0"),
    (dict(learning_starts=-1), "--learning-starts must be at least 0, got -1"),
    (dict(checkpoint_every=-5), "--checkpoint-every must be at least 0, got -5"),
    (dict(tau=0.0), "--tau must be in (0, 1] and --gamma in [0, 1], got 0.0, 0.99"),
    (dict(gamma=1.5), "--tau must be in (0, 1] and --gamma in [0, 1], got 0.005, 1.5"),
    (dict(learning_rate=-1e-3), "--learning-rate must not be negative, got -0.001"),
    (dict(exploration_noise=-0.1), "--exploration-noise must not be negative, got -0.1"),
    (dict(exploration_noise=float("nan")), "--exploration-noise must not be negative, got nan"),
    (dict(seed=2**32), "--seed must lie in [0, 2**32), got 4294967296"),
    (dict(exp_name="a/b"), "--exp-name 'a/b' must be a name without '/'"),
    (dict(eval_checkpoint="missing.cleanrl_model"), "does not exist"),
    (dict(resume="missing.pt"), "--resume 'missing.pt': no such checkpoint file"),
]


def bad_input_id(value) -> str | None:
    """A parametrized case's id: its overrides, `batch_size=0`."""
    return "-".join(f"{key}={v}" for key, v in value.items()) if isinstance(value, dict) else None


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
def assert_run_resumes_where_its_checkpoint_left_it(module, tmp_path, monkeypatch, capsys):
    """A run of 800 steps on a step-count env (episodes of 4 steps, return 10), learning from step 200 (the actor
    and the targets every 2nd step), a checkpoint every 350 (in the middle of an episode), is cut off at step 400
    (its machine went away after logging it). `--resume auto` goes on from step 350 in the run's own directory
    with a new episode: every step logged once, every episode once, the counts, Adam's moments, the recent
    returns and the replay buffer carried on, the same numbers when the same checkpoint is resumed again; the
    resumed finished run saves the checkpoint's weights bit for bit. A second process cannot take the run over
    while the first holds it, nor a command with other hyperparameters."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "SummaryWriter", flushing_writer(module))
    script = os.path.basename(module.__file__)
    run = dict(env_id="StepCountTruncatedAfter4-v0", total_timesteps=800, learning_starts=200, batch_size=16)
    run.update(checkpoint_every=350, cuda=False)
    uncut = cut_off_at(module, monkeypatch, 400)
    with pytest.raises(CutOff):
        module.main(module.Args(**run))
    uncut()
    (run_dir,) = run_dirs(tmp_path)
    checkpoints = os.path.join(run_dir, "checkpoints")
    assert sorted(os.listdir(checkpoints)) == ["lock", "step-000000350.pt"]
    resumed_from = os.path.join(checkpoints, "step-000000350.pt")
    saved = torch.load(resumed_from, weights_only=True)
    assert (saved["num_q_updates"], saved["num_actor_updates"], saved["episodes"]) == (150, 75, 87)
    assert len(saved["replay_buffer"]["rewards"]) == 350
    capsys.readouterr()

    lock = module.lock_run(checkpoints)  # a process still running the run
    assert_main_fails_with(module.main, module.Args(**run, resume="auto"), "checkpoints is in use")
    lock.close()
    assert_main_fails_with(
        module.main,
        module.Args(**dict(run, policy_frequency=3), resume="auto"),
        "the checkpoint's run has policy_frequency=2, this command 3",
    )
    (tmp_path / "corrupt.pt").write_bytes(b"not a checkpoint")
    assert_main_fails_with(module.main, module.Args(**run, resume="corrupt.pt"), "not a readable")

    # The resumed run writes a checkpoint every 100 steps (how a run is saved may change): the one it was resumed
    # from is removed at step 500, and the run, which copied everything out of it, maps none of it.
    shutil.copy2(resumed_from, tmp_path / "kept_checkpoint")
    gc.collect()  # the failed calls' tracebacks hold their frames, the loaded (mapped) checkpoint with them, in cycles
    mapped, watcher = mappings_once_removed(resumed_from)
    module.main(module.Args(**dict(run, checkpoint_every=100, progress_interval=0.0), resume="auto"))
    output, progress = capsys.readouterr()
    watcher.join(timeout=10)
    assert not watcher.is_alive() and mapped == [], "the removed checkpoint's disk space is held by the run"
    assert re.search(r"resuming \S+ at step 350 from runs/\S+/checkpoints/step-000000350\.pt", output), output
    assert "has changed since the checkpoint" not in output
    assert "finished 800 steps, 600 critic updates, 300 actor updates" in output
    assert run_dirs(tmp_path) == [run_dir], "the resumed run goes on in its own directory"
    scalars = read_scalars(run_dir)
    assert [step for step, _ in scalars["charts/SPS"]] == list(range(100, 801, 100))
    for tag in ("losses/qf1_loss", "losses/actor_loss"):
        assert [step for step, _ in scalars[tag]] == list(range(300, 801, 100)), tag
    # every episode once, none of the cut-off attempt's past step 350; the resumed run's first starts at step 351
    episodes = scalars["charts/episodic_return"]
    assert [step for step, _ in episodes] == list(range(4, 349, 4)) + list(range(354, 801, 4))
    assert {value for _, value in episodes} == {10.0}, "whole episodes"
    # the recent returns go on from the checkpoint's: the resumed run's first progress line counts 20 of them
    first_line = next(line for line in progress.splitlines() if " steps | " in line)
    assert first_line.startswith("400/800 steps") and "return (last 20) 10.00" in first_line, first_line
    assert sorted(os.listdir(checkpoints)) == ["lock", "step-000000700.pt", "step-000000800.pt"]

    last_path = os.path.join(checkpoints, "step-000000800.pt")
    last = torch.load(last_path, weights_only=True)
    # Adam went on counting from the checkpoint's updates; the replay buffer kept the first attempt's 350 rows
    assert all(int(state["step"]) == 600 for state in last["q_optimizer"]["state"].values())
    assert all(int(state["step"]) == 300 for state in last["actor_optimizer"]["state"].values())
    for name, rows in saved["replay_buffer"].items():
        if name != "pos":
            assert torch.equal(last["replay_buffer"][name][:350], rows), name
    assert saved["replay_buffer"]["obs"][-1].tolist() == [1.0, 1.0], "the checkpoint came mid-episode"
    assert last["replay_buffer"]["obs"][350].tolist() == [0.0, 1.0], "the resumed run starts a new episode"
    assert last["episodes"] == 87 + 112

    # Resuming is deterministic: the same checkpoint resumed again logs the same episodes and losses, bit for bit.
    shutil.copy2(tmp_path / "kept_checkpoint", resumed_from)
    module.main(module.Args(**run, resume=resumed_from))
    again = read_scalars(run_dir)
    assert again.keys() == scalars.keys()
    for tag in scalars.keys() - {"charts/SPS"}:
        assert again[tag] == scalars[tag], tag

    # Resumed from its last checkpoint, the run has nothing left to learn: the model it saves is the checkpoint's,
    # bit for bit; a script changed since the checkpoint is named.
    last = torch.load(last_path, weights_only=True)
    torch.save({**last, "script_sha256": "another version of the file"}, last_path)
    capsys.readouterr()
    module.main(module.Args(**run, resume="auto", save_model=True, eval_episodes=1))
    output = capsys.readouterr().out
    assert "finished 800 steps, 600 critic updates, 300 actor updates" in output
    assert f"warning: {script} has changed since the checkpoint" in output
    model = torch.load(os.path.join(run_dir, script.replace(".py", ".cleanrl_model")), weights_only=True)["model"]
    for network in ("actor", "qf"):
        for name, value in last[network].items():
            assert torch.equal(model[network][name], value), (network, name)
