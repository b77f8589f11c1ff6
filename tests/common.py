"""Helpers shared by the tests: run a script, read its TensorBoard logs, a reference GAE, and the
checks that every script of a family must pass."""

import glob
import os
import re
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


# The progress line every script prints on stderr (CONVENTIONS: "Progress output").
PROGRESS_LINE = re.compile(
    r"^([\d,]+)/([\d,]+) steps \| ([\d,]+) SPS \| return \(last (\d+)\) (\S+) \| ETA (\d+):(\d\d):(\d\d)$"
)


def assert_progress_line_per_iteration(stderr: str, scalars: dict, batch_size: int, iterations: int):
    """A run with `--progress-interval 0` off a terminal printed one plain progress line per
    iteration, at the end of each, with the mean of the last (up to 20) returns logged by then."""
    lines = [line for line in stderr.splitlines() if " steps | " in line]
    assert len(lines) == iterations, stderr
    games = scalars.get("charts/episodic_return", [])
    for i, line in enumerate(lines):
        match = PROGRESS_LINE.match(line)
        assert match, line
        step, total, _, n, recent = match.groups()[:5]
        assert int(step.replace(",", "")) == batch_size * (i + 1)
        assert int(total.replace(",", "")) == batch_size * iterations
        returns = [value for game_step, value in games if game_step <= batch_size * (i + 1)][-20:]
        assert int(n) == len(returns)
        assert recent == (f"{np.mean(returns):.2f}" if returns else "-")


def read_video(path: str) -> np.ndarray:
    """Every frame of an mp4 file, decoded: (frames, height, width, 3) uint8."""
    import warnings

    import imageio.v2 as imageio  # moviepy's own reader library

    with warnings.catch_warnings():
        # imageio starts ffmpeg by fork + exec; JAX's at-fork warning is about children that keep running Python.
        warnings.filterwarnings("ignore", "os.fork", RuntimeWarning)
        reader = imageio.get_reader(path, format="FFMPEG")
        try:
            return np.stack([frame for frame in reader])
        finally:
            reader.close()
