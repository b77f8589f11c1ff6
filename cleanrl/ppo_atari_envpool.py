"""PPO on Atari with envpool 1.x, one file.

Proximal Policy Optimization with the Nature-CNN agent and the standard Atari preprocessing (noop
reset, frame skip 4 with max-pool, fire on reset, 84x84 grayscale, stack of 4; episodic life and
reward clipping for learning), all done by envpool's C++ thread pool, which resets a finished episode
on the step after its end: the loop leaves those reset steps out of the update. Beside the algorithm:
bf16 autocast, checkpoints and resume, videos, and evaluation of a saved model.
Docs: docs/ppo_atari_envpool.md
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
from typing import Literal

import envpool
import numpy as np
import torch
import torch.nn as nn
import torch.optim as optim
import tyro
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (environment i gets seed + i)"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, cuda is used when available"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """if toggled, env 0's games 0, 1, 8, 27, ..., then every 1000th, are saved as mp4 to `videos/{run_name}/`"""
    save_model: bool = False
    """if toggled, the model is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 autocasts the network's forward passes; loss, advantages and optimizer stay fp32"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""
    checkpoint_every: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never)"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest of this env_id, exp_name and seed"""

    # Environment
    env_id: str = "Breakout-v5"
    """the game: `BreakoutNoFrameskip-v4`, `ALE/Breakout-v5` and `Breakout-v5` all name Breakout"""
    repeat_action_probability: float = 0.0
    """sticky actions; 0 is the NoFrameskip-v4 / envpool convention behind the published PPO scores"""
    max_episode_steps: int = 27_000
    """the time limit of a game in agent steps (108,000 frames, as v5); a game cut by it is bootstrapped"""

    # Algorithm
    total_timesteps: int = 10_000_000
    """total environment steps (agent steps, each 4 emulator frames) of the experiment"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    num_envs: int = 8
    """the number of parallel game environments"""
    num_steps: int = 128
    """the number of steps run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing to zero over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization"""
    clip_coef: float = 0.1
    """the surrogate clipping coefficient"""
    clip_vloss: bool = True
    """toggles whether or not to use a clipped loss for the value function, as per the paper"""
    ent_coef: float = 0.01
    """coefficient of the entropy"""
    vf_coef: float = 0.5
    """coefficient of the value function"""
    max_grad_norm: float = 0.5
    """the maximum norm for the gradient clipping"""
    target_kl: float | None = None
    """the target KL divergence threshold (stops the epochs of an update early)"""

    # Computed at run time (hidden from the command line: a value given there would be overwritten)
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (num_envs * num_steps)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size (batch_size // num_minibatches)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (total_timesteps // batch_size)"""


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def envpool_task(env_id: str) -> str:
    """Maps `Breakout-v5`, `ALE/Breakout-v5` or `BreakoutNoFrameskip-v4` to envpool's task id `Breakout-v5`."""
    task_id = env_id.removeprefix("ALE/").replace("NoFrameskip-v4", "-v5")
    # envpool also registers non-Atari `-v5` tasks (MuJoCo's Ant-v5...): only an Atari spec will do.
    if task_id in envpool.list_all_envs() and isinstance(envpool.make_spec(task_id), envpool.atari.AtariEnvSpec):
        return task_id
    fail(f"unknown Atari env id {env_id!r} (try BreakoutNoFrameskip-v4 or ALE/Breakout-v5)")


def make_envs(env_id, num_envs, repeat_action_probability, seed, max_episode_steps, noop_max=30, rgb_frames=False):
    # Environment i is seeded with seed + i (envpool ignores reset(seed=...)). episodic_life: a lost life sets
    # `terminated` but the game goes on, random no-ops then FIRE on the next step; info["terminated"] marks the
    # real game over. reward_clip: the reward is sign(reward), info["reward"] the raw one. rgb_frames: the same
    # games as full 210x160 RGB screens (for videos) instead of the agent's 84x84 grayscale stacks.
    return envpool.make_gymnasium(
        envpool_task(env_id),
        num_envs=num_envs,
        num_threads=min(num_envs, os.cpu_count() or 1),
        repeat_action_probability=repeat_action_probability,
        max_episode_steps=max_episode_steps,
        seed=seed,
        noop_max=noop_max,
        frame_skip=4,
        use_fire_reset=True,
        img_height=210 if rgb_frames else 84,
        img_width=160 if rgb_frames else 84,
        gray_scale=not rgb_frames,
        stack_num=1 if rgb_frames else 4,
        episodic_life=True,
        reward_clip=True,
    )


