"""TD3 (Twin Delayed DDPG) for continuous actions on gymnasium's MuJoCo tasks, one file.

HalfCheetah-v5 by default: one environment, a replay buffer, a deterministic tanh policy explored with
Gaussian noise, twin Q networks whose TD target takes the smaller of the two target critics at a smoothed
target action (clipped noise), and the actor and all target networks updated every `policy_frequency`
critic steps, the targets by Polyak averaging. The TD target bootstraps through time-limit truncations from
the real final observation. Beside the algorithm: checkpoints and resume (the replay buffer included),
videos, and evaluation of a saved model. Docs: docs/td3_continuous_action.md
"""

import copy
import ctypes
import fcntl
import glob
import hashlib
import os
import random
import re
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch, the environment, the exploration and the replay sampling)"""
    torch_deterministic: bool = True
    """if toggled, `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, use CUDA when it is available"""
    track: bool = False
    """if toggled, track the run with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the W&B project name"""
    wandb_entity: str | None = None
    """the W&B entity (team); None means your default entity"""
    capture_video: bool = False
    """if toggled, record episodes to `videos/{run_name}/` (0, 1, 8, 27, ..., then every 1000th)"""
    save_model: bool = False
    """if toggled, save the model to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluate it"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` episodes"""
    eval_episodes: int = 10
    """the number of episodes played by the evaluation (with the policy's action, no noise)"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""
    checkpoint_every: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints/` every K env steps and at the end (0: never);
    the newest two are kept, each with the replay buffer"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest of this env_id, exp_name and seed"""

    # environment
    env_id: str = "HalfCheetah-v5"
    """the gymnasium id of the environment (continuous actions, flat observations)"""

    # algorithm
    total_timesteps: int = 1_000_000
    """total number of environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the actor's and the critics' Adam optimizers"""
    buffer_size: int = 1_000_000
    """the replay buffer's capacity in transitions (the oldest are overwritten)"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 0.005
    """the target smoothing coefficient: target <- tau * online + (1 - tau) * target"""
    batch_size: int = 256
    """the number of transitions sampled from the replay buffer for each update"""
    policy_noise: float = 0.2
    """the standard deviation of the target policy smoothing noise, in half-ranges of the action bounds"""
    exploration_noise: float = 0.1
    """the standard deviation of the exploration noise, in half-ranges of the action bounds"""
    learning_starts: int = 25_000
    """the number of steps of uniformly random actions before learning starts"""
    policy_frequency: int = 2
    """the actor and the target networks are updated every this many steps (the critics at every step)"""
    noise_clip: float = 0.5
    """the target policy smoothing noise is clipped to [-noise_clip, noise_clip] (half-ranges)"""


LOG_EVERY = 100  # the losses, Q values and SPS are logged every this many steps


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def make_env(env_id: str, video_folder: str | None = None, first_episode: int = 0) -> gym.Env:
    """One environment, stepped directly: the transition stored is exactly what `step` returned (its next
    observation is the real final one when the episode ends), and the reset is explicit. Videos are numbered
    from `first_episode` on (a resumed run's, after the episodes its checkpoint had finished)."""
    if video_folder is None:
        env = gym.make(env_id)
    else:  # episodes 0, 1, 8, 27, ..., then every 1000th (RecordVideo's default)
        os.environ.setdefault("MUJOCO_GL", "egl")  # renders offscreen: MuJoCo's default, GLFW, needs a display
        env = gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_folder)
        env.episode_id = first_episode - 1  # each reset counts one more
    return gym.wrappers.RecordEpisodeStatistics(env)  # info["episode"] at an episode's end


class ReplayBuffer:
    """Transitions in preallocated arrays, the oldest overwritten first, sampled uniformly. `terminations` is 1
    only where the environment terminated the episode: a transition cut by a time limit is stored with 0 and
    its real final observation, so its TD target bootstraps."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminations")

    def __init__(self, capacity: int, obs_dim: int, action_dim: int):
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminations = np.zeros(capacity, dtype=np.float32)
        self.capacity, self.pos, self.size = capacity, 0, 0

    def add(self, obs, action, reward: float, next_obs, terminated: bool):
        i = self.pos
        self.obs[i], self.actions[i], self.rewards[i] = obs, action, reward
        self.next_obs[i], self.terminations[i] = next_obs, terminated
        self.pos = (self.pos + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """batch_size transitions drawn uniformly (with replacement) from those stored."""
        idx = rng.integers(0, self.size, size=batch_size)
        return {name: getattr(self, name)[idx] for name in self.FIELDS}

    def state_dict(self) -> dict:
        """The stored rows, tensors that share the arrays' memory (no copy), and the write position."""
        return {**{name: torch.from_numpy(getattr(self, name)[: self.size]) for name in self.FIELDS}, "pos": self.pos}

    def load_state_dict(self, state: dict):
        self.size, self.pos = len(state["rewards"]), int(state["pos"])
        for name in self.FIELDS:
            getattr(self, name)[: self.size] = state[name].numpy()  # copied out of the (mapped) file


# ---------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------
class TwinQNetwork(nn.Module):
    """The critics Q1, Q2 (256-256, ReLUs) as one module: each layer stacks both critics' weights, (2, in, out), and
    runs one batched matmul, half the operations, which a second thread splits by critic. Each critic is drawn as
    its own nn.Linear layers would be: two separate networks, computed together."""

    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        sizes = [obs_dim + action_dim, 256, 256, 1]
        critics = [[nn.Linear(n_in, n_out) for n_in, n_out in zip(sizes, sizes[1:])] for _ in range(2)]
        self.weights = nn.ParameterList(torch.stack([c[i].weight.detach().T for c in critics]) for i in range(3))
        self.biases = nn.ParameterList(torch.stack([c[i].bias.detach()[None] for c in critics]) for i in range(3))

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], dim=1).expand(2, -1, -1)
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.baddbmm(bias, x, weight)
            x = x.relu() if layer < 2 else x.squeeze(-1)
        return x  # (2, batch): Q1 and Q2 of each (observation, action) pair

    def q1(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """Q1 alone, (batch,): the actor's objective, at half the cost of both."""
        x = torch.cat([obs, action], dim=1)
        for layer, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.addmm(bias[0], x, weight[0])
            x = x.relu() if layer < 2 else x.squeeze(-1)
        return x


class Actor(nn.Module):
    """The deterministic policy mu(s): a 256-256 ReLU trunk, then tanh mapped onto the action bounds."""

    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.fc_mu = nn.Linear(256, len(action_low))
        # buffers: they travel with the state dict and the device, but are not trained
        low, high = torch.as_tensor(action_low, dtype=torch.float32), torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc_mu(self.trunk(obs))) * self.action_scale + self.action_bias


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def smoothed_target_actions(target_actions, standard_noise, policy_noise: float, noise_clip: float, scale, bias):
    """Target policy smoothing: a' = clip(mu'(s') + clip(policy_noise * eps, -noise_clip, noise_clip) * scale,
    low, high), eps ~ N(0, 1) per action dimension. The noise is in half-ranges of the bounds (scale), as the
    policy's tanh output is; the bounds are bias -+ scale. Clipped noise keeps the target action near mu'(s'):
    the critics are fitted to the value of a neighbourhood of it, not of a spike."""
    noise = (policy_noise * standard_noise).clamp(-noise_clip, noise_clip) * scale
    return torch.clamp(target_actions + noise, bias - scale, bias + scale)


def clipped_double_q_target(rewards, terminations, next_q, gamma: float):
    """r + gamma * (1 - terminated) * min(Q1', Q2')(s', a'), next_q (2, batch): the smaller of the twin target
    critics curbs the overestimation that the actor would exploit. Only a termination stops the bootstrap: a
    transition cut by a time limit carries terminated = 0."""
    return rewards + gamma * (1.0 - terminations) * torch.min(next_q[0], next_q[1])


def update_schedule(global_step: int, learning_starts: int, policy_frequency: int) -> tuple[bool, bool]:
    """(update the critics, update the actor and every target network) at this step, counted from 1: the critics
    at every step past learning_starts, the rest at the steps among them that are multiples of policy_frequency
    (delayed: the actor climbs a critic that has had policy_frequency updates to settle)."""
    learning = global_step > learning_starts
    return learning, learning and global_step % policy_frequency == 0


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging: target <- tau * online + (1 - tau) * target, all parameters in one call."""
    with torch.no_grad():
        torch._foreach_lerp_(list(target.parameters()), list(online.parameters()), tau)


def main(args: Args):
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # torch's threads: OMP_NUM_THREADS when set (benchmark/run.py sets it for runs that share the cores: beside
    # other processes a second thread's spin-waits made an update 17x slower), else one per core.
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    keep_freed_memory()  # each update's batch-sized tensors come back to the same pages

    if args.eval_checkpoint is not None:  # no training: play the saved policy's episodes
        actor, saved_args = load_policy(args.eval_checkpoint, device)  # a bad file fails before any output
        check_env_exists(saved_args["env_id"])
        run_name = f"{saved_args['env_id'].replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        writer = start_logging(args, run_name, None)
        evaluate_policy(args, saved_args["env_id"], actor, device, writer, run_name)
        return finish_logging(args, writer, run_name)
    checkpoint = load_checkpoint(args.resume, args) if args.resume is not None else None
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    run_name = checkpoint["run_name"] if checkpoint else run_name  # a resumed run goes on in its own directory
    episodes = checkpoint["episodes"] if checkpoint else 0  # the episodes finished: videos are numbered on
    try:
        env = make_env(args.env_id, f"videos/{run_name}" if args.capture_video else None, episodes)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: an id `module:Env`
        fail(f"cannot make environment {args.env_id!r}: {e}")
    if not isinstance(env.action_space, gym.spaces.Box):
        fail(f"{args.env_id} has actions {env.action_space}; this script needs continuous (Box) ones")
    if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
        fail(f"{args.env_id} has observation space {env.observation_space}; this script needs a flat Box (vectors)")
    if not np.all(np.isfinite(env.action_space.low) & np.isfinite(env.action_space.high)):
        fail(f"{args.env_id} has unbounded actions {env.action_space}; the tanh policy needs finite bounds")
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if args.checkpoint_every or checkpoint else None
    writer = start_logging(args, run_name, checkpoint)

    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    low, high = env.action_space.low, env.action_space.high
    actor, actor_target = Actor(obs_dim, low, high).to(device), Actor(obs_dim, low, high).to(device)
    qf, qf_target = TwinQNetwork(obs_dim, action_dim).to(device), TwinQNetwork(obs_dim, action_dim).to(device)
    actor_target.load_state_dict(actor.state_dict())
    qf_target.load_state_dict(qf.state_dict())
    # fused: one kernel for all parameters, not a dozen small ops per tensor (4-5x faster steps on CPU)
    q_optimizer = optim.Adam(qf.parameters(), lr=args.learning_rate, fused=True)
    actor_optimizer = optim.Adam(actor.parameters(), lr=args.learning_rate, fused=True)
    rb = ReplayBuffer(min(args.buffer_size, args.total_timesteps), obs_dim, action_dim)
    rng = np.random.default_rng(args.seed)  # the exploration noise and the replay sampling
    exploration_std = args.exploration_noise * (high - low) / 2.0

    global_step, num_q_updates, num_actor_updates, recent_returns = 0, 0, 0, deque(maxlen=20)
    if checkpoint is not None:  # everything is copied out of the memory-mapped file, then it is let go
        for name, module in dict(actor=actor, actor_target=actor_target, qf=qf, qf_target=qf_target).items():
            module.load_state_dict(checkpoint[name])
        actor_optimizer.load_state_dict(copy.deepcopy(checkpoint["actor_optimizer"]))  # Adam would keep them mapped
        q_optimizer.load_state_dict(copy.deepcopy(checkpoint["q_optimizer"]))
        rb.load_state_dict(checkpoint["replay_buffer"])
        rng.bit_generator.state = checkpoint["numpy_rng"]
        torch.set_rng_state(checkpoint["rng_state"]["torch"])
        cuda_states = checkpoint["rng_state"]["cuda"] or []  # a resume may run on a machine with fewer GPUs
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
        global_step, num_q_updates = checkpoint["global_step"], checkpoint["num_q_updates"]
        num_actor_updates = checkpoint["num_actor_updates"]
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only
        del checkpoint

    # The episode in progress at a checkpoint is not in it: a resumed run starts a new one, on seeds the run has
    # not used (seed + global_step), and so do the random actions before learning starts.
    obs, _ = env.reset(seed=args.seed + global_step)
    env.action_space.seed(args.seed + global_step)
    progress = Progress(args.total_timesteps, args.progress_interval)
    start_time, start_step, sps, actor_loss = time.time(), global_step, 0, None

    for global_step in range(global_step + 1, args.total_timesteps + 1):
        if global_step <= args.learning_starts:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])[0].cpu().numpy()
            action = np.clip(action + rng.normal(0.0, exploration_std), low, high)

        next_obs, reward, terminated, truncated, info = env.step(action)
        # next_obs is the real last observation when the episode ended: the env is reset below
        rb.add(obs, action, reward, next_obs, terminated)
        if terminated or truncated:
            episodes += 1
            recent_returns.append(float(info["episode"]["r"]))
            writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
            writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
            next_obs, _ = env.reset()
        obs = next_obs

        update_critics, update_actor = update_schedule(global_step, args.learning_starts, args.policy_frequency)
        if update_critics:
            batch = {k: torch.from_numpy(v).to(device) for k, v in rb.sample(args.batch_size, rng).items()}
            with torch.no_grad():
                next_actions = smoothed_target_actions(
                    actor_target(batch["next_obs"]),
                    torch.randn_like(batch["actions"]),
                    args.policy_noise,
                    args.noise_clip,
                    actor.action_scale,
                    actor.action_bias,
                )
                next_q = qf_target(batch["next_obs"], next_actions)
                target = clipped_double_q_target(batch["rewards"], batch["terminations"], next_q, args.gamma)
            qf1_values, qf2_values = qf(batch["obs"], batch["actions"])
            qf1_loss, qf2_loss = F.mse_loss(qf1_values, target), F.mse_loss(qf2_values, target)
            qf_loss = qf1_loss + qf2_loss
            q_optimizer.zero_grad(set_to_none=True)
            qf_loss.backward()
            q_optimizer.step()
            num_q_updates += 1

            if update_actor:
                actor_loss = -qf.q1(batch["obs"], actor(batch["obs"])).mean()
                actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward(inputs=list(actor.parameters()))  # through the critic, not into it
                actor_optimizer.step()
                num_actor_updates += 1
                soft_update(actor_target, actor, args.tau)
                soft_update(qf_target, qf, args.tau)

            if global_step % LOG_EVERY == 0:
                writer.add_scalar("losses/qf1_values", qf1_values.mean().item(), global_step)
                writer.add_scalar("losses/qf2_values", qf2_values.mean().item(), global_step)
                writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                writer.add_scalar("losses/qf2_loss", qf2_loss.item(), global_step)
                writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)  # the mean, CleanRL's tag
                if actor_loss is not None:
                    writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)

        if global_step % LOG_EVERY == 0 or global_step == args.total_timesteps:
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            progress.show(global_step, sps, recent_returns)

        every = args.checkpoint_every
        if every and (global_step % every == 0 or global_step == args.total_timesteps):
            writer.flush()  # everything up to this checkpoint is on disk before it counts
            state = dict(actor=actor.state_dict(), actor_target=actor_target.state_dict())
            state.update(qf=qf.state_dict(), qf_target=qf_target.state_dict())
            state.update(actor_optimizer=actor_optimizer.state_dict(), q_optimizer=q_optimizer.state_dict())
            state.update(replay_buffer=rb.state_dict(), numpy_rng=rng.bit_generator.state, episodes=episodes)
            state.update(global_step=global_step, num_q_updates=num_q_updates, num_actor_updates=num_actor_updates)
            state.update(recent_returns=list(recent_returns))
            save_checkpoint(checkpoint_folder, f"step-{global_step:09d}.pt", state, args, run_name)

    env.close()  # also finishes the last video
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {global_step} steps, {num_q_updates} critic updates, {num_actor_updates} actor updates, "
        f"{sps} SPS, mean return of the last {len(recent_returns)} episodes {recent}"
    )
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_policy(model_path, actor, qf, args)
        print(f"model saved to {model_path}")
        evaluate_policy(args, args.env_id, actor, device, writer, run_name)
    finish_logging(args, writer, run_name)
    if run_lock is not None:
        run_lock.close()


# =============================================================================================
# Run infrastructure: what makes a run watchable, resumable and reusable; not the algorithm. Each block
# is the same text in every script that has it (tests/test_blocks.py), but for lines marked `# this script`.
# =============================================================================================
def fail(message: str):
    """A user error: one line naming the problem, a non-zero exit, no traceback."""
    sys.exit(f"error: {message}")


def check_env_exists(env_id: str):
    """A saved model's env must be makeable here (MuJoCo, a plugin's module) before its evaluation logs anything."""
    try:
        gym.make(env_id).close()
    except (gym.error.Error, ModuleNotFoundError) as e:
        fail(f"cannot make the model's environment {env_id!r}: {e}")


def check_args(args: Args):
    if "/" in args.exp_name or not args.exp_name:  # it names the run's folder and the model file in it
        fail(f"--exp-name {args.exp_name!r} must be a name without '/'")
    if args.learning_rate < 0:
        fail(f"--learning-rate must not be negative, got {args.learning_rate}")
    noises = {"policy_noise": args.policy_noise, "noise_clip": args.noise_clip}
    for name, value in {**noises, "exploration_noise": args.exploration_noise}.items():
        if not value >= 0:  # NaN too
            fail(f"--{name.replace('_', '-')} must not be negative, got {value}")
    if not 0 <= args.seed < 2**32:  # what numpy's seed takes
        fail(f"--seed must lie in [0, 2**32), got {args.seed}")
    counts = ("total_timesteps", "buffer_size", "batch_size", "policy_frequency", "eval_episodes")
    for name in counts:
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("learning_starts", "checkpoint_every"):
        if getattr(args, name) < 0:
            fail(f"--{name.replace('_', '-')} must be at least 0, got {getattr(args, name)}")
    if args.eval_checkpoint is None and args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} leaves no step to learn: raise --total-timesteps")
    if not (0.0 < args.tau <= 1.0 and 0.0 <= args.gamma <= 1.0):
        fail(f"--tau must be in (0, 1] and --gamma in [0, 1], got {args.tau}, {args.gamma}")


