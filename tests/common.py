"""Helpers shared by the tests: run a script, read its TensorBoard logs, a reference GAE, and the
checks that every script of a family must pass."""

import dataclasses
import functools
import glob
import io
import math
import os
import re
import socket
import subprocess
import sys

import gymnasium as gym
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

# Every tag the DQN scripts promise to log.
DQN_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]


# A stand-in training script that prints the scripts' progress lines (for the benchmark tools' tests).
FAKE_TRAIN = os.path.join(REPO_ROOT, "tests", "fake_train.py")


def subprocess_environment(env: dict | None = None) -> dict:
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(env or {})}


def run_script(script: str, *args: str, cwd, env: dict | None = None, timeout: int = 600, launcher=None):
    """Runs `cleanrl/{script}` with args in `cwd`; returns the CompletedProcess (text output)."""
    command = (launcher or [sys.executable]) + [os.path.join(REPO_ROOT, "cleanrl", script), *args]
    return subprocess.run(
        command, cwd=cwd, env=subprocess_environment(env), capture_output=True, text=True, timeout=timeout
    )


def run_tool(tool: str, *args: str, cwd, env: dict | None = None, timeout: int = 120):
    """Runs `benchmark/{tool}` with args in `cwd`; returns the CompletedProcess (text output)."""
    command = [sys.executable, os.path.join(REPO_ROOT, "benchmark", tool), *args]
    return subprocess.run(
        command, cwd=cwd, env=subprocess_environment(env), capture_output=True, text=True, timeout=timeout
    )


def is_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (a zombie has exited and only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen):
    """Ends a torchrun launch. torchrun starts its workers in sessions of their own, out of reach of a
    kill of torchrun alone; on SIGTERM it stops them itself. SIGKILL if that does not do it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_all(launches: list[tuple[subprocess.Popen, object]], timeout: int) -> list[tuple[str, int, object]]:
    """Waits for processes started together (each with its folder); returns (output, exit code,
    folder) of each. Whatever happens, none is left running."""
    outputs = []
    try:
        for process, cwd in launches:
            outputs.append((process.communicate(timeout=timeout)[0], process.returncode, cwd))
    finally:
        for process, _ in launches:
            stop(process)
    return outputs


def rank_lines(output: str, pattern: str) -> dict[int, re.Match]:
    """The matches of a per-rank message `rank R...` in a run's output, by rank."""
    return {int(m["rank"]): m for m in re.finditer(pattern, output)}


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


def reference_ppo_loss(
    newlogprob,
    entropy,
    newvalue,
    logprobs,
    advantages,
    returns,
    values,
    clip: float,
    ent_coef: float,
    vf_coef: float,
    norm_adv: bool,
    clip_vloss: bool,
) -> tuple[float, dict]:
    """The PPO objective of Schulman et al. (2017) on one minibatch, one sample at a time in plain
    Python floats: minus the clipped surrogate min(r A, clip(r, 1-e, 1+e) A), plus vf_coef times half
    the squared value error (with value clipping: the larger of the clipped and unclipped errors),
    minus ent_coef times the entropy; advantages standardized over the minibatch (unbiased std)."""
    n = len(newlogprob)
    if norm_adv:
        mean = sum(advantages) / n
        std = (sum((a - mean) ** 2 for a in advantages) / (n - 1)) ** 0.5
        advantages = [(a - mean) / (std + 1e-8) for a in advantages]
    surrogate = value_error = 0.0
    stats = dict(old_approx_kl=0.0, approx_kl=0.0, clipfrac=0.0)
    for i in range(n):
        ratio = math.exp(newlogprob[i] - logprobs[i])
        surrogate += min(ratio * advantages[i], min(max(ratio, 1 - clip), 1 + clip) * advantages[i])
        error = (newvalue[i] - returns[i]) ** 2
        if clip_vloss:
            clipped_value = values[i] + min(max(newvalue[i] - values[i], -clip), clip)
            error = max(error, (clipped_value - returns[i]) ** 2)
        value_error += 0.5 * error
        stats["old_approx_kl"] += -math.log(ratio) / n
        stats["approx_kl"] += (ratio - 1 - math.log(ratio)) / n
        stats["clipfrac"] += float(abs(ratio - 1) > clip) / n
    stats.update(policy_loss=-surrogate / n, value_loss=value_error / n, entropy=sum(entropy) / n)
    return stats["policy_loss"] - ent_coef * stats["entropy"] + vf_coef * stats["value_loss"], stats


