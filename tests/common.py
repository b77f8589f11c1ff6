"""Helpers shared by the tests: run a script, read its TensorBoard logs, a reference GAE, and the
checks that every script of a family must pass."""

import glob
import os
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every tag the PPO scripts promise to log.
PPO_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/learning_rate",
    "charts/SPS",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]


def run_script(script: str, *args: str, cwd, env: dict | None = None, timeout: int = 600, launcher=None):
    """Runs `cleanrl/{script}` with args in `cwd`; returns the CompletedProcess (text output)."""
    command = (launcher or [sys.executable]) + [os.path.join(REPO_ROOT, "cleanrl", script), *args]
    full_env = {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(command, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout)


def run_dirs(cwd) -> list[str]:
    return sorted(glob.glob(os.path.join(str(cwd), "runs", "*")))


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a TensorBoard run directory: {tag: [(step, value), ...]}."""
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def reference_gae(rewards, values, dones, next_value, gamma, gae_lambda):
    """Textbook GAE, one env and one step at a time: A_t = sum_k (gamma*lambda)^k delta_{t+k},
    where the sum stops after the step that ends the episode. Plain Python floats."""
    num_steps, num_envs = len(rewards), len(rewards[0])
    advantages = [[0.0] * num_envs for _ in range(num_steps)]
    for env in range(num_envs):
        for t in range(num_steps):
            total, weight = 0.0, 1.0
            for k in range(t, num_steps):
                following = next_value[env] if k == num_steps - 1 else values[k + 1][env]
                alive = 1.0 - dones[k][env]
                delta = rewards[k][env] + gamma * following * alive - values[k][env]
                total += weight * delta
                if dones[k][env]:
                    break
                weight *= gamma * gae_lambda
            advantages[t][env] = total
    return advantages


def assert_gae_matches_reference(compute_gae, convert, dtype=np.float64, tolerance: float = 1e-10):
    """A script's compute_gae(rewards, values, dones, next_value, gamma, lambda), fed through
    `convert` (torch.tensor, jnp.asarray), against reference_gae on random data with several
    episode ends in the rollout; returns must be advantages + values."""
    rng = np.random.default_rng(0)
    rewards, values = rng.normal(size=(2, 16, 3)).astype(dtype)
    dones = (rng.random((16, 3)) < 0.2).astype(dtype)
    assert dones.sum() >= 5
    next_value = rng.normal(size=3).astype(dtype)
    advantages, returns = compute_gae(*map(convert, (rewards, values, dones, next_value)), 0.99, 0.95)
    expected = reference_gae(rewards.tolist(), values.tolist(), dones.tolist(), next_value.tolist(), 0.99, 0.95)
    np.testing.assert_allclose(np.asarray(advantages), expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(np.asarray(returns), np.array(expected) + values, rtol=tolerance, atol=tolerance)


def assert_user_error(result, *fragments: str):
    """A user error: non-zero exit, a one-line `error:` message naming the problem, no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in last_line, last_line


def assert_saved_model_loads_identically(module, tmp_path):
    """A torch script's save_model -> load_model keeps the weights bit for bit and the args."""
    import torch

    agent, args = module.Agent(4), module.Args()
    path = str(tmp_path / "agent.cleanrl_model")
    module.save_model(path, agent, args)
    loaded, saved_args = module.load_model(path, torch.device("cpu"))
    assert saved_args["env_id"] == args.env_id
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(loaded.get_value(obs), agent.get_value(obs), rtol=0, atol=0)


def assert_evaluation_printed(result, num_games: int):
    """An evaluation run exited 0 and printed each game's return and the mean."""
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("eval_episode=") == num_games
    assert "eval: mean return" in result.stdout


def assert_short_atari_run_logged(run_dir: str, batch_size: int, iterations: int = 4):
    """A short Breakout run of an Atari script logged every tag at the end of every iteration,
    annealed the learning rate from 2.5e-4, and logged whole games, each at a step of its own."""
    scalars = read_scalars(run_dir)
    for tag in PPO_TAGS:
        assert tag in scalars, tag
    assert [step for step, _ in scalars["charts/SPS"]] == [batch_size * (i + 1) for i in range(iterations)]
    assert all(np.isfinite(value) for _, value in scalars["losses/value_loss"])
    np.testing.assert_allclose(
        [v for _, v in scalars["charts/learning_rate"]], [2.5e-4 * (1 - i / iterations) for i in range(iterations)]
    )
    # Whole games of Breakout under random play: a few points, never negative or fractional, and
    # longer than one life.
    returns = [value for _, value in scalars["charts/episodic_return"]]
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    assert returns and all(r >= 0 and r == int(r) for r in returns)
    assert all(length > 50 for length in lengths), "a game spans all five lives"
    steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert len(set(steps)) == len(steps), "every game is logged at a global step of its own"
    return scalars


def assert_corrupt_checkpoint_rejected(script: str, tmp_path):
    """Evaluating a file that is no checkpoint is a one-line error, not a traceback."""
    (tmp_path / "corrupt.cleanrl_model").write_bytes(b"not a checkpoint")
    result = run_script(script, "--eval-checkpoint", "corrupt.cleanrl_model", cwd=tmp_path)
    assert_user_error(result, "not a readable")


class RecordingEnvs:
    """Wraps a script's vector env and keeps what every step returned, so a test can hold the
    script's rollout against what the environment really did. steps[t] = (reward, terminated,
    truncated, info) of vector step t, as numpy copies."""

    def __init__(self, envs):
        self.envs, self.steps = envs, []

    def __getattr__(self, name):
        return getattr(self.envs, name)

    def step(self, actions):
        obs, reward, terminated, truncated, info = self.envs.step(actions)
        copied_info = {key: np.array(value, copy=True) for key, value in info.items()}
        self.steps.append((reward.copy(), terminated.copy(), truncated.copy(), copied_info))
        return obs, reward, terminated, truncated, info


def recording_make_envs(module, monkeypatch) -> list[RecordingEnvs]:
    """Makes every `module.make_envs(...)` call return a RecordingEnvs; returns the list of them."""
    made, real_make_envs = [], module.make_envs

    def make_envs(*args, **kwargs):
        made.append(RecordingEnvs(real_make_envs(*args, **kwargs)))
        return made[-1]

    monkeypatch.setattr(module, "make_envs", make_envs)
    return made


def mp4_frames(path: str) -> np.ndarray:
    """The frames of an mp4 file: (frames, height, width, 3) uint8."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(path)
    width, height = next(reader)["size"]
    return np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])


def capped_cubic_games(limit: int) -> list[int]:
    """The games that the capped cubic video schedule records, below `limit`."""
    return [k**3 for k in range(10) if k**3 < min(limit, 1000)] + list(range(1000, limit, 1000))


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