def keep_freed_memory():
    # glibc gives each large freed block back to the OS, and the next minibatch faults it in again page
    # by page: kept for reuse instead, a CPU iteration is up to 1.1x faster in fp32, 1.1-1.2x in bf16, with
    # the same peak memory. As MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=2147483647; no-op without glibc.
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's <malloc.h>
    libc.mallopt(M_MMAP_MAX, 0)  # large blocks come from the heap, not a mapping of their own ...
    libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1)  # ... and the heap's free top is kept, not trimmed


def start_logging(args: Args, run_name: str, checkpoint: dict | None) -> SummaryWriter:
    """TensorBoard events in runs/{run_name}, and wandb under --track. A resumed run goes on in its own
    directory and wandb run, and hides what its interrupted attempt logged after the checkpoint."""
    if args.track:
        import wandb

        project = dict(project=args.wandb_project_name, entity=args.wandb_entity, config=vars(args), save_code=True)
        wandb.init(**project, name=run_name, id=run_name, resume="allow", sync_tensorboard=True)  # id: resumable
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
    if checkpoint is None:
        table = "\n".join(f"|{key}|{value}|" for key, value in vars(args).items())
        writer.add_text("hyperparameters", f"|param|value|\n|-|-|\n{table}")
    return writer


class Progress:
    """Plain progress lines on stderr, alike on a terminal and in a log file (Slurm, nohup, a container):
    at most one every `interval` seconds, and always the first and the last one."""

    def __init__(self, total_steps: int, interval: float):
        self.total, self.interval, self.last_print = total_steps, interval, -float("inf")

    def show(self, global_step: int, sps: int, recent_returns: deque):
        if time.time() - self.last_print < self.interval and global_step < self.total:
            return
        self.last_print = time.time()
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "-"
        eta = (self.total - global_step) // max(sps, 1)
        line = f"{global_step:,}/{self.total:,} steps | {sps:,} SPS | return (last {len(recent_returns)}) {recent}"
        print(f"{line} | ETA {eta // 3600}:{eta % 3600 // 60:02d}:{eta % 60:02d}", file=sys.stderr, flush=True)