def assert_ppo_loss_matches_reference(ppo_loss, default_args):
    """A script's ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args)
    against reference_ppo_loss, with and without advantage normalization and value clipping, on
    random float64 data whose probability ratios and value changes fall on both sides of the clip."""
    import torch

    rng = np.random.default_rng(0)
    n = 64
    logprobs, values, returns, advantages = rng.normal(size=(4, n))
    newlogprob = logprobs + rng.uniform(-0.4, 0.4, n)  # ratios from 0.67 to 1.49 around clip 0.1-0.2
    newvalue = values + rng.uniform(-0.5, 0.5, n)
    entropy = rng.uniform(0.5, 1.5, n)
    for norm_adv in (True, False):
        for clip_vloss in (True, False):
            args = dataclasses.replace(default_args, norm_adv=norm_adv, clip_vloss=clip_vloss)
            inputs = (newlogprob, entropy, newvalue, logprobs, advantages, returns, values)
            loss, stats = ppo_loss(*(torch.tensor(x) for x in inputs), args)
            expected, expected_stats = reference_ppo_loss(
                *(x.tolist() for x in inputs), args.clip_coef, args.ent_coef, args.vf_coef, norm_adv, clip_vloss
            )
            assert 0.1 < expected_stats["clipfrac"] < 0.9, "the data reaches both sides of the clip"
            np.testing.assert_allclose(float(loss), expected, rtol=1e-12, err_msg=f"{norm_adv=} {clip_vloss=}")
            for name, value in expected_stats.items():
                np.testing.assert_allclose(float(stats[name]), value, rtol=1e-12, atol=1e-14, err_msg=name)


def assert_user_error(result, *fragments: str):
    """A user error: non-zero exit, a one-line `error:` message naming the problem, no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in last_line, last_line


def assert_main_fails_with(main, args, *fragments: str):
    """main(args), called in this process, stops with a one-line `error: ...` message naming the
    problem (what `fail()` gives the shell as stderr and exit status 1). Cheaper than a subprocess
    per case; `assert_user_error` checks the whole path once per script."""
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    message = exit_info.value.code
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def assert_saved_model_loads_identically(module, tmp_path):
    """A torch Atari script's save_model -> load_model keeps the weights bit for bit and the args."""
    import torch

    args = module.Args()
    path = str(tmp_path / "model.cleanrl_model")
    network = save_fresh_model(module, path, args)
    loaded, saved_args = module.load_model(path, torch.device("cpu"))
    assert saved_args["env_id"] == args.env_id
    outputs = (lambda net, obs: net(obs)) if hasattr(module, "QNetwork") else (lambda net, obs: net.get_value(obs))
    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(outputs(loaded, obs), outputs(network, obs), rtol=0, atol=0)


def assert_warns_when_bf16_is_slow(module, monkeypatch, capsys):
    """A torch Atari script asked for bf16 on a CPU without oneDNN's bf16 kernels warns once on
    stderr (it would run several times slower than fp32); with the kernels, or in fp32, it says nothing."""
    import torch

    cpu = torch.device("cpu")
    for has_bf16_kernels in (False, True):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: has_bf16_kernels)
        module.warn_if_bf16_is_slow("bf16", cpu)
        assert capsys.readouterr().err.count("warning: this CPU has no fast bf16") == (not has_bf16_kernels)
        module.warn_if_bf16_is_slow("none", cpu)
        assert capsys.readouterr().err == ""


