"""Soft Actor-Critic (SAC) for continuous actions on gymnasium's MuJoCo tasks, one file.

HalfCheetah-v5 by default: one environment, a replay buffer, twin Q networks with Polyak-averaged targets,
a tanh-squashed Gaussian policy updated every `policy_frequency` steps (as many times, so it gets as many
updates as the critics), and the entropy coefficient tuned towards a target entropy of -|A|. The TD target
bootstraps through time-limit truncations from the real final observation. Docs: docs/sac_continuous_action.md
"""

import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import dataclass

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
    """seed of the experiment (python, numpy, torch, the environment and the replay sampling)"""
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
    """the number of episodes played by the evaluation (with the mean action)"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""

    # environment
    env_id: str = "HalfCheetah-v5"
    """the gymnasium id of the environment (continuous actions, flat observations)"""

    # algorithm
    total_timesteps: int = 1_000_000
    """total number of environment steps of the experiment"""
    buffer_size: int = 1_000_000
    """the replay buffer's capacity in transitions (the oldest are overwritten)"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 0.005
    """the target smoothing coefficient: target <- tau * online + (1 - tau) * target"""
    batch_size: int = 256
    """the number of transitions sampled from the replay buffer for each update"""
    learning_starts: int = 5000
    """the number of steps of uniformly random actions before learning starts"""
    policy_lr: float = 3e-4
    """the learning rate of the policy's Adam optimizer"""
    q_lr: float = 1e-3
    """the learning rate of the Q networks' (and of the entropy coefficient's) Adam optimizer"""
    policy_frequency: int = 2
    """the policy is updated every this many steps, as many times in a row (delayed, not fewer updates)"""
    target_network_frequency: int = 1
    """the target networks are smoothed towards the online ones every this many steps"""
    alpha: float = 0.2
    """the entropy coefficient (its starting value is 1 with --autotune)"""
    autotune: bool = True
    """if toggled, tune the entropy coefficient towards a policy entropy of -|A|"""


# The policy's log-std range: narrow enough to keep exp() and log-probabilities finite, wide enough not to bind.
LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
LOG_EVERY = 100  # the losses, Q values and SPS are logged every this many steps


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def make_env(env_id: str, video_folder: str | None = None) -> gym.Env:
    """One environment, stepped directly: the transition stored is exactly what `step` returned (its next
    observation is the real final one when the episode ends), and the reset is explicit."""
    if video_folder is None:
        env = gym.make(env_id)
    else:  # episodes 0, 1, 8, 27, ..., then every 1000th (RecordVideo's default)
        os.environ.setdefault("MUJOCO_GL", "egl")  # renders offscreen: MuJoCo's default, GLFW, needs a display
        env = gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_folder)
    return gym.wrappers.RecordEpisodeStatistics(env)  # info["episode"] at an episode's end


class ReplayBuffer:
    """Transitions in preallocated arrays, the oldest overwritten first, sampled uniformly. `terminations` is 1
    only where the environment terminated the episode: a transition cut by a time limit is stored with 0 and
    its real final observation, so its TD target bootstraps."""

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
        fields = ("obs", "actions", "rewards", "next_obs", "terminations")
        return {name: getattr(self, name)[idx] for name in fields}


# ---------------------------------------------------------------------------------------------
# Networks
# ---------------------------------------------------------------------------------------------
class TwinSoftQNetwork(nn.Module):
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


def squashed_gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor, action_scale: torch.Tensor):
    """log-density of action = tanh(x) * action_scale + action_bias, x ~ N(mean, exp(log_std)^2), summed over
    the action dims: the Gaussian's log-density minus log |d action / d x|. log(1 - tanh(x)^2) is written as
    2 * (log 2 - x - softplus(-2x)), exact and finite even where tanh(x) rounds to +-1 (unlike `+ 1e-6`)."""
    gaussian = -0.5 * ((x - mean) * torch.exp(-log_std)) ** 2 - log_std - 0.5 * math.log(2 * math.pi)
    log_det = torch.log(action_scale) + 2.0 * (math.log(2.0) - x - F.softplus(-2.0 * x))
    return (gaussian - log_det).sum(-1)


