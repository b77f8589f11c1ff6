"""Proximal Policy Optimization (PPO) for classic-control environments with discrete actions.

The reference single-file PPO: CartPole-v1 by default, a gymnasium `SyncVectorEnv` in SAME_STEP
autoreset mode, separate actor and critic MLPs, GAE, and time-limit truncations bootstrapped from
the critic instead of being treated as deaths. Logs to TensorBoard (and to W&B with `--track`).

Run: `python cleanrl/ppo.py --env-id CartPole-v1 --seed 1`; `--help` lists every option.
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
import wandb
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
    """seconds between plain progress lines when stderr is not a terminal (log files, Slurm, nohup)"""

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


def make_envs(env_id: str, num_envs: int, capture_video: bool, run_name: str) -> gym.vector.SyncVectorEnv:
    def make_env(index: int):
        def thunk():
            if capture_video and index == 0:
                env = gym.make(env_id, render_mode="rgb_array")
                env = gym.wrappers.RecordVideo(env, f"videos/{run_name}")
            else:
                env = gym.make(env_id)
            return env

        return thunk

    # SAME_STEP: the step that ends an episode already returns the next episode's first
    # observation, and the real last observation comes in infos["final_obs"] (where
    # infos["_final_obs"] is True). gymnasium 1.x defaults to NEXT_STEP instead, which inserts a
    # fake transition (reward 0, action ignored) after every episode end.
    return gym.vector.SyncVectorEnv(
        [make_env(i) for i in range(num_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


class EpisodeStatistics:
    """Return and length of the running episode of each env, for logging."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, rewards: np.ndarray, dones: np.ndarray) -> list[tuple[int, float, int]]:
        """Count one step of every env; return (env index, return, length) of each episode that ended."""
        self.returns += rewards
        self.lengths += 1
        finished = [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(dones)]
        self.returns[dones] = 0.0
        self.lengths[dones] = 0
        return finished


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
        logits = self.actor(x)
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), self.critic(x)