class EpisodeStatistics:
    """Running score and length of the game each environment is playing: envpool's raw `reward`, `elapsed_step`."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)

    def step(self, info: dict, game_over: np.ndarray) -> list[tuple[int, float, int]]:
        """Adds one step of unclipped rewards; returns (env index, return, length) of finished games."""
        self.returns += info["reward"]
        finished = [(i, float(self.returns[i]), int(info["elapsed_step"][i])) for i in np.flatnonzero(game_over)]
        self.returns[game_over] = 0.0
        return finished


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
def layer_init(layer, std=np.sqrt(2), bias_const=0.0):
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


class Agent(nn.Module):
    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            layer_init(nn.Conv2d(4, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
            layer_init(nn.Linear(64 * 7 * 7, 512)),
            nn.ReLU(),
        )
        self.actor = layer_init(nn.Linear(512, num_actions), std=0.01)
        self.critic = layer_init(nn.Linear(512, 1), std=1)

    def hidden(self, obs):
        # obs: (batch, 4, 84, 84) uint8. Channels-last lets the conv kernels run without layout
        # shuffles (1.6x faster updates on CPU). The layout changes while the batch is still uint8, and
        # the one conversion goes straight to the dtype the convs compute in (bf16 under autocast or in
        # a bf16 copy of the network: 1.4x faster on CPU, same numbers since 0..255 are exact in bf16).
        device = obs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.network[0].weight.dtype
        x = obs.contiguous(memory_format=torch.channels_last).to(dtype).div_(255.0)
        return self.network(x)

    def heads(self, hidden):
        # The heads run in fp32 even under bf16 autocast: values and log-probabilities feed GAE, value
        # clipping and the probability ratio, where bf16's 3 significant digits would show.
        with torch.autocast(hidden.device.type, enabled=False):
            hidden = hidden.float()
            return self.actor(hidden), self.critic(hidden)

    def get_value(self, obs):
        return self.heads(self.hidden(obs))[1]

    def get_action_and_value(self, obs, action=None):
        logits, value = self.heads(self.hidden(obs))
        probs = Categorical(logits=logits)
        if action is None:
            action = probs.sample()
        return action, probs.log_prob(action), probs.entropy(), value


def acting_copy(agent: Agent, dtype: torch.dtype) -> Agent:  # this script
    """A copy of the agent for acting only: its conv body stored in dtype, its heads in fp32 as under
    autocast. Refreshed with `load_state_dict(agent.state_dict())`, which casts, before each rollout."""
    acting = copy.deepcopy(agent).requires_grad_(False)
    acting.network.to(dtype)  # this script
    return acting


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


def time_limit_cuts(truncated, info: dict, lives_before):
    """Where the time limit cut a learning episode that would have gone on: the steps to bootstrap. envpool also
    flags the time limit on a step that ended the game or lost a life, which ends the learning episode anyway:
    nothing to bootstrap there. lives_before: each env's lives before the step."""
    return truncated & ~info["terminated"].astype(bool) & (info["lives"] >= lives_before)


def bootstrap_truncations(rewards, values, truncations, next_value, gamma: float):
    """A time limit is not a death: a truncated step's reward gains gamma * V(its last observation), which envpool
    returns at that step: values[t + 1] (next_value after the last step), so no extra forward pass is needed."""
    following_values = torch.cat([values[1:], next_value[None]])
    return rewards + gamma * following_values * truncations


