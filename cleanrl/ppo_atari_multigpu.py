"""PPO on Atari (gymnasium 1.x + ale-py), data parallel under torchrun, one file.

The PPO of ppo_atari.py spread over N processes by `torchrun`: on one machine or several, on CPUs (gloo)
or GPUs (nccl). Each process plays its share of the job's environments and learns on its share of every
minibatch; the gradients are averaged with one all-reduce per minibatch, so every process holds
bit-identical weights. Checkpoints resume on another number of processes, also when torchrun restarts
failed workers or nodes join and leave; with `--env-split measured` processes of unequal speed get shares
of the environments in proportion to their measured speed.
Docs: docs/ppo_atari_multigpu.md
"""

import copy
import ctypes
import dataclasses
import datetime
import fcntl
import functools
import glob
import hashlib
import json
import math
import os
import random
import re
import secrets
import socket
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 imported before the process group exists: see start_process_group
import torch.nn as nn
import torch.optim as optim
import tyro
from ale_py.vector_env import AtariVectorEnv
from torch.distributed.elastic.multiprocessing.errors import record
from torch.distributions.categorical import Categorical
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (environment i of the whole job gets seed + i; process r seeds torch with seed + r)"""
    torch_deterministic: bool = True
    """if toggled, sets `torch.backends.cudnn.deterministic=True`"""
    cuda: bool = True
    """if toggled, each process uses a GPU (cuda:LOCAL_RANK) when available"""
    track: bool = False
    """if toggled, the run is tracked with Weights and Biases"""
    wandb_project_name: str = "cleanRL"
    """the wandb project name"""
    wandb_entity: str | None = None
    """the entity (team) of the wandb project"""
    capture_video: bool = False
    """if toggled, rank 0's env 0's games 0, 1, 8, 27, ..., then every 1000th, are saved to `videos/{run_name}/`"""
    save_model: bool = False
    """if toggled, the model is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 autocasts the network's forward passes; loss, advantages, gradient all-reduce and optimizer stay fp32"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""
    checkpoint_every: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never)"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest of this env_id, exp_name and seed"""

    # Environment
    env_id: str = "BreakoutNoFrameskip-v4"
    """the game: `BreakoutNoFrameskip-v4`, `ALE/Breakout-v5` and `Breakout-v5` all name Breakout"""
    repeat_action_probability: float = 0.0
    """sticky actions; 0 is the NoFrameskip-v4 / envpool convention behind the published PPO scores"""
    max_episode_steps: int = 27_000
    """the time limit of a game in agent steps (108,000 frames, as v5); a game cut by it is bootstrapped"""

    # Algorithm
    total_timesteps: int = 10_000_000
    """total environment steps (agent steps, each 4 emulator frames) of the whole job"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int = 8
    """the number of parallel game environments of each process (the job has local_num_envs * world size)"""
    num_envs: int | None = None
    """the number of environments of the whole job, split over the processes (instead of local_num_envs)"""
    num_steps: int = 128
    """the number of steps run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing to zero over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each process gives a share of every one, in proportion to its environments)"""
    update_epochs: int = 4
    """the K epochs to update the policy"""
    norm_adv: bool = True
    """toggles advantages normalization (with the statistics of the whole job's minibatch)"""
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
    """the target KL divergence threshold (stops the epochs of an update early, on every process at once)"""

    # Scale-out: where the job runs; a resumed run may change these
    backend: str = "auto"
    """the torch.distributed backend: `nccl`, `gloo`, or `auto` (nccl when each process has a GPU, gloo otherwise)"""
    device_ids: list[int] | None = None
    """the GPU of each process on a node, indexed by LOCAL_RANK; unset, process LOCAL_RANK uses cuda:LOCAL_RANK"""
    env_split: Literal["even", "measured"] = "even"
    """how the job's environments are split over the processes: `even`, or `measured`: in proportion to their speed"""
    split_every: int = 10
    """with --env-split measured: the iterations of one speed measurement, after which the split may change"""
    split_threshold: float = 0.1
    """with --env-split measured: the split changes only if predicted to shorten an iteration by more than this share"""
    collective_timeout: float = 120.0
    """seconds a process waits in a collective call for a peer it cannot reach, then fails (torchrun re-forms a job)"""

    # Computed at run time (hidden from the command line: a value given there would be overwritten)
    world_size: tyro.conf.Suppress[int] = 0
    """the number of processes of the job (torchrun's WORLD_SIZE)"""
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size of the whole job (num_envs * num_steps)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size of the whole job (batch_size // num_minibatches)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (total_timesteps // batch_size)"""


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def atari_game(env_id: str) -> str:
    """Maps `BreakoutNoFrameskip-v4`, `ALE/Breakout-v5` or `Breakout-v5` to the ROM name `breakout`."""
    gym.register_envs(ale_py)
    for candidate in (env_id, f"ALE/{env_id}"):
        try:
            spec = gym.spec(candidate)
        except gym.error.Error:
            continue
        if "game" in spec.kwargs:
            return spec.kwargs["game"]
    fail(f"unknown Atari env id {env_id!r} (try BreakoutNoFrameskip-v4 or ALE/Breakout-v5)")


def make_envs(env_id, num_envs, repeat_action_probability, max_episode_steps=27_000, noop_max=30, rgb_frames=False):
    # Life loss and reward clipping are applied by the training loop, not here: ale-py's
    # `episodic_life=True` restarts the whole game at each life loss, which is not the usual trick
    # (the game goes on with its remaining lives), and the real game gives the episode statistics
    # the whole unclipped score. SAME_STEP autoreset: a finished game's step already returns the
    # next game's first observation, so no fake transition enters the rollout. rgb_frames: the same
    # games as full 210x160 RGB screens (for videos) instead of the agent's 84x84 grayscale stacks.
    # The emulator threads are this process's share of the cores: torch's thread count, which
    # torchrun sets to OMP_NUM_THREADS=1 when it starts several processes per node.
    return AtariVectorEnv(
        atari_game(env_id),
        num_envs,
        num_threads=min(num_envs, torch.get_num_threads()),
        repeat_action_probability=repeat_action_probability,
        max_num_frames_per_episode=max_episode_steps * 4,
        autoreset_mode="SameStep",
        noop_max=noop_max,
        frameskip=4,
        maxpool=True,
        use_fire_reset=True,
        img_height=210 if rgb_frames else 84,
        img_width=160 if rgb_frames else 84,
        grayscale=not rgb_frames,
        stack_num=1 if rgb_frames else 4,
        episodic_life=False,
        reward_clipping=False,
    )


class EpisodeStatistics:
    """Running score and length of the game each environment is playing."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def step(self, rewards: np.ndarray, game_over: np.ndarray) -> list[tuple[int, float, int]]:
        """Adds one step of unclipped rewards; returns (env index, return, length) of finished games."""
        self.returns += rewards
        self.lengths += 1
        finished = [(i, float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(game_over)]
        self.returns[game_over] = 0.0
        self.lengths[game_over] = 0
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
        # Normalized with the statistics of the whole job's minibatch, not of this process's share:
        # the averaged gradient is then the gradient one process would get on the whole minibatch.
        adv_mean, adv_std = global_mean_std(advantages)
        advantages = (advantages - adv_mean) / (adv_std + 1e-8)
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


# ---------------------------------------------------------------------------------------------
# Data parallel: the collective operations
# ---------------------------------------------------------------------------------------------
def collective(function):
    """A collective call, timed: --env-split measured (EnvSplitter) counts a process's work as its time without
    its collective calls, where it mostly waits for the slower processes."""

    @functools.wraps(function)
    def timed(*args, **kwargs):
        synchronize = torch.cuda.synchronize if EnvSplitter.cuda_sync else lambda: None
        synchronize()
        start = time.perf_counter()
        result = function(*args, **kwargs)
        synchronize()
        EnvSplitter.collective_seconds += time.perf_counter() - start
        return result

    return timed


@collective
def global_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation (unbiased, as `torch.std`) of the union of every rank's `x`: one
    all-reduce of each rank's (count, mean, sum of squared deviations), combined exactly (Chan et al.)
    in float64. Without a process group (or with one process) it is `x.mean(), x.std()`."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return x.mean(), x.std()
    x64 = x.detach().double()
    pieces = torch.zeros(dist.get_world_size(), 3, dtype=torch.float64, device=x.device)
    count = torch.tensor(x.numel(), dtype=torch.float64, device=x.device)
    pieces[dist.get_rank()] = torch.stack([count, x64.mean(), ((x64 - x64.mean()) ** 2).sum()])
    dist.all_reduce(pieces)
    counts, means, squares = pieces.unbind(1)
    mean = (counts * means).sum() / counts.sum()
    variance = (squares.sum() + (counts * (means - mean) ** 2).sum()) / (counts.sum() - 1)
    return mean.to(x.dtype), variance.sqrt().to(x.dtype)


@collective
def job_mean(x: torch.Tensor, weight: float) -> torch.Tensor:
    """The job's mean of a statistic each rank computed on its share: the sum over ranks of weight * x,
    `weight` the rank's fraction of the job's samples."""
    x = x * weight
    dist.all_reduce(x)
    return x


@collective
def average_gradients(agent: nn.Module, world_size: int, weight: float):
    """Replaces every gradient by the whole minibatch's: each rank's loss is a mean over its share, so that is
    the sum over ranks of weight * gradient, `weight` the rank's fraction of the minibatch. One all-reduce of
    one flat fp32 buffer (under bf16 autocast too): as fast as DistributedDataParallel, without its wrapper."""
    if world_size == 1:
        return
    grads = [p.grad for p in agent.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads]) * weight
    dist.all_reduce(flat)
    for grad, averaged in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(averaged.view(grad.shape))


@collective
def all_gathered(obj) -> list:
    """Every rank's `obj`, in rank order, on every rank (each node that keeps the run logs and saves it all)."""
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def main(args: Args):
    # torchrun gives each process its global RANK, its LOCAL_RANK on its node and the WORLD_SIZE;
    # a plain `python` run is a job of one process.
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    args.num_envs = args.local_num_envs * args.world_size if args.num_envs is None else args.num_envs
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
    check_args(args)  # alike on every rank: bad input stops them all before any collective call
    # Each rank draws its own actions and minibatches; the weights all come from rank 0 (below).
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = process_device(args, local_rank)
    if rank == 0:
        warn_if_bf16_is_slow(args.mixed_precision, device)
    keep_freed_memory()
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")

    if args.eval_checkpoint is not None and rank > 0:  # rank 0 alone plays the saved model's games
        return
    # The run is named after the game it plays: an evaluation's is the saved model's.
    env_id = load_model(args.eval_checkpoint, device)[1]["env_id"] if args.eval_checkpoint else args.env_id
    run_name = f"{env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    if args.eval_checkpoint is not None:  # no training: play the saved model's games
        writer = start_logging(args, run_name, None)
        run_evaluation(args, device, writer, run_name)
        writer.close()
        return
    backend = start_process_group(args, rank, device)
    check_same_arguments(args)
    # No filesystem need be shared: one process of each node's disk keeps the whole run there (its events and
    # checkpoints), so any node that outlives the others holds it, and a restart resumes from the newest.
    keeps_run = keeps_the_run_on_this_disk()
    checkpoint, run_name, run_lock = newest_checkpoint_of_the_job(args, run_name, keeps_run)
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    logging_args = args if rank == 0 else dataclasses.replace(args, track=False)  # one wandb run: rank 0's
    writer = start_logging(logging_args, run_name, checkpoint) if keeps_run else Silent()

    split = first_split(args, checkpoint, rank)  # the number of environments of each process
    envs = make_envs(args.env_id, split[rank], args.repeat_action_probability, args.max_episode_steps)
    agent = Agent(int(envs.single_action_space.n)).to(device).to(memory_format=torch.channels_last)
    # Fused: one kernel for all of Adam's arithmetic (2.8x faster than the per-tensor loop on CPU).
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    # The rollout's batch-of-8 forwards act with a copy of the agent whose conv body is stored in the
    # dtype it computes in. Under bf16, autocast would cast every weight at every forward, a third of a
    # rollout forward's time; the copy, refreshed once an iteration, gives the same numbers bit for bit.
    acting_agent = acting_copy(agent, torch.bfloat16) if args.mixed_precision == "bf16" else agent
    obs, actions, logprobs, rewards, dones, values = rollout_storage(args.num_steps, split[rank], device)

    start_iteration, global_step, env0_games, recent_returns = 0, 0, 0, deque(maxlen=20)
    if checkpoint is not None:
        agent.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        restore_random_streams(checkpoint["rng_states"], args, start_iteration, rank, device)
        env0_games = checkpoint["env0_games"]  # the games env 0 finished: videos go on numbering from there
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only
    for tensor in agent.state_dict().values():  # every rank starts from rank 0's weights, bit for bit
        dist.broadcast(tensor, src=0)

    env_offset, env_seed, next_obs, lives = reset_environments(envs, args, split, rank, start_iteration, device)
    episode_stats = EpisodeStatistics(split[rank])
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval) if rank == 0 else Silent()
    video = None
    if args.capture_video and rank == 0:
        video = VideoRecorder(f"videos/{run_name}", args.env_id, env_seed, args, env0_games)
    splitter = EnvSplitter(args, device) if args.env_split == "measured" else None
    describe_job(args, split, rank, device, backend, env_seed)
    start_time, start_global_step, sps, games_played = time.time(), global_step, 0, 0

    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        finished_games = []  # (global step, return, length) of this rank's games
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

            action = action.cpu().numpy()
            next_obs_np, reward, terminated, truncated, info = envs.step(action)
            game_over = terminated | truncated
            # Episodic life: losing a life ends the learning episode (the game goes on), which makes
            # the cost of losing a life visible to the agent.
            life_lost = info["lives"] < lives
            lives = info["lives"].copy()
            clipped_reward = np.sign(reward).astype(np.float32)
            if truncated.any():
                # A time limit is not a death: bootstrap from the value of the real last observation,
                # which SAME_STEP autoreset keeps in info["final_obs"].
                with torch.inference_mode():
                    final_values = acting_agent.get_value(torch.from_numpy(info["final_obs"]).to(device)).flatten()
                bootstrap = args.gamma * final_values.cpu().numpy() * (truncated & ~terminated)
                clipped_reward = clipped_reward + bootstrap.astype(np.float32)
            rewards[step] = torch.from_numpy(clipped_reward).to(device)
            dones[step] = torch.from_numpy(game_over | life_lost).to(device)
            next_obs = torch.from_numpy(next_obs_np).to(device)

            if video is not None:
                video.step(action[0])
            env0_games += bool(game_over[0])
            # The env steps of one vector step count as consecutive global steps, env 0 first, so
            # every game is logged at a step of its own (env_offset + i: env i's index in the job).
            for i, episodic_return, episodic_length in episode_stats.step(reward, game_over):
                finished_games.append(
                    (global_step - args.num_envs + env_offset + i + 1, episodic_return, episodic_length)
                )

        # The games of the whole job: every rank's finished games, logged by every node that keeps the run.
        games_played += len(finished_games)
        for game_step, episodic_return, episodic_length in sorted(sum(all_gathered(finished_games), [])):
            recent_returns.append(episodic_return)
            writer.add_scalar("charts/episodic_return", episodic_return, game_step)
            writer.add_scalar("charts/episodic_length", episodic_length, game_step)

        with torch.inference_mode():
            next_value = acting_agent.get_value(next_obs).flatten()
        advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs = obs.reshape((-1, 4, 84, 84))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Each process cuts its rollout into num_minibatches shares: with unequal rollouts the shares differ
        # in size, and this process's gradient and statistics count by its fraction of the samples.
        share, local_batch_size = split[rank] / args.num_envs, split[rank] * args.num_steps
        local_minibatch_size = local_batch_size // args.num_minibatches
        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(local_batch_size, device=device)
            for start in range(0, local_batch_size, local_minibatch_size):
                mb_inds = b_inds[start : start + local_minibatch_size]
                mb_obs = torch.index_select(b_obs, 0, mb_inds)  # 4x faster than b_obs[mb_inds] on CPU
                with autocast:
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(mb_obs, b_actions[mb_inds])
                old = b_logprobs[mb_inds], b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds]
                loss, stats = ppo_loss(newlogprob, entropy, newvalue, *old, args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                average_gradients(agent, args.world_size, share)
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            # Decided on the job's KL, alike on every rank: none stops alone, leaving the others in an all-reduce.
            if args.target_kl is not None and job_mean(stats["approx_kl"], share) > args.target_kl:
                break

        # The logged figures are the job's: statistics averaged over ranks, explained variance of all values.
        var_y = global_mean_std(b_returns)[1].item() ** 2
        explained_var = np.nan if var_y == 0 else 1 - global_mean_std(b_returns - b_values)[1].item() ** 2 / var_y
        stats["clipfrac"] = torch.stack(clipfracs).mean()  # over the whole update; the others: its last minibatch
        stats = dict(zip(stats, job_mean(torch.stack(list(stats.values())), share)))

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        for name, value in stats.items():
            writer.add_scalar(f"losses/{name}", value.item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        writer.add_scalar("charts/world_size", args.world_size, global_step)
        for r, envs_of_r in enumerate(split):
            writer.add_scalar(f"charts/local_num_envs/rank_{r}", envs_of_r, global_step)
        progress.show(global_step, sps, recent_returns)

        if splitter is not None and (new_split := splitter.next_split(split, iteration, rank)) != split:
            # The processes start new environments for the new split; their games in progress are not logged.
            split = new_split
            envs.close()
            envs = make_envs(args.env_id, split[rank], args.repeat_action_probability, args.max_episode_steps)
            env_offset, env_seed, next_obs, lives = reset_environments(envs, args, split, rank, iteration, device)
            episode_stats = EpisodeStatistics(split[rank])
            obs, actions, logprobs, rewards, dones, values = rollout_storage(args.num_steps, split[rank], device)
            if video is not None:  # env 0 of rank 0 plays a new game: so must its shadow
                video.close()
                video = VideoRecorder(f"videos/{run_name}", args.env_id, env_seed, args, env0_games)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            writer.flush()  # everything up to this checkpoint is on disk before it counts
            state = dict(model=agent.state_dict(), optimizer=optimizer.state_dict(), iteration=iteration)
            state.update(global_step=global_step, env0_games=env0_games, recent_returns=list(recent_returns))
            state.update(env_split=split, rng_states=all_gathered(random_streams()))  # every rank's own streams
            if keeps_run:
                save_checkpoint(checkpoint_folder, f"iteration-{iteration:07d}.pt", state, args, run_name)

    if rank == 0:
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        print(
            f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
            f"mean return of the last {len(recent_returns)} games {recent}"
        )
    envs.close()
    if video is not None:
        video.close()
    # Every rank must end with the same weights: a difference is a bug in the synchronisation.
    digests = [None] * args.world_size
    dist.all_gather_object(digests, parameter_digest(agent))
    print(f"rank {rank}: played {games_played} games, parameters sha256 {digests[rank]}\n", end="", flush=True)
    if len(set(digests)) > 1:
        raise RuntimeError(f"the ranks ended with different weights: {digests}")
    if args.save_model and rank == 0:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_model(model_path, agent, args)
        print(f"model saved to {model_path}")
        run_evaluation(args, device, writer, run_name, agent)
    writer.close()
    if run_lock is not None:
        run_lock.close()


# =============================================================================================
# Scale-out: the processes of the job, and how they share its environments
# =============================================================================================
def process_device(args: Args, local_rank: int) -> torch.device:
    """This process's GPU (cuda:LOCAL_RANK, or the LOCAL_RANK-th of --device-ids), or the CPU."""
    if not (torch.cuda.is_available() and args.cuda):
        return torch.device("cpu")
    gpus = list(range(torch.cuda.device_count())) if args.device_ids is None else args.device_ids
    if local_rank >= len(gpus) or not 0 <= gpus[local_rank] < torch.cuda.device_count():
        gpus_here = f"this node has {torch.cuda.device_count()} GPUs"
        fail(f"(rank {os.environ.get('RANK', 0)}) LOCAL_RANK {local_rank} has no GPU: {gpus_here} (see --device-ids)")
    torch.cuda.set_device(gpus[local_rank])
    return torch.device("cuda", gpus[local_rank])


def start_process_group(args: Args, rank: int, device: torch.device) -> str:
    """Joins this process to the job's process group; returns the backend. (torch.distributed.nn is
    imported at the top: imported later, it would hold the group past destroy_process_group.)"""
    if args.backend not in ("auto", "nccl", "gloo"):
        fail(f"unknown backend {args.backend!r}: use auto, nccl or gloo")
    backend = args.backend if args.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        fail("--backend nccl needs a GPU in every process: use --backend gloo (or auto)")
    # gloo's default would leave the job waiting 30 minutes on a peer that is gone or cut off.
    timeout = datetime.timedelta(seconds=args.collective_timeout)
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent hosts the store and keeps it when it restarts the workers (--max-restarts):
        # each attempt gets keys of its own, or the new workers would dial the old workers' sockets.
        agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        attempt_store = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", agent_store)
        dist.init_process_group(backend, store=attempt_store, rank=rank, world_size=args.world_size, timeout=timeout)
    elif "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend, timeout=timeout)  # MASTER_ADDR and MASTER_PORT: a store of this job's own
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return backend


def check_same_arguments(args: Args):
    """Every process must run the job's arguments. A node typed with another --ent-coef or --seed would mix
    two losses into one gradient, or other env seeds into the job, and run to the end; another --total-timesteps
    or --checkpoint-every would leave the processes waiting on different collective calls. Compared on every
    rank, so all stop with the same error. Which GPUs a node uses is its own (--cuda, --device-ids), and
    --local-num-envs counts through --num-envs."""
    own = {name: value for name, value in vars(args).items() if name not in ("cuda", "device_ids", "local_num_envs")}
    everyone = [None] * args.world_size
    dist.all_gather_object(everyone, own)
    for rank, theirs in enumerate(everyone):
        for name, value in everyone[0].items():
            if theirs.get(name) != value:
                flag = f"--{name.replace('_', '-')}"
                fail(f"rank {rank} runs with {flag} {theirs.get(name)!r}, rank 0 with {value!r}: run one command")


def keeps_the_run_on_this_disk() -> bool:
    """Whether this process keeps the run (TensorBoard events, checkpoints) on its node's disk: rank 0, and one
    process of each node whose disk rank 0 does not see. On a cluster whose nodes have disks of their own, every
    node then holds the whole run; on one machine or a shared filesystem, rank 0 alone writes it. Decided by who
    creates a marker file in runs/ first: rank 0, then the others at once (one wins per disk)."""
    token = all_gathered(secrets.token_hex(8))[0]  # rank 0's: one marker name for the whole job
    marker, mine, error = os.path.join("runs", f".disk-of-job-{token}"), False, None
    for turn in ("rank 0", "the others"):
        if (dist.get_rank() == 0) == (turn == "rank 0"):
            try:
                os.makedirs("runs", exist_ok=True)
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                mine = True
            except OSError as e:  # the marker is there already (rank 0 sees this disk), or the disk cannot be written
                if not (isinstance(e, FileExistsError) and e.filename == marker):
                    error = f"{socket.gethostname()}: cannot write the run to {os.path.abspath('runs')}: {e.strerror}"
        dist.barrier()
    if mine:
        os.remove(marker)
    if errors := [e for e in all_gathered(error) if e is not None]:
        fail(errors[0])
    return mine


def newest_checkpoint_of_the_job(args: Args, run_name: str, keeps_run: bool):
    """The checkpoint the job resumes from and the run's name, the same on every rank; this disk's lock of the
    run. --resume PATH is rank 0's file; --resume auto, the checkpoint with the most steps that any node holds:
    each node that keeps the run looks on its own disk, and the holder of the newest sends it, with the run's
    TensorBoard events, to the nodes that lack it, so that every node holds the whole run again. A user error
    found on any node stops every rank."""
    checkpoint, error = None, None
    if keeps_run and args.resume is not None and (args.resume == "auto" or dist.get_rank() == 0):
        try:
            checkpoint = load_checkpoint(args.resume, args)
        except SystemExit as user_error:
            error = f"{socket.gethostname()}: {user_error.code}"
    found = all_gathered((checkpoint["global_step"] if checkpoint else -1, error))
    if errors := [e for _, e in found if e is not None]:
        fail(errors[0])
    steps = [global_step for global_step, _ in found]
    holder = steps.index(max(steps))  # the lowest rank among the holders of the most steps
    run_files = {}
    if dist.get_rank() == holder and checkpoint is not None:
        events = glob.glob(f"runs/{glob.escape(checkpoint['run_name'])}/*.tfevents.*")
        run_files = {path: Path(path).read_bytes() for path in events}
    shared = [(checkpoint, run_files, run_name)]
    dist.broadcast_object_list(shared, src=holder)
    checkpoint, run_files, run_name = shared[0]
    run_name = checkpoint["run_name"] if checkpoint else run_name  # a resumed run goes on in its own folder
    run_lock = lock_run(f"runs/{run_name}/checkpoints") if keeps_run and (args.checkpoint_every or checkpoint) else None
    if keeps_run and checkpoint is not None and steps[dist.get_rank()] < steps[holder]:
        for stale in glob.glob(f"runs/{glob.escape(run_name)}/*.tfevents.*"):
            os.remove(stale)  # this node's part of the run, older than the holder's whole
        for path, data in run_files.items():
            Path(path).write_bytes(data)
        name = f"iteration-{checkpoint['iteration']:07d}.pt"
        save_checkpoint(f"runs/{run_name}/checkpoints", name, dict(checkpoint), args, run_name)
    if checkpoint is not None and dist.get_rank() == 0:
        print(f"the job resumes at step {checkpoint['global_step']:,}, from rank {holder}'s node: the newest")
    return checkpoint, run_name, run_lock


def random_streams() -> dict:
    """This process's random-number states (a checkpoint holds every rank's)."""
    return {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state() if torch.cuda.is_initialized() else None}


def restore_random_streams(streams: list[dict], args: Args, iteration: int, rank: int, device: torch.device):
    """Each rank goes on with its own random streams; on another world size the old ranks' streams do not
    map onto the new ones, and each rank starts a fresh stream of its own. Its seed mixes the run's seed, the
    iteration and the rank: a sum such as seed + iteration * world_size + rank would hand a rank the stream
    another rank started with (seed + rank) or had at an earlier resume."""
    if len(streams) != args.world_size:
        torch.manual_seed(int(np.random.SeedSequence([args.seed, iteration, rank]).generate_state(1)[0]))
        return
    torch.set_rng_state(streams[rank]["torch"])
    if device.type == "cuda" and streams[rank]["cuda"] is not None:
        torch.cuda.set_rng_state(streams[rank]["cuda"], device)


def reset_environments(envs, args: Args, split: list[int], rank: int, iteration: int, device):
    """Starts new games in this process's share of the job's environments; returns the job's index of its first
    environment, its seed, the first observations and lives. Environment i of the job gets seed + iteration *
    num_envs + i: environments started later (by a resume or a new split) play on seeds the run has not used."""
    env_offset = sum(split[:rank])
    env_seed = args.seed + iteration * args.num_envs + env_offset
    next_obs, info = envs.reset(seed=env_seed)
    return env_offset, env_seed, torch.from_numpy(next_obs).to(device), info["lives"].copy()


def rollout_storage(num_steps: int, num_envs: int, device) -> tuple[torch.Tensor, ...]:
    """obs, actions, logprobs, rewards, dones, values of one rollout. Observations stay uint8: 4x less memory
    and copying than float."""
    obs = torch.zeros((num_steps, num_envs, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long, device=device)
    return obs, actions, *(torch.zeros((num_steps, num_envs), device=device) for _ in range(4))


class Silent:
    """The writer and progress lines of ranks > 0: rank 0 alone logs the job."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def describe_job(args: Args, split: list[int], rank: int, device, backend: str, env_seed: int):
    if rank == 0:
        sizes = [f"{args.num_envs} envs", f"batch {args.batch_size}", f"minibatch {args.minibatch_size}"]
        factors = [(1, 1), (args.num_steps, 1), (args.num_steps, args.num_minibatches)]
        shares = [per_process(split, factor, divisor) for factor, divisor in factors]
        job = ", ".join(f"{size} ({share} per process)" for size, share in zip(sizes, shares))
        print(f"world size {args.world_size}: {job}, {args.num_iterations} iterations", flush=True)
    # One write with its newline: the ranks share the output, and another rank's line could come between the two.
    seeds = f"env seeds {env_seed}..{env_seed + split[rank] - 1}"
    about = f"pid {os.getpid()}, {device}, {backend}, {torch.get_num_threads()} threads, {seeds}"
    print(f"rank {rank}/{args.world_size}: {about}\n", end="", flush=True)


def split_granularity(num_steps: int, num_minibatches: int) -> int:
    """The fewest environments whose rollout divides into the minibatches: each process's share is a multiple of it."""
    return num_minibatches // math.gcd(num_steps, num_minibatches)


def resumable_world_sizes(num_envs: int, num_steps: int, num_minibatches: int, env_split: str = "even") -> list[int]:
    """The world sizes that can run a job of `num_envs` environments: those that split them into per-process
    rollouts that the minibatches divide (evenly, or under --env-split measured in multiples of the granularity)."""
    granularity = split_granularity(num_steps, num_minibatches)
    if env_split == "measured":
        return list(range(1, num_envs // granularity + 1)) if num_envs % granularity == 0 else []
    return [w for w in range(1, num_envs + 1) if num_envs % w == 0 and (num_envs // w) % granularity == 0]


def in_words(world_sizes: list[int]) -> str:
    """[1, 2, 4] -> '1, 2 or 4 processes'; [1, 2, 3, 4] -> '1 to 4 processes'."""
    if len(world_sizes) > 2 and world_sizes == list(range(world_sizes[0], world_sizes[-1] + 1)):
        return f"{world_sizes[0]} to {world_sizes[-1]} processes"
    numbers = ", ".join(map(str, world_sizes[:-1])) + " or " if len(world_sizes) > 1 else ""
    return f"{numbers}{world_sizes[-1]} process{'es' if world_sizes != [1] else ''}"


def per_process(split: list[int], factor: int = 1, divisor: int = 1) -> str:
    """[2, 2] -> '2'; [3, 1] -> '3 + 1'; each times factor, over divisor."""
    sizes = [envs * factor // divisor for envs in split]
    return str(sizes[0]) if len(set(sizes)) == 1 else " + ".join(map(str, sizes))


def first_split(args: Args, checkpoint: dict | None, rank: int) -> list[int]:
    """The environments of each process at the start: even (under --env-split measured, which then measures, as
    even as multiples of the granularity allow); a resumed measured run on its world size keeps its split."""
    granularity = split_granularity(args.num_steps, args.num_minibatches)
    if args.env_split == "even":
        granularity = args.num_envs // args.world_size
    split = balanced_split(args.num_envs, [1.0] * args.world_size, granularity)
    saved = checkpoint["env_split"] if checkpoint is not None else split
    if args.env_split == "measured" and len(saved) == args.world_size:
        split = saved
    if rank == 0 and split != saved:
        before = (
            f"the run's {args.num_envs} environments ({per_process(saved)} per process on {in_words([len(saved)])})"
        )
        print(f"{before} are split over {in_words([args.world_size])}: {per_process(split)} per process")
    return split


def balanced_split(num_envs: int, seconds_per_env: list[float], granularity: int) -> list[int]:
    """Environments per process for processes whose iteration takes `seconds_per_env` per environment: the
    split whose slowest process finishes first. One share (of `granularity` environments) each, then every
    further share to the process that would finish it soonest."""
    split = [granularity] * len(seconds_per_env)
    for _ in range(num_envs // granularity - len(split)):
        soonest = min(range(len(split)), key=lambda rank: (split[rank] + granularity) * seconds_per_env[rank])
        split[soonest] += granularity
    return split


def iteration_seconds(split: list[int], seconds_per_env: list[float]) -> float:
    """The job's iteration time for a split: that of its slowest process (every process waits for it)."""
    return max(envs * seconds for envs, seconds in zip(split, seconds_per_env))


class EnvSplitter:
    """--env-split measured: measures this process's busy seconds per environment and iteration (its time less
    its time in collective calls, where it waits for the others) over --split-every iterations, each window
    after one of warm-up (start-up, new batch shapes); then moves environments to the faster processes if
    that is predicted to shorten the job's iteration by more than --split-threshold (noise does not flap it)."""

    collective_seconds, cuda_sync = 0.0, False  # cuda_sync: on a GPU, whose calls return before they have run

    def __init__(self, args: Args, device: torch.device):
        self.args, self.busy_seconds, self.measured, self.warming_up = args, 0.0, 0, True
        EnvSplitter.cuda_sync = device.type == "cuda"
        self.clock = (time.perf_counter(), EnvSplitter.collective_seconds)

    def next_split(self, split: list[int], iteration: int, rank: int) -> list[int]:
        if not self.warming_up:
            self.busy_seconds += time.perf_counter() - self.clock[0] - (EnvSplitter.collective_seconds - self.clock[1])
            self.measured += 1
        self.warming_up = False
        # No new split after the last iteration: none would use it, and the final checkpoint keeps the last one.
        if self.measured == self.args.split_every and iteration < self.args.num_iterations:
            seconds = [None] * self.args.world_size
            dist.all_gather_object(seconds, self.busy_seconds / self.measured / split[rank])
            self.busy_seconds, self.measured = 0.0, 0
            granularity = split_granularity(self.args.num_steps, self.args.num_minibatches)
            balanced = balanced_split(self.args.num_envs, seconds, granularity)
            before, after = iteration_seconds(split, seconds), iteration_seconds(balanced, seconds)
            if after < (1 - self.args.split_threshold) * before:
                if rank == 0:
                    measured = " / ".join(f"{1000 * s:.0f}" for s in seconds) + " ms per env and iteration"
                    moved = f"env split {per_process(split)} -> {per_process(balanced)} per process"
                    predicted = f"predicted iteration {before:.2f} s -> {after:.2f} s"
                    print(f"iteration {iteration}: {moved}: measured {measured}, {predicted}", flush=True)
                split, self.warming_up = balanced, True
        self.clock = (time.perf_counter(), EnvSplitter.collective_seconds)
        return split


def parameter_digest(agent: nn.Module) -> str:
    """A hash of the weights' bytes: equal digests mean bit-identical weights."""
    weights = b"".join(tensor.detach().cpu().numpy().tobytes() for tensor in agent.state_dict().values())
    return hashlib.sha256(weights).hexdigest()[:16]


def exit_with_user_error(error: SystemExit):
    """A user error (`fail`) ends every rank: rank 0 prints its one line (a rank prints what only it found, the
    lines that start with its rank), the others exit quietly; under torchrun the line is the root cause of its
    failure report (torch's `record` lets SystemExit pass unrecorded)."""
    message, path = error.code, os.environ.get("TORCHELASTIC_ERROR_FILE")
    if isinstance(message, str) and path is not None:
        with open(path, "w") as f:
            extra = {"py_callstack": message, "timestamp": str(int(time.time()))}  # the report shows py_callstack
            json.dump({"message": {"message": message, "extraInfo": extra}}, f)
    if isinstance(message, str) and os.environ.get("RANK", "0") != "0" and not message.startswith("error: (rank"):
        sys.exit(1)
    raise error


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
    counts = (args.num_envs, args.local_num_envs, args.num_steps, args.num_minibatches, args.update_epochs)
    if min(*counts, args.eval_episodes, args.split_every) < 1:
        fail(
            "--num-envs, --local-num-envs, --num-steps, --num-minibatches, --update-epochs, --eval-episodes and "
            "--split-every must be positive"
        )
    if not 0 <= args.split_threshold < 1:
        fail(f"--split-threshold {args.split_threshold} must be at least 0 and below 1")
    # Each process cuts its own rollout into the minibatches: all run the same number of them.
    world_sizes = resumable_world_sizes(args.num_envs, args.num_steps, args.num_minibatches, args.env_split)
    if args.world_size not in world_sizes:
        fix = (
            f"run on {in_words(world_sizes)}" if world_sizes else "change --num-envs, --num-steps or --num-minibatches"
        )
        fail(
            f"{args.num_envs} envs x {args.num_steps} steps cannot be split over {in_words([args.world_size])} into "
            f"rollouts of {args.num_minibatches} whole minibatches: {fix}"
        )
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    if args.max_episode_steps < 1:
        fail(f"--max-episode-steps must be positive, got {args.max_episode_steps}")
    if args.max_episode_steps >= 2**29:  # the emulator counts a game's frames, 4 a step, in 32 bits
        fail(
            f"--max-episode-steps {args.max_episode_steps:,} overflows the emulator's frame counter: at most 2**29 - 1"
        )
    atari_game(args.env_id)  # an unknown env id fails here, before anything is written
    if args.eval_checkpoint is None and args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} steps)")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}")
    if not args.collective_timeout > 0:
        fail(f"--collective-timeout must be positive seconds, got {args.collective_timeout}")


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
        self.shadow = make_envs(env_id, 1, sticky, time_limit, rgb_frames=True)  # this script
        screen, _ = self.shadow.reset(seed=seed)  # this script
        self.start_game(screen[0, -1])  # this script

    def start_game(self, screen):
        if self.schedule(self.game):
            import imageio_ffmpeg  # imported here: only video runs pay for it

            self.path = os.path.join(self.folder, f"game-{self.game}.mp4")
            self.ffmpeg = imageio_ffmpeg.write_frames(self.path, (160, 210), fps=30, macro_block_size=1)
            self.ffmpeg.send(None)  # starts ffmpeg
            self.ffmpeg.send(np.ascontiguousarray(screen))

    def step(self, action_env0: int):
        screen, _, terminated, truncated, info = self.shadow.step(np.array([action_env0]))
        game_over = terminated[0] or truncated[0]  # this script
        shown = info["final_obs"][0, -1] if game_over else screen[0, -1]  # this script: the screen this step showed
        if self.ffmpeg is not None and shown is not None:
            self.ffmpeg.send(np.ascontiguousarray(shown))
        if game_over:
            self.end_video()
            self.game += 1
            self.start_game(screen[0, -1])  # this script

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
    envs = make_envs(env_id, num_envs, args.repeat_action_probability, args.max_episode_steps)  # this script
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")  # this script
    video = (
        VideoRecorder(video_folder, env_id, seed, args, schedule=lambda game: game < quota[0]) if video_folder else None
    )
    stats, returns = EpisodeStatistics(num_envs), [[] for _ in range(num_envs)]
    obs, _ = envs.reset(seed=seed)  # this script
    while any(len(r) < q for r, q in zip(returns, quota)):
        with torch.inference_mode(), autocast:  # this script
            action = agent.get_action_and_value(torch.from_numpy(obs).to(device))[0].cpu().numpy()  # this script
        obs, reward, terminated, truncated, info = envs.step(action)
        if video is not None:
            video.step(action[0])
        for i, episodic_return, _ in stats.step(reward, terminated | truncated):  # this script
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
RESUMABLE_CHANGES |= {"cuda", "backend", "device_ids", "world_size", "local_num_envs"}  # this script: where
RESUMABLE_CHANGES |= {"env_split", "split_every", "split_threshold", "collective_timeout"}  # this script: how


def save_checkpoint(folder: str, name: str, state: dict, args: Args, run_name: str, keep: int = 2):
    """Writes `state`, the random streams, the arguments and the script's SHA-256 to `folder/name`: to a
    temporary file, synced and renamed, so a crash leaves the previous checkpoint or this one, never half
    a file. The newest `keep` checkpoints are kept."""
    path = os.path.join(folder, name)
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
    try:
        record(main)(tyro.cli(Args))  # under torchrun, a crash's traceback goes to torchrun's failure report
    except SystemExit as error:
        exit_with_user_error(error)
    finally:  # on success and on error alike
        if dist.is_initialized():
            dist.destroy_process_group()