def bootstrap_truncated(
    rewards: torch.Tensor,
    terminations: torch.Tensor,
    truncations: torch.Tensor,
    final_values: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """Rewards of one vector step, (num_envs,), with gamma * V(final obs) added where an episode was
    cut by a time limit (truncated but not terminated).

    A time limit is not part of the task: the state it stops in still has a future, so its return
    is estimated by the critic instead of taken as 0 (which would teach the agent that the states
    near the limit are deadly). Folding the estimate into the reward lets GAE then treat every
    episode end alike, as the end of the trajectory.
    """
    cut_by_time_limit = truncations & ~terminations
    return rewards + gamma * final_values * cut_by_time_limit


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    next_value: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimates and value targets of a rollout.

    rewards, values, dones: (num_steps, num_envs); dones[t] is 1.0 where the transition of step t
    ended the episode (its reward already holds any truncation bootstrap). next_value: (num_envs,),
    the value of the observation after the last step. Returns (advantages, returns), both
    (num_steps, num_envs), with returns = advantages + values.
    """
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


class Progress:
    """How far the run is, for whoever reads its output: a live line on a terminal; elsewhere (a
    log file, Slurm, nohup, a container) a plain line at most every `interval` seconds, and
    always the first and the last one."""

    def __init__(self, total_steps: int, interval: float):
        self.total, self.interval, self.last_print = total_steps, interval, -float("inf")
        self.on_terminal = sys.stderr.isatty()

    def show(self, global_step: int, sps: int, recent_returns: deque):
        now = time.time()
        if not self.on_terminal and now - self.last_print < self.interval and global_step < self.total:
            return
        self.last_print = now
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "-"
        eta = (self.total - global_step) / max(sps, 1)
        line = (
            f"{global_step:,}/{self.total:,} steps | {sps:,} SPS | return (last {len(recent_returns)}) {recent}"
            f" | ETA {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}"
        )
        if self.on_terminal:
            print(f"\r{line}   ", end="", file=sys.stderr, flush=True)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self):
        if self.on_terminal:
            print(file=sys.stderr)


def main(args: Args) -> None:
    args.batch_size = args.num_envs * args.num_steps
    if args.num_minibatches < 1 or args.batch_size % args.num_minibatches != 0:
        sys.exit(
            f"error: num_envs * num_steps = {args.batch_size} is not divisible by num_minibatches = "
            f"{args.num_minibatches}; pick sizes where it is"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    if args.norm_adv and args.minibatch_size < 2:
        sys.exit(f"error: minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    args.num_iterations = args.total_timesteps // args.batch_size
    if args.num_iterations < 1:
        sys.exit(
            f"error: total_timesteps = {args.total_timesteps} is less than one batch "
            f"(num_envs * num_steps = {args.batch_size}); raise --total-timesteps"
        )
    run_name = f"{args.env_id}__{args.exp_name}__{args.seed}__{int(time.time())}"

    try:
        envs = make_envs(args.env_id, args.num_envs, args.capture_video, run_name)
        # reset here too: a missing render dependency of --capture-video (pygame) only shows up then
        first_obs, _ = envs.reset(seed=args.seed)
    except gym.error.Error as e:
        sys.exit(f"error: cannot make environment {args.env_id!r}: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        sys.exit(
            f"error: {args.env_id} has action space {envs.single_action_space}; this script needs a "
            "Discrete one"
        )

    if args.track:
        wandb.init(
            project=args.wandb_project_name,
            entity=args.wandb_entity,
            sync_tensorboard=True,
            config=vars(args),
            name=run_name,
            save_code=True,
        )
    writer = SummaryWriter(f"runs/{run_name}")
    writer.add_text(
        "hyperparameters",
        "|param|value|\n|-|-|\n" + "\n".join(f"|{key}|{value}|" for key, value in vars(args).items()),
    )

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # The networks are tiny, so extra intra-op threads gain nothing; when other processes share the
    # cores (several seeds at once) their spin-waits made each step ~80x slower on a 2-core machine.
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    obs_shape = envs.single_observation_space.shape
    agent = Agent(int(np.prod(obs_shape)), int(envs.single_action_space.n)).to(device)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # rollout storage, (num_steps, num_envs, ...)
    obs = torch.zeros((args.num_steps, args.num_envs) + obs_shape, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    episode_stats = EpisodeStatistics(args.num_envs)
    recent_returns = deque(maxlen=20)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    global_step = 0
    start_time = time.time()
    next_obs = torch.as_tensor(first_obs, dtype=torch.float32, device=device)

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

            next_obs, reward, terminations, truncations, infos = envs.step(action.cpu().numpy())
            episode_done = terminations | truncations
            final_values = torch.zeros(args.num_envs, device=device)
            cut_by_time_limit = truncations & ~terminations
            if cut_by_time_limit.any():
                # "final_obs" is an object array holding None for the envs whose episode goes on
                final_obs = np.stack(infos["final_obs"][cut_by_time_limit])
                with torch.no_grad():
                    final_values[torch.from_numpy(cut_by_time_limit).to(device)] = agent.get_value(
                        torch.as_tensor(final_obs, dtype=torch.float32, device=device)
                    ).flatten()
            rewards[step] = bootstrap_truncated(
                torch.as_tensor(reward, dtype=torch.float32, device=device),
                torch.as_tensor(terminations, device=device),
                torch.as_tensor(truncations, device=device),
                final_values,
                args.gamma,
            )
            dones[step] = torch.as_tensor(episode_done, dtype=torch.float32, device=device)
            next_obs = torch.as_tensor(next_obs, dtype=torch.float32, device=device)

            # the env steps of one vector step count as consecutive global steps, env 0 first,
            # so every episode is logged at a step of its own
            for env_index, episodic_return, episodic_length in episode_stats.update(reward, episode_done):
                env_global_step = global_step - args.num_envs + env_index + 1
                recent_returns.append(episodic_return)
                writer.add_scalar("charts/episodic_return", episodic_return, env_global_step)
                writer.add_scalar("charts/episodic_length", episodic_length, env_global_step)

        with torch.no_grad():
            next_value = agent.get_value(next_obs).flatten()
        advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        # flatten the rollout into one batch
        b_obs = obs.reshape((-1,) + obs_shape)
        b_actions = actions.reshape(-1)
        b_logprobs = logprobs.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        b_inds = np.arange(args.batch_size)
        clipfracs = []
        for epoch in range(args.update_epochs):
            np.random.shuffle(b_inds)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                logratio = newlogprob - b_logprobs[mb_inds]
                ratio = logratio.exp()
                with torch.no_grad():
                    old_approx_kl = (-logratio).mean()
                    approx_kl = ((ratio - 1) - logratio).mean()  # the low-variance estimator of KL(old, new)
                    clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())

                mb_advantages = b_advantages[mb_inds]
                if args.norm_adv:
                    mb_advantages = (mb_advantages - mb_advantages.mean()) / (mb_advantages.std() + 1e-8)

                # clipped surrogate objective, as a loss to minimize
                pg_loss1 = -mb_advantages * ratio
                pg_loss2 = -mb_advantages * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
                pg_loss = torch.max(pg_loss1, pg_loss2).mean()

                newvalue = newvalue.flatten()
                if args.clip_vloss:
                    v_loss_unclipped = (newvalue - b_returns[mb_inds]) ** 2
                    v_clipped = b_values[mb_inds] + torch.clamp(
                        newvalue - b_values[mb_inds], -args.clip_coef, args.clip_coef
                    )
                    v_loss_clipped = (v_clipped - b_returns[mb_inds]) ** 2
                    v_loss = 0.5 * torch.max(v_loss_unclipped, v_loss_clipped).mean()
                else:
                    v_loss = 0.5 * ((newvalue - b_returns[mb_inds]) ** 2).mean()

                entropy_loss = entropy.mean()
                loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef

                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

            if args.target_kl is not None and approx_kl > args.target_kl:
                break

        y_pred, y_true = b_values.cpu().numpy(), b_returns.cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        sps = int(global_step / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("losses/value_loss", v_loss.item(), global_step)
        writer.add_scalar("losses/policy_loss", pg_loss.item(), global_step)
        writer.add_scalar("losses/entropy", entropy_loss.item(), global_step)
        writer.add_scalar("losses/old_approx_kl", old_approx_kl.item(), global_step)
        writer.add_scalar("losses/approx_kl", approx_kl.item(), global_step)
        writer.add_scalar("losses/clipfrac", np.mean(clipfracs), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        progress.show(global_step, sps, recent_returns)

    progress.close()
    envs.close()  # also finishes the last video
    writer.close()
    if args.track and args.capture_video:
        # uploaded by hand: wandb's monitor_gym patch breaks on gymnasium 1.x RecordVideo
        wandb.save(f"videos/{run_name}/*.mp4", policy="now")
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} episodes {recent}"
    )


if __name__ == "__main__":
    main(tyro.cli(Args))