def played_minibatches(played, num_minibatches: int) -> tuple[torch.Tensor, ...]:
    """Shuffled flat indices of the played steps in `num_minibatches` parts of nearly equal size (fewer when
    tiny settings leave fewer played steps). played: (num_steps, num_envs) bool, False at envpool's reset steps."""
    b_played = torch.nonzero(played.reshape(-1)).flatten()
    shuffled = b_played[torch.randperm(len(b_played), device=played.device)]
    return torch.tensor_split(shuffled, min(num_minibatches, len(b_played)))


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
        # Reset steps leave the update: a minibatch of tiny settings may hold one sample (no NaN std then).
        advantages = (advantages - advantages.mean()) / (advantages.std(correction=min(1, len(advantages) - 1)) + 1e-8)
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
    stats = dict(
        policy_loss=pg_loss.detach(),
        value_loss=v_loss.detach(),
        entropy=entropy_loss.detach(),
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, stats


def main(args: Args):
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    warn_if_bf16_is_slow(args.mixed_precision, device)
    keep_freed_memory()
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")

    # The run is named after the game it plays: an evaluation's is the saved model's.
    env_id = load_model(args.eval_checkpoint, device)[1]["env_id"] if args.eval_checkpoint else args.env_id
    run_name = f"{env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.eval_checkpoint is not None:  # no training: play the saved model's games
        writer = start_logging(args, run_name, None)
        run_evaluation(args, device, writer, run_name)
        writer.close()
        return
    checkpoint = load_checkpoint(args.resume, args) if args.resume is not None else None
    run_name = checkpoint["run_name"] if checkpoint else run_name  # a resumed run goes on in its own folder
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if args.checkpoint_every or checkpoint else None
    writer = start_logging(args, run_name, checkpoint)

    # Environment i gets seed + i. The games in progress at a checkpoint are not in it: a resumed run
    # starts new games, on seeds the run has not used (seed + iteration * num_envs + i).
    env_seed = args.seed + (checkpoint["iteration"] if checkpoint else 0) * args.num_envs
    envs = make_envs(args.env_id, args.num_envs, args.repeat_action_probability, env_seed, args.max_episode_steps)
    agent = Agent(int(envs.single_action_space.n)).to(device).to(memory_format=torch.channels_last)
    # Fused: one kernel for all of Adam's arithmetic (2.8x faster than the per-tensor loop on CPU).
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # The rollout's batch-of-8 forwards act with a copy of the agent whose conv body is stored in the
    # dtype it computes in. Under bf16, autocast would cast every weight at every forward, a third of a
    # rollout forward's time; the copy, refreshed once an iteration, gives the same numbers bit for bit.
    acting_agent = acting_copy(agent, torch.bfloat16) if args.mixed_precision == "bf16" else agent

    # Rollout storage. Observations stay uint8: 4x less memory and copying than float.
    obs = torch.zeros((args.num_steps, args.num_envs, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    truncations = torch.zeros((args.num_steps, args.num_envs), device=device)
    played = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool, device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    start_iteration, global_step, env0_games, recent_returns = 0, 0, 0, deque(maxlen=20)
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        torch.set_rng_state(checkpoint["rng_state"]["torch"])
        cuda_states = checkpoint["rng_state"]["cuda"] or []  # a resume may run on a machine with fewer GPUs
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
        start_iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        env0_games = checkpoint["env0_games"]  # the games env 0 finished: videos go on numbering from there
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only

    next_obs_np, info = envs.reset()
    next_obs, lives = torch.from_numpy(next_obs_np).to(device), info["lives"]
    episode_stats = EpisodeStatistics(args.num_envs)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    video = VideoRecorder(f"videos/{run_name}", args.env_id, env_seed, args, env0_games) if args.capture_video else None
    start_time, start_global_step, sps = time.time(), global_step, 0

    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        if acting_agent is not agent:
            acting_agent.load_state_dict(agent.state_dict())  # this iteration's weights, cast once
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            with torch.inference_mode():
                action, logprob, _, value = acting_agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob
            # envpool resets an env on the step after its episode ended, ignoring the action: not learned from.
            played[step] = dones[step - 1] == 0  # at step 0, dones[-1] is still the last rollout's last step

            action = action.cpu().numpy()
            next_obs_np, reward, terminated, truncated, info = envs.step(action)
            game_over = info["terminated"].astype(bool) | truncated
            # Episodic life: losing a life ends the learning episode (the game goes on), which makes
            # the cost of losing a life visible to the agent.
            rewards[step] = torch.from_numpy(reward).to(device)  # clipped by envpool
            dones[step] = torch.from_numpy(terminated | truncated).to(device)
            truncations[step] = torch.from_numpy(time_limit_cuts(truncated, info, lives)).to(device)
            lives = info["lives"]
            next_obs = torch.from_numpy(next_obs_np).to(device)

            if video is not None:
                video.step(action[0])
            env0_games += bool(game_over[0])
            # The env steps of one vector step count as consecutive global steps, env 0 first, so
            # every game is logged at a step of its own.
            for i, episodic_return, episodic_length in episode_stats.step(info, game_over):
                recent_returns.append(episodic_return)
                writer.add_scalar("charts/episodic_return", episodic_return, global_step - args.num_envs + i + 1)
                writer.add_scalar("charts/episodic_length", episodic_length, global_step - args.num_envs + i + 1)

        with torch.inference_mode():
            next_value = acting_agent.get_value(next_obs).flatten()
        bootstrapped_rewards = bootstrap_truncations(rewards, values, truncations, next_value, args.gamma)
        advantages, returns = compute_gae(bootstrapped_rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs = obs.reshape((-1, 4, 84, 84))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        clipfracs = []
        for epoch in range(args.update_epochs):
            for mb_inds in played_minibatches(played, args.num_minibatches):
                mb_obs = torch.index_select(b_obs, 0, mb_inds)  # 4x faster than b_obs[mb_inds] on CPU
                with autocast:
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, b_actions[mb_inds])
                old = b_logprobs[mb_inds], b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds]
                loss, stats = ppo_loss(newlogprob, entropy, newvalue, *old, args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        y_pred, y_true = values[played].cpu().numpy(), returns[played].cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # over the whole update; the others: its last minibatch
        for name, value in stats.items():
            writer.add_scalar(f"losses/{name}", value.item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        progress.show(global_step, sps, recent_returns)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            writer.flush()  # everything up to this checkpoint is on disk before it counts
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(), iteration=iteration)
            state.update(global_step=global_step, env0_games=env0_games, recent_returns=list(recent_returns))
            save_checkpoint(checkpoint_folder, f"iteration-{iteration:07d}.pt", state, args, run_name)

    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} games {recent}"
    )
    envs.close()
    if video is not None:
        video.close()
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_model(model_path, agent, args)
        print(f"model saved to {model_path}")
        run_evaluation(args, device, writer, run_name, agent)
    writer.close()
    if run_lock is not None:
        run_lock.close()


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
    # Env i gets seed + i, and a resumed run new seeds past the ones used (main): the emulator takes 32-bit seeds.
    last_env_seed = args.seed + (max(args.num_iterations, 1) + 1) * args.num_envs
    if args.seed < 0 or last_env_seed >= 2**31:
        fail(f"--seed {args.seed}: the run's env seeds, up to {last_env_seed:,}, must lie in [0, 2**31)")
    if not 0 <= args.repeat_action_probability < 1:  # at 1 no action of the agent's would ever be played
        fail(f"--repeat-action-probability must lie in [0, 1), got {args.repeat_action_probability}")
    if min(args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs, args.eval_episodes) < 1:
        fail("--num-envs, --num-steps, --num-minibatches, --update-epochs and --eval-episodes must be positive")
    if args.num_steps < 2:  # a one-step rollout of envs that all sit on a reset step has nothing to learn from
        fail("--num-steps must be at least 2: envpool spends a step on every reset")
    if args.batch_size % args.num_minibatches != 0:
        fail(f"num_envs * num_steps = {args.batch_size} is not divisible by num_minibatches = {args.num_minibatches}")
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    if args.max_episode_steps < 1:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    if args.max_episode_steps >= 2**29:  # the emulator counts a game's frames, 4 a step, in 32 bits
        fail(
            f"--max-episode-steps {args.max_episode_steps:,} overflows the emulator's frame counter: at most 2**29 - 1"
        )
    envpool_task(args.env_id)  # an unknown env id fails here, before anything is written
    if args.eval_checkpoint is None and args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} steps)")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}")


