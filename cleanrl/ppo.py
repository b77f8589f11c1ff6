"""PPO for classic control with discrete actions (gymnasium), one file: CartPole-v1 by default, a
`SyncVectorEnv` in SAME_STEP autoreset mode, separate actor and critic MLPs, GAE, and time-limit
truncations bootstrapped from the critic instead of treated as deaths. Docs: docs/ppo.md
"""

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
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment (part of the run name)"""
    seed: int = 1
    """seed of the experiment (python, numpy, torch and the environments)"""
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
    """if toggled, episodes 0, 1, 8, 27, ..., then every 1000th of env 0 are recorded to `videos/{run_name}/`"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""

    # environment
    env_id: str = "CartPole-v1"
    """the gymnasium id of the environment (discrete actions, flat observations)"""

    # algorithm
    total_timesteps: int = 500000
    """total number of environment steps of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the Adam optimizer"""
    num_envs: int = 4
    """the number of parallel environments"""
    num_steps: int = 128
    """the number of steps per environment in each rollout"""
    anneal_lr: bool = True
    """if toggled, decay the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 4
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 4
    """the number of passes over the rollout in each update"""
    norm_adv: bool = True
    """if toggled, normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the clipping coefficient of the surrogate objective (and of the value loss)"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's implementation"""
    ent_coef: float = 0.01
    """the coefficient of the entropy bonus"""
    vf_coef: float = 0.5
    """the coefficient of the value loss"""
    max_grad_norm: float = 0.5
    """the maximum norm of the gradient (clipped above it)"""
    target_kl: float | None = None
    """stop the update epochs early once the approximate KL exceeds this; None never stops"""

    # computed at run time (hidden from the command line: a value given there would be overwritten)
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size, num_envs * num_steps (computed at run time)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the minibatch size, batch_size // num_minibatches (computed at run time)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of rollout-and-update iterations, total_timesteps // batch_size (computed at run time)"""


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def make_envs(env_id: str, num_envs: int, video_folder: str | None = None) -> gym.vector.VectorEnv:
    thunks = [lambda: gym.make(env_id)] * num_envs
    if video_folder is not None:  # env 0's episodes 0, 1, 8, 27, ..., then every 1000th (RecordVideo's default)
        thunks[0] = lambda: gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_folder)
    # SAME_STEP: the step that ends an episode already returns the next one's first observation. gymnasium
    # 1.x defaults to NEXT_STEP, which inserts a fake transition (reward 0, action ignored) after each end.
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # infos["episode"]: returns and lengths


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.critic = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 1), std=1.0),
        )
        self.actor = nn.Sequential(
            layer_init(nn.Linear(obs_dim, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, 64)),
            nn.Tanh(),
            layer_init(nn.Linear(64, num_actions), std=0.01),
        )

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        probs = Categorical(logits=self.actor(x))
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def compute_gae(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimation over one rollout. rewards, values, dones: (num_steps, num_envs),
    dones[t] = 1 where step t ended the (learning) episode; next_value: (num_envs,), the value of the
    observation after the last step. Returns (advantages, returns), both (num_steps, num_envs)."""
    num_steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    lastgaelam = torch.zeros_like(next_value)
    for t in reversed(range(num_steps)):
        next_values = next_value if t == num_steps - 1 else values[t + 1]
        nonterminal = 1.0 - dones[t]
        delta = rewards[t] + gamma * next_values * nonterminal - values[t]
        lastgaelam = delta + gamma * gae_lambda * nonterminal * lastgaelam
        advantages[t] = lastgaelam
    return advantages, advantages + values


def ppo_loss(newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args: Args):
    """The clipped PPO objective on one minibatch; returns the loss and the statistics to log."""
    logratio = newlogprob - logprobs
    ratio = logratio.exp()
    with torch.no_grad():
        # http://joschu.net/blog/kl-approx.html
        old_approx_kl = (-logratio).mean()
        approx_kl = ((ratio - 1) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > args.clip_coef).float().mean()

    if args.norm_adv:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = torch.max(pg_loss1, pg_loss2).mean()

    newvalue = newvalue.view(-1)
    if args.clip_vloss:
        v_loss_unclipped = (newvalue - returns) ** 2
        v_clipped = values + torch.clamp(newvalue - values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - returns) ** 2
        v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
    else:
        v_loss = 0.5 * ((newvalue - returns) ** 2).mean()

    entropy_loss = entropy.mean()
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = dict(policy_loss=pg_loss.detach(), value_loss=v_loss.detach(), entropy=entropy_loss.detach())
    return loss, dict(stats, old_approx_kl=old_approx_kl, approx_kl=approx_kl, clipfrac=clipfrac)


def main(args: Args):
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # Tiny networks: more threads gain nothing, and beside other processes their spin-waits made steps 80x slower.
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:  # the first reset too: a missing render dependency of --capture-video (pygame) shows up there
        envs = make_envs(args.env_id, args.num_envs, f"videos/{run_name}" if args.capture_video else None)
        next_obs_np, _ = envs.reset(seed=args.seed)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: an id `module:Env`
        fail(f"cannot make environment {args.env_id!r}: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        fail(f"{args.env_id} has action space {envs.single_action_space}; this script needs a Discrete one")
    obs_space = envs.single_observation_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        fail(f"{args.env_id} has observation space {obs_space}; this script needs a flat Box (vectors)")
    writer = start_logging(args, run_name, None)

    obs_shape = envs.single_observation_space.shape
    agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Rollout storage, (num_steps, num_envs, ...)
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    global_step, start_time, recent_returns = 0, time.time(), deque(maxlen=20)

    for iteration in range(1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            with torch.no_grad():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            actions[step] = action
            logprobs[step] = logprob
            values[step] = value.flatten()

            next_obs_np, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            # A time limit is not a death: the state it cuts still has a future, which the critic estimates
            # from the real last observation (SAME_STEP autoreset keeps it in infos["final_obs"], None where
            # the episode goes on). Folded into the reward, it lets GAE end every episode alike.
            bootstrap, cut_by_time_limit = torch.zeros(args.num_envs, device=device), truncations & ~terminations
            if cut_by_time_limit.any():
                final_obs = torch.as_tensor(np.stack(infos["final_obs"][cut_by_time_limit]), dtype=torch.float32)
                with torch.no_grad():
                    bootstrap[cut_by_time_limit] = args.gamma * agent.get_value(final_obs.to(device)).flatten()
            rewards[step] = torch.as_tensor(reward, dtype=torch.float32, device=device) + bootstrap
            dones[step] = torch.as_tensor(terminations | truncations, dtype=torch.float32, device=device)
            next_obs = torch.as_tensor(next_obs_np, dtype=torch.float32, device=device)

            # The env steps of one vector step count as consecutive global steps, env 0 first, so
            # every episode is logged at a step of its own.
            for i in np.flatnonzero(infos.get("_episode", [])):
                episode_step = global_step - args.num_envs + i + 1
                recent_returns.append(float(infos["episode"]["r"][i]))
                writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], episode_step)
                writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], episode_step)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).flatten()
        advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = (
            x.reshape(args.batch_size, *x.shape[2:]) for x in (obs, actions, logprobs, advantages, returns, values)
        )

        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                old = (b_logprobs[mb_inds], b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds])
                loss, stats = ppo_loss(newlogprob, entropy, newvalue, *old, args)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # over the whole update; the others: its last minibatch
        for name, value in stats.items():
            writer.add_scalar(f"losses/{name}", value.item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        progress.show(global_step, sps, recent_returns)

    envs.close()  # also finishes the last video
    finish_logging(args, writer, run_name)
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} episodes {recent}"
    )


# =============================================================================================
# Run infrastructure: what makes a run watchable, resumable and reusable; not the algorithm. Each block
# is the same text in every script that has it (tests/test_blocks.py), but for lines marked `# this script`.
# =============================================================================================
def fail(message: str):
    """A user error: one line naming the problem, a non-zero exit, no traceback."""
    sys.exit(f"error: {message}")


def check_args(args: Args):
    if "/" in args.exp_name or not args.exp_name:  # it names the run's folder and the model file in it
        fail(f"--exp-name {args.exp_name!r} must be a name without '/'")
    # Below 0, each trains silently wrong: ascent (rate, value loss), flipped gradients, clamp(min > max), stops at once
    for name in ("learning_rate", "max_grad_norm", "clip_coef", "vf_coef", "target_kl"):
        if (getattr(args, name) or 0) < 0:  # target_kl: None never stops
            fail(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if not (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1):
        fail(f"--gamma and --gae-lambda must lie in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if not 0 <= args.seed < 2**32:  # what numpy's seed takes
        fail(f"--seed must lie in [0, 2**32), got {args.seed}")
    if min(args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs) < 1:
        fail("--num-envs, --num-steps, --num-minibatches and --update-epochs must be positive")
    if args.batch_size % args.num_minibatches != 0:
        fail(f"num_envs * num_steps = {args.batch_size} is not divisible by num_minibatches = {args.num_minibatches}")
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    if args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} steps)")


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
