"""Helpers shared by the tests: run a script, read its TensorBoard logs, a reference GAE."""

import glob
import os
import subprocess
import sys

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