def assert_evaluation_warns_when_emulator_settings_differ(
    module, evaluate_checkpoint, played, tmp_path, monkeypatch, capsys
):
    """--eval-checkpoint plays under the command's sticky-action probability and time limit. When
    these are not the ones the model was trained with, its returns do not compare with the training
    run's, and the evaluation says so on stderr. `evaluate_checkpoint(args)` runs the script's
    evaluation path, `played` is what the stubbed `evaluate` returns (no game is played)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(module, "evaluate", lambda *args, **kwargs: played)
    trained = dict(repeat_action_probability=0.25, max_episode_steps=1000)
    save_fresh_model(module, "model.cleanrl_model", module.Args(**trained))
    evaluate_checkpoint(module.Args(eval_checkpoint="model.cleanrl_model", **trained))
    assert "warning" not in capsys.readouterr().err
    evaluate_checkpoint(module.Args(eval_checkpoint="model.cleanrl_model"))
    stderr = capsys.readouterr().err
    assert "warning: evaluating with --repeat-action-probability 0.0; the model was trained with 0.25" in stderr
    assert "warning: evaluating with --max-episode-steps 27000; the model was trained with 1000" in stderr


def save_fresh_model(module, path: str, args):
    """An Atari script's save_model of an untrained network for Breakout's 4 actions; returns what
    it saved (the network, or the JAX script's parameters)."""
    if hasattr(module, "init_params"):  # the JAX script saves parameters and the number of actions
        import jax

        params = module.init_params(module.Agent(4), jax.random.key(0))
        module.save_model(path, params, args, 4)
        return params
    network = module.QNetwork(4) if hasattr(module, "QNetwork") else module.Agent(4)
    module.save_model(path, network, args)
    return network


def assert_evaluation_printed(result, num_games: int):
    """An evaluation run exited 0 and printed each game's return and the mean."""
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("eval_episode=") == num_games
    assert "eval: mean return" in result.stdout


def assert_tracked_evaluation_logs_under_the_models_env(
    script: str, model_path: str, model_env_id: str, other_env_id: str, folder, *args: str, env: dict | None = None
):
    """An evaluation of a saved model under --track, in a fresh folder, with another env id on the
    command line: it plays and prints its games, its run is named after the model's env (the game
    it played), and it reaches wandb (an offline run here)."""
    os.makedirs(folder)
    result = run_script(
        script,
        "--eval-checkpoint",
        model_path,
        "--env-id",
        other_env_id,
        "--track",
        *args,
        cwd=folder,
        env={**(env or {}), "WANDB_DIR": str(folder)},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("eval_episode=") >= 1 and "eval: mean return" in result.stdout
    (run_dir,) = run_dirs(folder)
    assert os.path.basename(run_dir).startswith(f"{model_env_id.replace('/', '_')}__"), run_dir
    assert "eval/episodic_return" in read_scalars(run_dir)
    assert glob.glob(os.path.join(str(folder), "wandb", "offline-run-*")), "no wandb run under --track"
    return result


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


def reference_td_target(reward, terminated, truncated, next_q, gamma):
    """One transition, plain Python: a termination has no future; a truncation (time limit) does,
    and the replay memory holds its real last observation, so it is bootstrapped like any step."""
    del truncated  # changes nothing here: it only decides which observation s' is
    return reward if terminated else reward + gamma * max(next_q)


def assert_td_target_matches_reference(td_target):
    """A DQN script's td_target(rewards, dones, next_q_values, gamma), fed the done flags its replay
    memory stores (terminations only), against reference_td_target on every mix of the two masks."""
    import torch

    rng = np.random.default_rng(0)
    rewards, next_q = rng.normal(size=64), rng.normal(size=(64, 3))
    terminated, truncated = rng.random(64) < 0.3, rng.random(64) < 0.3
    assert (terminated & truncated).any() and (truncated & ~terminated).any() and (~terminated & ~truncated).any()
    target = td_target(torch.tensor(rewards), torch.tensor(terminated, dtype=torch.float64), torch.tensor(next_q), 0.9)
    expected = [reference_td_target(*row, 0.9) for row in zip(rewards, terminated, truncated, next_q.tolist())]
    np.testing.assert_allclose(target.numpy(), expected, rtol=1e-12, atol=1e-12)


def assert_td_target_bootstraps_from_the_target_network(module, memory_class: str, args, monkeypatch):
    """In a DQN script's training run, the next-state values of every TD target are the target
    network's on the sampled next observations, not the Q-network's. `args` never updates the
    target, and learns fast enough that the two networks differ from the first update on."""
    import torch

    networks, batches, checked = [], [], []

    class RecordedQNetwork(module.QNetwork):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            networks.append(self)

    memory = getattr(module, memory_class)

    class RecordedMemory(memory):
        def sample(self, *args, **kwargs):
            batches.append(super().sample(*args, **kwargs))
            return batches[-1]

    td_target = module.td_target

    def checked_td_target(rewards, dones, next_q_values, gamma):
        # after the first update, the Q-network is the one whose parameters hold gradients
        stepped = [net for net in networks if next(net.parameters()).grad is not None]
        if stepped:
            (q_network,) = stepped
            (target_network,) = [net for net in networks if net is not q_network]
            next_obs = batches[-1]["next_obs"]
            torch.testing.assert_close(next_q_values, target_network(next_obs), rtol=0, atol=0)
            assert not torch.allclose(next_q_values, q_network(next_obs)), "the networks differ after an update"
            checked.append(len(batches))
        return td_target(rewards, dones, next_q_values, gamma)

    monkeypatch.setattr(module, "QNetwork", RecordedQNetwork)
    monkeypatch.setattr(module, memory_class, RecordedMemory)
    monkeypatch.setattr(module, "td_target", checked_td_target)
    module.main(args)
    assert len(networks) == 2 and len(checked) == len(batches) - 1 >= 5, (len(networks), len(checked), len(batches))


def assert_linear_epsilon_schedule(linear_schedule):
    """linear_schedule(start_e, end_e, duration, t): a straight line, then flat at end_e."""
    assert linear_schedule(1.0, 0.05, 100, 0) == 1.0
    assert abs(linear_schedule(1.0, 0.05, 100, 50) - 0.525) < 1e-12
    assert linear_schedule(1.0, 0.05, 100, 100) == 0.05
    assert linear_schedule(1.0, 0.05, 100, 10**6) == 0.05
    assert linear_schedule(1.0, 0.05, 0, 0) == 0.05, "no exploration phase"


def assert_target_update_copies_or_averages(update_target, make_network):
    """update_target(target, online, tau): Polyak averaging below 1, an exact copy at 1."""
    import torch

    torch.manual_seed(0)
    online, target = make_network(), make_network()
    before = [p.clone() for p in target.parameters()]
    update_target(target, online, 0.25)
    for new, old, param in zip(target.parameters(), before, online.parameters()):
        torch.testing.assert_close(new, 0.25 * param + 0.75 * old)
    update_target(target, online, 1.0)
    for new, param in zip(target.parameters(), online.parameters()):
        torch.testing.assert_close(new, param, rtol=0, atol=0)


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


def mp4_frames(path: str) -> np.ndarray:
    """The frames of an mp4 file: (frames, height, width, 3) uint8."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(path)
    width, height = next(reader)["size"]
    return np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])


def capped_cubic_games(limit: int) -> list[int]:
    """The games that the capped cubic video schedule records, below `limit`."""
    return [k**3 for k in range(10) if k**3 < min(limit, 1000)] + list(range(1000, limit, 1000))


def assert_videos_show_whole_games_of_env_0(cwd, num_envs: int, extra_screens: int):
    """A --capture-video run wrote games 0 and 1 of env 0 (the schedule's first two) as 210x160 RGB
    mp4 files, each with one screen per step of its game plus `extra_screens` (the first screen,
    and whatever screens the env shows on steps that are not counted in the game's length)."""
    lengths = read_scalars(run_dirs(cwd)[0])["charts/episodic_length"]
    # Env 0's games are logged at the global steps 1, 1 + num_envs, ... of each vector step.
    env0_lengths = [int(length) for step, length in lengths if (step - 1) % num_envs == 0]
    videos = sorted(glob.glob(os.path.join(str(cwd), "videos", "*", "game-*.mp4")))
    assert [os.path.basename(v) for v in videos[:2]] == ["game-0.mp4", "game-1.mp4"], videos
    assert env0_lengths, "env 0 finished no game"
    for video, length in zip(videos, env0_lengths):
        frames = mp4_frames(video)
        assert frames.shape[1:] == (210, 160, 3)
        assert frames.std(axis=-1).mean() > 1, "colour frames"
        assert len(frames) == length + extra_screens, video


def assert_progress_lines_printed(stderr: str, steps: list[str]):
    """Off a terminal a run with `--progress-interval 0` printed a plain progress line at every
    chance, at these `STEP/TOTAL`s (what a longer interval leaves out: assert_progress_follows_the_convention)."""
    lines = [line for line in stderr.splitlines() if " SPS | return (last " in line]
    assert [line.split(" steps")[0] for line in lines] == steps, stderr
    assert all(re.search(r"\| ETA \d+:\d\d:\d\d$", line) for line in lines), lines


def assert_progress_lines_off_a_terminal(script: str, short_run: list[str], steps: list[str], cwd):
    """A run of `script` with `--progress-interval 0` prints a progress line at each of `steps`."""
    result = run_script(script, *short_run, "--progress-interval", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert_progress_lines_printed(result.stderr, steps)


# The plain progress line of the scripts' Progress block, printed on stderr.
PROGRESS_LINE = re.compile(
    r"^([\d,]+)/([\d,]+) steps \| ([\d,]+) SPS \| return \(last (\d+)\) (\S+) \| ETA \d+:\d\d:\d\d$"
)


def progress_steps(stderr: str) -> list[int]:
    """The global steps of the plain progress lines in a script's stderr. Every line that starts
    like one (`N/M steps | `) must have the whole format, and the recent return is `-` or a number
    with 2 decimals."""
    steps = []
    for line in stderr.splitlines():
        if not re.match(r"^[\d,]+/[\d,]+ steps \| ", line):
            continue
        match = PROGRESS_LINE.match(line)
        assert match, f"malformed progress line: {line!r}"
        assert "\r" not in line
        recent = match.group(5)
        assert recent == "-" or re.fullmatch(r"-?\d+\.\d\d", recent), line
        steps.append(int(match.group(1).replace(",", "")))
    return steps


@functools.cache
def mujoco_offscreen_rendering_error() -> str | None:
    """Why MuJoCo cannot render offscreen here (EGL, as the scripts choose without a display), or
    None when it can. Probed once, in a fresh process, as a script would do it."""
    probe = (
        "import os; os.environ.setdefault('MUJOCO_GL', 'egl'); import gymnasium as gym; "
        "env = gym.make('InvertedPendulum-v5', render_mode='rgb_array'); env.reset(seed=0); "
        "assert env.render().shape[-1] == 3"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return None
    return (result.stderr.strip().splitlines() or ["unknown error"])[-1]


def eval_returns(stdout: str) -> list[float]:
    """The returns an evaluation printed, one `eval_episode=i, episodic_return=R` line per episode."""
    return [float(x) for x in re.findall(r"eval_episode=\d+, episodic_return=(\S+)", stdout)]


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


# Cut by a time limit after 4 steps, or terminated after 5.
gym.register("StepCountTruncatedAfter4-v0", entry_point=StepCountEnv, max_episode_steps=4)
gym.register("StepCountTerminatesAfter5-v0", entry_point=StepCountEnv, kwargs={"length": 5})


def assert_progress_follows_the_convention(progress_class, monkeypatch):
    """A script's Progress(total, interval) with show(global_step, sps, recent_returns): plain lines on
    stderr, the same on a terminal and in a log file, at most one per interval but always the first and
    the last (global_step == total)."""
    from collections import deque

    calls = [(1000, 1234, deque()), (2000, 1500, deque([1.0, 2.0])), (3000, 1500, deque([1.0, 2.0, 4.5]))]
    expected = [
        "1,000/3,000 steps | 1,234 SPS | return (last 0) - | ETA 0:00:01",
        "2,000/3,000 steps | 1,500 SPS | return (last 2) 1.50 | ETA 0:00:00",
        "3,000/3,000 steps | 1,500 SPS | return (last 3) 2.50 | ETA 0:00:00",
    ]
    for interval, lines in [(3600.0, [expected[0], expected[2]]), (0.0, expected)]:
        stderr = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stderr)
        progress = progress_class(3000, interval)
        for step, sps, recent in calls:
            progress.show(step, sps, recent)
        monkeypatch.undo()
        assert stderr.getvalue().splitlines() == lines, repr(stderr.getvalue())
    hours = progress_class(10_000_000, 0.0)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    hours.show(1_000_000, 100, deque([-3.0]))
    monkeypatch.undo()
    assert stderr.getvalue() == "1,000,000/10,000,000 steps | 100 SPS | return (last 1) -3.00 | ETA 25:00:00\n"


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


def assert_episodes_0_1_8_recorded_and_uploaded(run_folder):
    """A --capture-video --track run of a gymnasium-env script (RecordVideo's capped cubic
    schedule) recorded env 0's episodes 0, 1 and 8, not 2, and the same files reached the offline
    wandb run."""
    paths = glob.glob(os.path.join(str(run_folder), "videos", "*", "*.mp4"))
    videos = sorted(os.path.basename(v) for v in paths)
    assert videos[:3] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4", "rl-video-episode-8.mp4"]
    assert "rl-video-episode-2.mp4" not in videos
    assert all(os.path.getsize(v) > 1000 for v in paths)
    uploaded = glob.glob(os.path.join(str(run_folder), "wandb", "offline-run-*", "files", "videos", "*", "*.mp4"))
    assert sorted(os.path.basename(v) for v in uploaded) == videos


# ---------------------------------------------------------------------------------------------
# Checkpoints and resume
# ---------------------------------------------------------------------------------------------
class CutOff(Exception):
    """The machine went away."""


def flushing_writer(module):
    """The script's SummaryWriter, with every event on disk at once: what a run logged after its
    checkpoint is there for the resumed run to hide."""

    class FlushingWriter(module.SummaryWriter):
        def add_scalar(self, *args, **kwargs):
            super().add_scalar(*args, **kwargs)
            self.flush()

    return FlushingWriter


def cut_off_at(module, monkeypatch, step: int):
    """The script's next run stops (raises CutOff) right after its progress line at `step`."""
    show = module.Progress.show

    def show_then_cut_off(self, global_step, sps, recent_returns):
        show(self, global_step, sps, recent_returns)
        if global_step == step:
            raise CutOff()

    monkeypatch.setattr(module.Progress, "show", show_then_cut_off)
    return lambda: monkeypatch.setattr(module.Progress, "show", show)