def warn_if_bf16_is_slow(mixed_precision: str, device: torch.device):
    # oneDNN has bf16 kernels only on CPUs with AVX-512 (or ARM's bf16); elsewhere autocast emulates
    # bf16, and training runs several times slower than fp32 (8x on a 2-core AVX2 EPYC).
    if mixed_precision == "bf16" and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("warning: this CPU has no fast bf16 (oneDNN needs AVX-512): bf16 runs slower than fp32", file=sys.stderr)


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


def capped_cubic(game: int) -> bool:
    """Games 0, 1, 8, 27, ..., 729, then every 1000th: many videos early, few in a long run."""
    return round(game ** (1 / 3)) ** 3 == game if game < 1000 else game % 1000 == 0


class VideoRecorder:
    """Records games of env 0 as RGB mp4 files, `{folder}/game-{k}.mp4` for the k-th game. The agent's
    envs give only 84x84 grayscale stacks, so a one-env shadow of env 0 (same game, seed and settings,
    full 210x160 RGB screens) is given env 0's actions and plays the identical game. Each screen goes
    straight to an ffmpeg process, which encodes beside training and never holds a whole game. A video
    holds its game's first screen and one per step; `close()` keeps a game still in play up to its last
    screen. Under --track each finished file goes to wandb."""

    def __init__(self, folder: str, env_id: str, seed: int, args: Args, first_game=0, schedule=capped_cubic):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.schedule, self.game, self.track, self.ffmpeg = folder, schedule, first_game, args.track, None
        sticky, time_limit = args.repeat_action_probability, args.max_episode_steps
        self.shadow = make_envs(env_id, 1, sticky, seed, time_limit, rgb_frames=True)  # this script
        screen, _ = self.shadow.reset()  # this script
        self.start_game(screen[0].transpose(1, 2, 0))  # this script

    def start_game(self, screen):
        if self.schedule(self.game):
            import imageio_ffmpeg  # imported here: only video runs pay for it

            self.path = os.path.join(self.folder, f"game-{self.game}.mp4")
            self.ffmpeg = imageio_ffmpeg.write_frames(self.path, (160, 210), fps=30, macro_block_size=1)
            self.ffmpeg.send(None)  # starts ffmpeg
            self.ffmpeg.send(np.ascontiguousarray(screen))

    def step(self, action_env0: int):
        screen, _, terminated, truncated, info = self.shadow.step(np.array([action_env0]))
        game_over = info["elapsed_step"][0] == 0  # this script: envpool's reset step after a game over: a new game
        shown = None if game_over else screen[0].transpose(1, 2, 0)  # this script: the screen this step showed
        if self.ffmpeg is not None and shown is not None:
            self.ffmpeg.send(np.ascontiguousarray(shown))
        if game_over:
            self.end_video()
            self.game += 1
            self.start_game(screen[0].transpose(1, 2, 0))  # this script

    def end_video(self):
        if self.ffmpeg is not None:
            self.ffmpeg.close()
            self.ffmpeg = None
            if self.track:
                import wandb

                wandb.log({"videos/game": wandb.Video(self.path, format="mp4")}, commit=False)

    def close(self):
        self.end_video()
        self.shadow.close()