class Actor(nn.Module):
    def __init__(self, obs_dim: int, action_low: np.ndarray, action_high: np.ndarray):
        super().__init__()
        action_dim = len(action_low)
        self.trunk = nn.Sequential(nn.Linear(obs_dim, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU())
        self.fc_mean = nn.Linear(256, action_dim)
        self.fc_logstd = nn.Linear(256, action_dim)
        # buffers: they travel with the state dict and the device, but are not trained
        low, high = torch.as_tensor(action_low, dtype=torch.float32), torch.as_tensor(action_high, dtype=torch.float32)
        self.register_buffer("action_scale", (high - low) / 2.0)
        self.register_buffer("action_bias", (high + low) / 2.0)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.trunk(obs)
        log_std = torch.tanh(self.fc_logstd(hidden))  # (-1, 1), mapped onto [LOG_STD_MIN, LOG_STD_MAX]
        return self.fc_mean(hidden), LOG_STD_MIN + 0.5 * (LOG_STD_MAX - LOG_STD_MIN) * (log_std + 1)

    def get_action(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(sampled action, its log-probability, mean action), actions in the env's bounds. The
        sample is reparameterized, so gradients flow through it into the actor loss."""
        mean, log_std = self(obs)
        x = mean + torch.exp(log_std) * torch.randn_like(mean)
        action = torch.tanh(x) * self.action_scale + self.action_bias
        log_prob = squashed_gaussian_log_prob(x, mean, log_std, self.action_scale)
        return action, log_prob, torch.tanh(mean) * self.action_scale + self.action_bias


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def soft_td_target(rewards, terminations, next_q, next_log_pi, alpha: float, gamma: float):
    """r + gamma * (1 - terminated) * (min(Q1', Q2')(s', a') - alpha * log pi(a'|s')), a' ~ pi(s'), next_q (2, batch).
    Only a termination stops the bootstrap: a transition cut by a time limit carries terminated = 0."""
    soft_next_value = torch.min(next_q[0], next_q[1]) - alpha * next_log_pi
    return rewards + gamma * (1.0 - terminations) * soft_next_value


def soft_update(target: nn.Module, online: nn.Module, tau: float):
    """Polyak averaging: target <- tau * online + (1 - tau) * target."""
    with torch.no_grad():
        for target_param, param in zip(target.parameters(), online.parameters()):
            target_param.lerp_(param, tau)


def main(args: Args):
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # torch's threads: OMP_NUM_THREADS when set (benchmark/run.py sets it for runs that share the cores: beside
    # other processes a second thread's spin-waits made an update 17x slower), else one per core.
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    if args.eval_checkpoint is not None:  # no training: play the saved policy's episodes
        actor, saved_args = load_policy(args.eval_checkpoint, device)  # a bad file fails before any output
        check_env_exists(saved_args["env_id"])
        run_name = f"{saved_args['env_id'].replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        writer = start_logging(args, run_name, None)
        evaluate_policy(args, saved_args["env_id"], actor, device, writer, run_name)
        return finish_logging(args, writer, run_name)
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        env = make_env(args.env_id, f"videos/{run_name}" if args.capture_video else None)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: an id `module:Env`
        fail(f"cannot make environment {args.env_id!r}: {e}")
    if not isinstance(env.action_space, gym.spaces.Box):
        fail(f"{args.env_id} has actions {env.action_space}; this script needs continuous (Box) ones")
    if not (isinstance(env.observation_space, gym.spaces.Box) and len(env.observation_space.shape) == 1):
        fail(f"{args.env_id} has observation space {env.observation_space}; this script needs a flat Box (vectors)")
    if not np.all(np.isfinite(env.action_space.low) & np.isfinite(env.action_space.high)):
        fail(f"{args.env_id} has unbounded actions {env.action_space}; the tanh policy needs finite bounds")
    obs, _ = env.reset(seed=args.seed)
    env.action_space.seed(args.seed)
    writer = start_logging(args, run_name, None)

    obs_dim, action_dim = env.observation_space.shape[0], env.action_space.shape[0]
    actor = Actor(obs_dim, env.action_space.low, env.action_space.high).to(device)
    qf, qf_target = TwinSoftQNetwork(obs_dim, action_dim).to(device), TwinSoftQNetwork(obs_dim, action_dim).to(device)
    qf_target.load_state_dict(qf.state_dict())
    # fused: one kernel for all parameters, not a dozen small ops per tensor (4-5x faster steps on CPU)
    q_optimizer = optim.Adam(qf.parameters(), lr=args.q_lr, fused=True)
    actor_optimizer = optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True)
    if args.autotune:
        target_entropy = -float(action_dim)
        log_alpha = torch.zeros(1, requires_grad=True, device=device)
        alpha = log_alpha.exp().item()
        a_optimizer = optim.Adam([log_alpha], lr=args.q_lr, fused=True)
    else:
        alpha = args.alpha

    rb = ReplayBuffer(min(args.buffer_size, args.total_timesteps), obs_dim, action_dim)
    sample_rng = np.random.default_rng(args.seed)
    progress = Progress(args.total_timesteps, args.progress_interval)
    num_q_updates, num_actor_updates, start_time, recent_returns = 0, 0, time.time(), deque(maxlen=20)

    for global_step in range(1, args.total_timesteps + 1):
        if global_step <= args.learning_starts:
            action = env.action_space.sample()
        else:
            with torch.no_grad():
                action, _, _ = actor.get_action(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
            action = action[0].cpu().numpy()

        next_obs, reward, terminated, truncated, info = env.step(action)
        # next_obs is the real last observation when the episode ended: the env is reset below
        rb.add(obs, action, reward, next_obs, terminated)
        if terminated or truncated:
            recent_returns.append(float(info["episode"]["r"]))
            writer.add_scalar("charts/episodic_return", info["episode"]["r"], global_step)
            writer.add_scalar("charts/episodic_length", info["episode"]["l"], global_step)
            next_obs, _ = env.reset()
        obs = next_obs

        if global_step > args.learning_starts:
            batch = {k: torch.from_numpy(v).to(device) for k, v in rb.sample(args.batch_size, sample_rng).items()}
            with torch.no_grad():
                next_actions, next_log_pi, _ = actor.get_action(batch["next_obs"])
                next_q = qf_target(batch["next_obs"], next_actions)
                target = soft_td_target(batch["rewards"], batch["terminations"], next_q, next_log_pi, alpha, args.gamma)
            qf1_values, qf2_values = qf(batch["obs"], batch["actions"])
            qf1_loss, qf2_loss = F.mse_loss(qf1_values, target), F.mse_loss(qf2_values, target)
            qf_loss = qf1_loss + qf2_loss
            q_optimizer.zero_grad(set_to_none=True)
            qf_loss.backward()
            q_optimizer.step()
            num_q_updates += 1

            if global_step % args.policy_frequency == 0:
                # Delayed (TD3-style) but not fewer: policy_frequency updates in a row, as many as the critics'.
                for _ in range(args.policy_frequency):
                    actions_pi, log_pi, _ = actor.get_action(batch["obs"])
                    min_q_pi = qf(batch["obs"], actions_pi).min(dim=0).values
                    actor_loss = (alpha * log_pi - min_q_pi).mean()
                    actor_optimizer.zero_grad(set_to_none=True)
                    actor_loss.backward(inputs=list(actor.parameters()))  # through the critics, not into them
                    actor_optimizer.step()
                    num_actor_updates += 1

                    if args.autotune:
                        # moves alpha up while the policy's entropy (-log_pi) is below the target
                        alpha_loss = (-log_alpha.exp() * (log_pi.detach() + target_entropy)).mean()
                        a_optimizer.zero_grad(set_to_none=True)
                        alpha_loss.backward()
                        a_optimizer.step()
                        alpha = log_alpha.exp().item()

            if global_step % args.target_network_frequency == 0:
                soft_update(qf_target, qf, args.tau)

            if global_step % LOG_EVERY == 0:
                writer.add_scalar("losses/qf1_values", qf1_values.mean().item(), global_step)
                writer.add_scalar("losses/qf2_values", qf2_values.mean().item(), global_step)
                writer.add_scalar("losses/qf1_loss", qf1_loss.item(), global_step)
                writer.add_scalar("losses/qf2_loss", qf2_loss.item(), global_step)
                writer.add_scalar("losses/qf_loss", qf_loss.item() / 2.0, global_step)  # the mean, CleanRL's tag
                if num_actor_updates:
                    writer.add_scalar("losses/actor_loss", actor_loss.item(), global_step)
                    if args.autotune:
                        writer.add_scalar("losses/alpha_loss", alpha_loss.item(), global_step)
                writer.add_scalar("losses/alpha", alpha, global_step)

        if global_step % LOG_EVERY == 0 or global_step == args.total_timesteps:
            sps = int(global_step / (time.time() - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            progress.show(global_step, sps, recent_returns)

    env.close()  # also finishes the last video
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.total_timesteps} steps, {num_q_updates} critic updates, {num_actor_updates} actor updates, "
        f"{sps} SPS, mean return of the last {len(recent_returns)} episodes {recent}"
    )
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_policy(model_path, actor, qf, args)
        print(f"model saved to {model_path}")
        evaluate_policy(args, args.env_id, actor, device, writer, run_name)
    finish_logging(args, writer, run_name)


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
    if min(args.policy_lr, args.q_lr, args.alpha) < 0:  # a negative alpha would reward a low entropy
        fail(f"--policy-lr, --q-lr and --alpha must not be negative, got {args.policy_lr}, {args.q_lr}, {args.alpha}")
    if not 0 <= args.seed < 2**32:  # what numpy's seed takes
        fail(f"--seed must lie in [0, 2**32), got {args.seed}")
    counts = (args.total_timesteps, args.buffer_size, args.batch_size, args.policy_frequency, args.eval_episodes)
    if min(*counts, args.target_network_frequency) < 1 or args.learning_starts < 0:
        fail(
            "--total-timesteps, --buffer-size, --batch-size, --policy-frequency, --target-network-frequency and "
            "--eval-episodes must be positive, --learning-starts at least 0"
        )
    if args.eval_checkpoint is None and args.learning_starts >= args.total_timesteps:
        fail(f"--learning-starts {args.learning_starts} leaves no step to learn: raise --total-timesteps")
    if not (0.0 < args.tau <= 1.0 and 0.0 <= args.gamma <= 1.0):
        fail(f"--tau must be in (0, 1] and --gamma in [0, 1], got {args.tau}, {args.gamma}")


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


def save_policy(path: str, actor: Actor, qf: TwinSoftQNetwork, args: Args):
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    model = {"actor": actor.state_dict(), "qf": qf.state_dict()}
    sizes = {"obs_dim": actor.trunk[0].in_features, "action_dim": actor.fc_mean.out_features}
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
    """Plays --eval-episodes whole episodes with the policy's mean action; prints and logs their returns."""
    env, returns = make_env(env_id, f"videos/{run_name}-eval" if args.capture_video else None), []
    obs, _ = env.reset(seed=args.seed)
    while len(returns) < args.eval_episodes:
        with torch.no_grad():
            _, _, mean_action = actor.get_action(torch.as_tensor(obs, dtype=torch.float32, device=device)[None])
        obs, _, terminated, truncated, info = env.step(mean_action[0].cpu().numpy())
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


if __name__ == "__main__":
    main(tyro.cli(Args))