def save_policy(path: str, actor: Actor, qf: TwinQNetwork, args: Args):  # this script
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    model = {"actor": actor.state_dict(), "qf": qf.state_dict()}
    sizes = {"obs_dim": actor.trunk[0].in_features, "action_dim": actor.fc_mu.out_features}
    torch.save({"model": model, "args": vars(args), **sizes}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_policy(path: str, device) -> tuple[Actor, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
        action_dim = payload["action_dim"]
        actor = Actor(payload["obs_dim"], np.full(action_dim, -1.0), np.full(action_dim, 1.0)).to(device)
        actor.load_state_dict(payload["model"]["actor"])  # the bounds come back with the buffers
        saved_args = dict(payload["args"])
        saved_args["env_id"]  # a checkpoint without it is foreign (KeyError)
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return actor, saved_args


def evaluate_policy(args: Args, env_id: str, actor: Actor, device, writer: SummaryWriter, run_name: str) -> list:
    """Plays --eval-episodes whole episodes with the policy's action, without noise; prints and logs their returns."""
    env, returns = make_env(env_id, f"videos/{run_name}-eval" if args.capture_video else None), []
    obs, _ = env.reset(seed=args.seed)
    while len(returns) < args.eval_episodes:
        with torch.no_grad():
            action = actor(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
        obs, _, terminated, truncated, info = env.step(action[0].cpu().numpy())
        if terminated or truncated:
            returns.append(float(info["episode"]["r"]))
            print(f"eval_episode={len(returns) - 1}, episodic_return={returns[-1]}")
            writer.add_scalar("eval/episodic_return", returns[-1], len(returns) - 1)
            obs, _ = env.reset()
    env.close()
    print(f"eval: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} episodes")
    return returns


def finish_logging(args: Args, writer: SummaryWriter, run_name: str):
    """Closes the run's TensorBoard events; under --track, uploads its videos (training and evaluation) to
    wandb, by hand: wandb's monitor_gym breaks on gymnasium 1.x's RecordVideo."""
    writer.close()
    if args.track and args.capture_video:
        import wandb

        for folder in (f"videos/{run_name}", f"videos/{run_name}-eval"):
            if os.path.isdir(folder):
                wandb.save(f"{folder}/*.mp4", policy="now")


def lock_run(folder: str):
    """Holds the run's checkpoint folder while the returned file stays open: a second process resuming the
    same run (a job started twice) would log every step twice and remove the other's checkpoints."""
    os.makedirs(folder, exist_ok=True)
    lock = open(os.path.join(folder, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"{folder} is in use: another process is running this run (stop it, or wait for it to end)")
    return lock


# The resume rule of every script: a resumed run may change how it is watched and saved, and where it
# runs, never what it learns. Every other argument must be the checkpoint's.
RESUMABLE_CHANGES = {"track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "eval_episodes"}
RESUMABLE_CHANGES |= {"eval_checkpoint", "progress_interval", "checkpoint_every", "resume"}
RESUMABLE_CHANGES |= {"cuda"}  # this script: where it runs


def save_checkpoint(folder: str, name: str, state: dict, args: Args, run_name: str, keep: int = 2):
    """Writes `state`, the random streams, the arguments and the script's SHA-256 to `folder/name`: to a
    temporary file, synced and renamed, so a crash leaves the previous checkpoint or this one, never half
    a file. The newest `keep` checkpoints are kept."""
    path = os.path.join(folder, name)
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else []  # this script
    state = {**state, "rng_state": {"torch": torch.get_rng_state(), "cuda": cuda_rng}}  # this script
    state.update(
        args=vars(args), run_name=run_name, script_sha256=hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    )
    with open(path + ".tmp", "wb") as f:
        torch.save(state, f)  # this script
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    pattern = os.path.join(folder, "*.pt")  # this script
    # by the number in the name: as text, step-1000000000 would come before step-999000000
    numbered = sorted(glob.glob(pattern), key=lambda path: int(re.sub(r"\D", "", os.path.basename(path))))
    for older in numbered[:-keep]:
        os.remove(older)
    print(f"checkpoint {path}", flush=True)


def load_checkpoint(resume: str, args: Args) -> dict | None:
    """The checkpoint `--resume` names; `auto`: the newest of this env id, exp_name and seed in runs/, or
    None when there is none. Its run's arguments must be this command's, but for RESUMABLE_CHANGES."""
    if resume == "auto":
        run_prefix = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__"
        found = glob.glob(os.path.join("runs", f"{glob.escape(run_prefix)}*", "checkpoints", "*.pt"))  # this script
        if not found:
            print(f"--resume auto: no checkpoint of {run_prefix}* in runs/, starting a new run")
            return None
        resume = max(found, key=os.path.getmtime)
    if not os.path.isfile(resume):
        fail(f"--resume {resume!r}: no such checkpoint file (pass a runs/*/checkpoints/ file or auto)")
    try:
        checkpoint = torch.load(resume, map_location="cpu", weights_only=True, mmap=True)  # this script
        saved_args, run_name, global_step = dict(checkpoint["args"]), checkpoint["run_name"], checkpoint["global_step"]
    except Exception as e:  # an unreadable file, or a saved model instead of a checkpoint
        fail(f"--resume {resume!r} is not a readable {os.path.basename(__file__)} checkpoint ({type(e).__name__})")
    for name, value in vars(args).items():
        if name not in RESUMABLE_CHANGES and saved_args.get(name) != value:
            fail(f"--resume: the checkpoint's run has {name}={saved_args.get(name)!r}, this command {value!r}")
    print(f"resuming {run_name} at step {global_step:,} from {resume}", flush=True)
    if checkpoint.get("script_sha256") != hashlib.sha256(Path(__file__).read_bytes()).hexdigest():
        print(f"warning: {os.path.basename(__file__)} has changed since the checkpoint: the run goes on with it")
    return checkpoint


if __name__ == "__main__":
    main(tyro.cli(Args))