def save_model(path: str, agent: nn.Module, args: Args):
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    model = {"model": agent.state_dict(), "num_actions": agent.actor.out_features}  # this script
    torch.save({**model, "args": vars(args)}, path + ".tmp")  # this script
    os.replace(path + ".tmp", path)


def load_model(path: str, device) -> tuple[nn.Module, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location=device, weights_only=True)  # this script
        agent = Agent(payload["num_actions"]).to(device).to(memory_format=torch.channels_last)  # this script
        agent.load_state_dict(payload["model"])  # this script
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return agent, dict(payload["args"])


def evaluate(agent: nn.Module, env_id: str, eval_episodes: int, device, args: Args, seed=0, video_folder=None) -> list:
    """Plays `eval_episodes` whole games (all lives, unclipped score) with the agent's policy. Each env plays
    a fixed quota of games: keeping the first games to finish would favour short (bad) ones."""
    num_envs = min(8, eval_episodes)
    quota = [eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)]
    envs = make_envs(env_id, num_envs, args.repeat_action_probability, seed, args.max_episode_steps)  # this script
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")  # this script
    video = (
        VideoRecorder(video_folder, env_id, seed, args, schedule=lambda game: game < quota[0]) if video_folder else None
    )
    stats, returns = EpisodeStatistics(num_envs), [[] for _ in range(num_envs)]
    obs, _ = envs.reset()  # this script
    while any(len(r) < q for r, q in zip(returns, quota)):
        with torch.inference_mode(), autocast:  # this script
            action = agent.get_action_and_value(torch.from_numpy(obs).to(device))[0].cpu().numpy()  # this script
        obs, reward, terminated, truncated, info = envs.step(action)
        if video is not None:
            video.step(action[0])
        game_over = info["terminated"].astype(bool) | truncated  # this script
        for i, episodic_return, _ in stats.step(info, game_over):  # this script
            if len(returns[i]) < quota[i]:
                returns[i].append(episodic_return)
    envs.close()
    if video is not None:
        video.close()
    return [r for env_returns in returns for r in env_returns]


def run_evaluation(args: Args, device, writer: SummaryWriter, run_name: str, agent=None) -> list:
    """Plays --eval-episodes games with the trained agent, or else with the model --eval-checkpoint names,
    under this command's emulator settings; prints and logs their returns."""
    env_id = args.env_id
    if agent is None:
        agent, saved_args = load_model(args.eval_checkpoint, device)
        env_id = saved_args["env_id"]
        for name in ("repeat_action_probability", "max_episode_steps"):
            if saved_args.get(name, getattr(args, name)) != getattr(args, name):
                flag, value = name.replace("_", "-"), getattr(args, name)
                print(
                    f"warning: evaluating with --{flag} {value}; the model was trained with {saved_args[name]}",
                    file=sys.stderr,
                )
    video_folder = f"videos/{run_name}-eval" if args.capture_video else None
    returns = evaluate(agent, env_id, args.eval_episodes, device, args, args.seed, video_folder)
    for i, episodic_return in enumerate(returns):
        print(f"eval_episode={i}, episodic_return={episodic_return}")
        writer.add_scalar("eval/episodic_return", episodic_return, i)
    print(f"eval: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} games")
    return returns


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
        checkpoint = torch.load(resume, map_location="cpu", weights_only=True)  # this script: read whole (20 MB)
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
