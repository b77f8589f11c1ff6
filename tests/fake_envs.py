"""Small environments whose every step is known, and a recorder of what a script's vector env was asked and
gave: for checking the rollout's dones, rewards and bootstraps exactly."""

import gymnasium as gym
import numpy as np


class RecordingEnvs:
    """Wraps a script's vector env and keeps what every step returned, so a test can hold the
    script's rollout against what the environment really did. steps[t] = (reward, terminated,
    truncated, info) of vector step t, as numpy copies. With `observations`, also every observation
    that reset and step returned, in order (off by default: Atari's are large)."""

    def __init__(self, envs, observations: bool = False):
        self.envs, self.steps = envs, []
        self.observations = [] if observations else None

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def reset(self, *args, **kwargs):
        obs, info = self.envs.reset(*args, **kwargs)
        if self.observations is not None:
            self.observations.append(np.array(obs, copy=True))
        return obs, info

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        copied_info = {key: np.array(value, copy=True) for key, value in info.items()}
        self.steps.append((reward.copy(), terminated.copy(), truncated.copy(), copied_info))
        if self.observations is not None:
            self.observations.append(np.array(obs, copy=True))
        return obs, reward, terminated, truncated, info


def recording_make_envs(module, monkeypatch, observations: bool = False) -> list[RecordingEnvs]:
    """Makes every `module.make_envs(...)` call return a RecordingEnvs; returns the list of them."""
    made, real_make_envs = [], module.make_envs

    def make_envs(*args, **kwargs):
        made.append(RecordingEnvs(real_make_envs(*args, **kwargs), observations))
        return made[-1]

    monkeypatch.setattr(module, "make_envs", make_envs)
    return made


class StepCountEnv(gym.Env):
    """A continuous-control env whose every number is known: the observation is [t, 1], t the step
    within the episode; the reward of step t is t; it terminates after exactly `length` steps (never,
    if length is None). Actions must lie in the asymmetric bounds [-2, 2] x [0, 1]."""

    observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 1.0], np.float32))

    def __init__(self, length: int | None = None):
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0]), {}

    def step(self, action):
        assert self.action_space.contains(np.asarray(action, np.float32)), f"action {action} out of bounds"
        self.t += 1
        terminated = self.length is not None and self.t >= self.length
        return np.array([float(self.t), 1.0]), float(self.t), terminated, False, {}


class DictObservationEnv(StepCountEnv):
    """StepCountEnv's actions with a Dict observation, as goal-conditioned tasks have: not for these scripts."""

    observation_space = gym.spaces.Dict({"observation": StepCountEnv.observation_space})


# Cut by a time limit after 4 steps, or terminated after 5.
gym.register("StepCountTruncatedAfter4-v0", entry_point=StepCountEnv, max_episode_steps=4)
gym.register("StepCountTerminatesAfter5-v0", entry_point=StepCountEnv, kwargs={"length": 5})
gym.register("StepCountDictObservation-v0", entry_point=DictObservationEnv)


def assert_rollout_dones_and_rewards(module, monkeypatch, run_main, args):
    """Runs `run_main(args)` (one iteration of a torch Atari script) and holds its rollout against
    what the environments did: `dones` at every life loss, game over and time limit; rewards
    clipped to their sign, plus gamma * V(the real last observation) where the time limit stopped
    a game (truncated, not terminated), nothing for a game over. compute_gae sees the rollout
    before any update, with the agent that played it: the expected values are computed there.
    `args` must make the time limit and some life losses happen (both are asserted)."""
    import torch

    made = recording_make_envs(module, monkeypatch)
    agents, real_agent = [], module.Agent
    monkeypatch.setattr(module, "Agent", lambda *a: agents.append(real_agent(*a)) or agents[-1])
    seen, real_compute_gae = {}, module.compute_gae

    def compute_gae(rewards, values, dones, *rest):
        if not seen:
            seen.update(rewards=rewards.clone(), dones=dones.clone(), final_values={})
            for t, (_, _, truncated, info) in enumerate(made[0].steps):
                if truncated.any():
                    with torch.inference_mode():
                        final_obs = torch.from_numpy(info["final_obs"])
                        seen["final_values"][t] = agents[0].get_value(final_obs).flatten().numpy()
        return real_compute_gae(rewards, values, dones, *rest)

    monkeypatch.setattr(module, "compute_gae", compute_gae)
    run_main(args)

    lives = np.full(len(made[0].steps[0][0]), 5)
    life_losses = truncations = 0
    for t, (reward, terminated, truncated, info) in enumerate(made[0].steps):
        life_lost = (info["lives"] < lives) & ~(terminated | truncated)
        lives = info["lives"]
        expected_done = (terminated | truncated | life_lost).astype(np.float32)
        np.testing.assert_array_equal(seen["dones"][t].numpy(), expected_done, err_msg=f"step {t}")
        expected_reward = np.sign(reward)
        if truncated.any():  # a time limit, not a death: plus gamma * V(the real last observation)
            expected_reward = expected_reward + args.gamma * seen["final_values"][t] * (truncated & ~terminated)
        np.testing.assert_allclose(seen["rewards"][t].numpy(), expected_reward, rtol=1e-6, atol=1e-6)
        life_losses += life_lost.sum()
        truncations += (truncated & ~terminated).sum()
    assert life_losses > 0 and truncations > 0, (life_losses, truncations)


def assert_time_limit_cuts_only_episodes_that_go_on(module):
    """An envpool script's time_limit_cuts on real Breakout: a step at the time limit is bootstrapped only
    where its learning episode would go on. Playing NOOPs, Breakout loses its first life at step 24 (seed 1):
    with a 24-step limit that step is both, and the lost life ends the learning episode (no bootstrap); a
    20-step limit cuts a game that keeps all its lives (bootstrap)."""
    for time_limit, lives_left, cut in ((24, 4, False), (20, 5, True)):
        envs = module.make_envs("Breakout-v5", 1, 0.0, 1, max_episode_steps=time_limit)
        _, info = envs.reset()
        for _ in range(time_limit):
            lives = info["lives"]
            _, _, _, truncated, info = envs.step(np.zeros(1, np.int32))
        envs.close()
        assert truncated[0] and not info["terminated"][0] and info["lives"][0] == lives_left
        assert module.time_limit_cuts(truncated, info, lives)[0] == cut
