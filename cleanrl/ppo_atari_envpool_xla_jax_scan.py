"""PPO on Atari with envpool's XLA interface and JAX (flax + optax), one file.

The PPO of `ppo_atari_envpool.py` (Nature CNN, envpool's Atari preprocessing with episodic life and
reward clipping, reset steps kept out of the update, truncations bootstrapped), written in JAX.
envpool's XLA interface puts the environment steps inside the compiled rollout: one `jax.lax.scan`
plays all the steps of an iteration; GAE is a reverse scan; all epochs and minibatches of the update
are one compiled `lax.scan`. Data parallel over all local devices (shard_map), each with its own
envpool, and over several hosts with `jax.distributed`. Beside the algorithm: bf16, checkpoints and
resume (on the same or another number of devices), videos, and evaluation of a saved model.
Docs: docs/ppo_atari_envpool_xla_jax_scan.md
"""

import fcntl
import glob
import hashlib
import os
import queue
import re
import secrets
import socket
import sys
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, NamedTuple

import envpool
import flax.linen as nn
import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import optax
import tyro
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # Experiment
    exp_name: str = os.path.basename(__file__)[: -len(".py")]
    """the name of this experiment"""
    seed: int = 1
    """seed of the experiment (environment i of the job gets seed + i)"""
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
    """bf16 computes the network body in bfloat16; heads, parameters, gradients, loss and optimizer stay fp32"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""
    checkpoint_every: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never)"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest of this env_id, exp_name and seed"""

    # Environment
    env_id: str = "Breakout-v5"
    """the game: `Breakout-v5`, `ALE/Breakout-v5` and `BreakoutNoFrameskip-v4` all name Breakout"""
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
    """the number of parallel game environments of the job, split evenly over its devices"""
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

    # Scale-out
    coordinator_address: str | None = None
    """multi-host: `host:port` of process 0 (default: $JAX_COORDINATOR_ADDRESS, Slurm's under srun; else one host)"""
    num_processes: int | None = None
    """multi-host: the number of processes (default: $JAX_NUM_PROCESSES, or cluster detection)"""
    process_id: int | None = None
    """multi-host: the index of this process (default: $JAX_PROCESS_ID, or cluster detection)"""
    join_timeout: int = 300
    """multi-host: seconds a process waits for the coordinator and the others to join, then stops"""
    heartbeat_timeout: int = 100
    """multi-host: seconds without a word from a process (a cut link) before the job counts it lost and stops"""

    # Computed at run time (hidden from the command line: a value given there would be overwritten)
    num_devices: tyro.conf.Suppress[int] = 0
    """the number of devices of the job (all hosts)"""
    local_num_envs: tyro.conf.Suppress[int] = 0
    """the number of environments of each device (num_envs // num_devices)"""
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size (num_envs * num_steps)"""
    local_batch_size: tyro.conf.Suppress[int] = 0
    """each device's share of the batch (local_num_envs * num_steps)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size (batch_size // num_minibatches)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (total_timesteps // batch_size)"""


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def envpool_task(env_id: str) -> str:
    """Maps `Breakout-v5`, `ALE/Breakout-v5` or `BreakoutNoFrameskip-v4` to envpool's task id `Breakout-v5`."""
    task_id = env_id.removeprefix("ALE/")
    if task_id.endswith("NoFrameskip-v4"):
        task_id = task_id[: -len("NoFrameskip-v4")] + "-v5"
    # envpool also registers non-Atari `-v5` tasks (MuJoCo's Ant-v5...): only an Atari spec will do.
    if task_id not in envpool.list_all_envs() or not isinstance(envpool.make_spec(task_id), envpool.atari.AtariEnvSpec):
        fail(f"unknown Atari env id {env_id!r} (try Breakout-v5, ALE/Breakout-v5 or BreakoutNoFrameskip-v4)")
    return task_id


def make_envs(
    env_id, num_envs, repeat_action_probability, seed, max_episode_steps=27_000, num_threads=None, rgb_frames=False
):
    # Environment i is seeded with seed + i. Synchronous (batch_size = num_envs): each step returns
    # every environment in order, which the compiled rollout needs. episodic_life: a lost life ends
    # the learning episode (terminated) but the game goes on with its remaining lives; FIRE is pressed
    # on the reset step after it; info["terminated"] marks the real game over. reward_clip: the reward
    # is sign(reward), info["reward"] the raw one. rgb_frames: the same games (no frame setting touches
    # the emulator or its random numbers) as full 210x160 RGB screens, for videos.
    frames = dict(img_height=84, img_width=84, gray_scale=True, stack_num=4)
    if rgb_frames:
        frames = dict(img_height=210, img_width=160, gray_scale=False, stack_num=1)
    return envpool.make(
        envpool_task(env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        num_threads=num_threads or min(num_envs, os.cpu_count() or 1),
        seed=seed,
        max_episode_steps=max_episode_steps,
        repeat_action_probability=repeat_action_probability,
        noop_max=30,
        frame_skip=4,
        use_fire_reset=True,
        episodic_life=True,
        reward_clip=True,
        **frames,
    )


class EpisodeStatistics(NamedTuple):
    """Running score and length of the game each environment is playing."""

    returns: jax.Array  # (num_envs,) float32: unclipped score so far
    lengths: jax.Array  # (num_envs,) int32: steps played so far


def update_episode_statistics(stats: EpisodeStatistics, raw_reward, game_over, played):
    """Adds one step; returns the new statistics and (game_over, return, length) of this step. A game
    ends at a real game over or at the time limit. The length counts the steps whose action was played
    (envpool's `elapsed_step`), not the reset steps, whose action is ignored."""
    returns = stats.returns + raw_reward
    lengths = stats.lengths + played.astype(jnp.int32)
    finished = (game_over, returns, lengths)
    return EpisodeStatistics(jnp.where(game_over, 0.0, returns), jnp.where(game_over, 0, lengths)), finished


class EnvState(NamedTuple):
    """What the rollout carries from one step to the next, for one device's envpool."""

    handle: jax.Array  # envpool's XLA handle: threading it orders the env steps
    obs: jax.Array  # (num_envs, 4, 84, 84) uint8: the observation to act on
    reset_next: jax.Array  # (num_envs,) bool: the last step ended an episode, so the next is a reset step
    episode: EpisodeStatistics
    lives: jax.Array  # (num_envs,) int32: each game's lives before the next step


def start_envs(envs) -> tuple[EnvState, Any]:
    """The first state of an envpool's compiled rollout, and its XLA step."""
    handle, _, _, env_step = envs.xla()
    obs, info = envs.reset()
    n = len(obs)
    episode = EpisodeStatistics(np.zeros(n, np.float32), np.zeros(n, np.int32))
    return EnvState(handle, obs, np.zeros(n, bool), episode, info["lives"]), env_step


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
def layer_init(std=np.sqrt(2), bias_const=0.0) -> dict:
    """Orthogonal weights of gain `std` and constant biases: the torch scripts' initialization."""
    return dict(kernel_init=nn.initializers.orthogonal(std), bias_init=nn.initializers.constant(bias_const))


# XLA:CPU computes a convolution inside a compiled loop very slowly: one minibatch step of the compiled
# update took 8.5 s with XLA's convolutions and 0.24 s with the same convolutions as matrix products of
# image patches ("im2col", the Conv below) on the 2-core CPU. False: XLA's convolution everywhere.
# Other backends always use XLA's (cuDNN on GPU).
PATCH_CONVOLUTIONS_ON_CPU = True


class Conv(nn.Module):
    """nn.Conv(features, (k, k), strides=(s, s), padding="VALID"): the same parameters and function,
    computed with `im2col` (default: PATCH_CONVOLUTIONS_ON_CPU on CPU) as one matrix product of the
    image patches, otherwise with XLA's convolution."""

    features: int
    kernel_size: int
    stride: int
    dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros
    im2col: bool | None = None

    @nn.compact
    def __call__(self, x):  # x: (batch, height, width, channels)
        k, s, channels = self.kernel_size, self.stride, x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (k, k, channels, self.features))
        bias = self.param("bias", self.bias_init, (self.features,))
        x, kernel, bias = x.astype(self.dtype), kernel.astype(self.dtype), bias.astype(self.dtype)
        im2col = PATCH_CONVOLUTIONS_ON_CPU and jax.default_backend() == "cpu" if self.im2col is None else self.im2col
        if not im2col:
            y = jax.lax.conv_general_dilated(x, kernel, (s, s), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return y + bias
        # patches[..., (i * k + j) * channels + c] = x[:, s * row + i, s * col + j, c]: the kernel's order
        rows, cols = x.shape[1] - k + 1, x.shape[2] - k + 1  # the windows start at every s-th of them
        windows = [x[:, i : i + rows : s, j : j + cols : s] for i in range(k) for j in range(k)]
        patches = jnp.concatenate(windows, axis=-1)
        return patches @ kernel.reshape(k * k * channels, self.features) + bias


class Agent(nn.Module):
    num_actions: int
    dtype: Any = jnp.float32  # the compute dtype; parameters are always fp32

    def setup(self):
        self.network = nn.Sequential(
            [
                Conv(32, 8, 4, dtype=self.dtype, **layer_init()),
                nn.relu,
                Conv(64, 4, 2, dtype=self.dtype, **layer_init()),
                nn.relu,
                Conv(64, 3, 1, dtype=self.dtype, **layer_init()),
                nn.relu,
                lambda x: x.reshape(x.shape[0], -1),
                nn.Dense(512, dtype=self.dtype, **layer_init()),
                nn.relu,
            ]
        )
        self.actor = nn.Dense(self.num_actions, dtype=jnp.float32, **layer_init(0.01))
        self.critic = nn.Dense(1, dtype=jnp.float32, **layer_init(1.0))

    def hidden(self, obs):
        # obs: (batch, 4, 84, 84) uint8 from envpool; flax convolutions are channels-last.
        x = jnp.transpose(obs, (0, 2, 3, 1)).astype(self.dtype) / 255.0
        return self.network(x)

    def heads(self, hidden):
        # The heads compute in fp32 even under bf16: values and log-probabilities feed GAE, value
        # clipping and the probability ratio, where bf16's 3 significant digits would show.
        hidden = hidden.astype(jnp.float32)
        return self.actor(hidden), self.critic(hidden)[:, 0]

    def get_value(self, obs):
        return self.heads(self.hidden(obs))[1]

    def get_action_and_value(self, obs, key=None, action=None):
        logits, value = self.heads(self.hidden(obs))
        if action is None:
            action = jax.random.categorical(key, logits)  # Gumbel-max sampling
        logprobs = jax.nn.log_softmax(logits)
        logprob = jnp.take_along_axis(logprobs, action[:, None], axis=1)[:, 0]
        entropy = -(jnp.exp(logprobs) * logprobs).sum(-1)
        return action, logprob, entropy, value


@partial(jax.jit, static_argnums=0)
def init_params(agent: Agent, key):
    return agent.init(key, jnp.zeros((1, 4, 84, 84), jnp.uint8), key, method=Agent.get_action_and_value)


def compute_dtype(args: Args):
    return jnp.bfloat16 if args.mixed_precision == "bf16" else jnp.float32


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
class Transitions(NamedTuple):
    """One rollout: every field is (num_steps, num_envs, ...)."""

    obs: jax.Array
    actions: jax.Array
    logprobs: jax.Array
    values: jax.Array
    rewards: jax.Array  # clipped: what the agent learns from
    dones: jax.Array  # the step ended the learning episode: a lost life, a game over or the time limit
    truncations: jax.Array  # the time limit cut the learning episode (no life lost, no game over): bootstrap it
    played: jax.Array  # False at envpool's reset steps, which never enter the update
    game_over: jax.Array  # for the statistics: a game ended at this step, with this return and length
    episodic_returns: jax.Array
    episodic_lengths: jax.Array


def rollout(agent: Agent, env_step, params, env_state: EnvState, key, num_steps: int):
    """Plays num_steps steps of every environment as one `lax.scan`, env steps included. Returns the
    new env state, the transitions and the value of the observation after the last step."""

    def step(env_state: EnvState, key):
        action, logprob, _, value = agent.apply(params, env_state.obs, key, method=Agent.get_action_and_value)
        handle, (next_obs, reward, terminated, truncated, info) = env_step(env_state.handle, action)
        # envpool resets an environment on the step *after* its episode ended: that reset step ignores
        # the action and returns reward 0 and the new episode's first observation. Not played.
        played = ~env_state.reset_next
        game_over = info["terminated"].astype(bool) | truncated
        episode, finished = update_episode_statistics(env_state.episode, info["reward"], game_over, played)
        done = terminated | truncated
        cut = time_limit_cuts(truncated, info, env_state.lives)
        transition = Transitions(env_state.obs, action, logprob, value, reward, done, cut, played, *finished)
        return EnvState(handle, next_obs, done, episode, info["lives"]), transition

    env_state, transitions = jax.lax.scan(step, env_state, jax.random.split(key, num_steps))
    next_value = agent.apply(params, env_state.obs, method=Agent.get_value)
    return env_state, transitions, next_value


def time_limit_cuts(truncated, info: dict, lives_before):
    """Where the time limit cut a learning episode that would have gone on: the steps to bootstrap. envpool also
    flags the time limit on a step that ended the game or lost a life, which ends the learning episode anyway:
    nothing to bootstrap there. lives_before: each env's lives before the step."""
    return truncated & ~info["terminated"].astype(bool) & (info["lives"] >= lives_before)


def bootstrap_truncations(rewards, values, truncations, next_value, gamma: float):
    """A time limit is not a death: a truncated step's reward gains gamma * V(its last observation).
    envpool returns that observation at the truncated step and resets the game on the next step, so it
    is the observation stored for the following step: its value is values[t + 1], or next_value after
    the rollout's last step. rewards, values, truncations: (num_steps, num_envs)."""
    following_values = jnp.concatenate([values[1:], next_value[None]])
    return rewards + gamma * following_values * truncations


def compute_gae(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimation as a reverse `lax.scan` over the steps. rewards, values, dones:
    (num_steps, num_envs), dones[t] = 1 where step t ended the (learning) episode; next_value:
    (num_envs,), the value of the observation after the last step. Returns (advantages, returns)."""
    following_values = jnp.concatenate([values[1:], next_value[None]])
    deltas = rewards + gamma * following_values * (1.0 - dones) - values

    def step(lastgaelam, delta_and_done):
        delta, done = delta_and_done
        lastgaelam = delta + gamma * gae_lambda * (1.0 - done) * lastgaelam
        return lastgaelam, lastgaelam

    _, advantages = jax.lax.scan(step, jnp.zeros_like(next_value), (deltas, dones), reverse=True)
    return advantages, advantages + values


class Batch(NamedTuple):
    """One device's share of the batch, flat: every field is (local_batch_size, ...)."""

    obs: jax.Array
    actions: jax.Array
    logprobs: jax.Array
    values: jax.Array
    advantages: jax.Array
    returns: jax.Array
    played: jax.Array


class TrainState(NamedTuple):
    params: Any
    opt_state: Any


def normalize_advantages(advantages, played, axis_name: str):
    """(A - mean) / (std + 1e-8) over the played steps of the whole minibatch: every device's share."""
    weight = played.astype(jnp.float32)
    count = jax.lax.psum(weight.sum(), axis_name)
    mean = jax.lax.psum((advantages * weight).sum(), axis_name) / jnp.maximum(count, 1.0)
    variance = jax.lax.psum(((advantages - mean) ** 2 * weight).sum(), axis_name) / jnp.maximum(count - 1.0, 1.0)
    return (advantages - mean) / (jnp.sqrt(variance) + 1e-8)


def ppo_loss(params, agent: Agent, mb: Batch, advantages, num_played, args: Args):
    """The clipped PPO objective of one minibatch; returns the loss and the statistics to log. Means are
    over the played steps of the whole minibatch (`num_played`, all devices): this device's loss and
    statistics are its share of those means, and the shares of all devices add up to the whole."""
    _, newlogprob, entropy, newvalue = agent.apply(params, mb.obs, action=mb.actions, method=Agent.get_action_and_value)
    weight = mb.played.astype(jnp.float32) / jnp.maximum(num_played, 1.0)
    mean = lambda x: (x * weight).sum()

    logratio = newlogprob - mb.logprobs
    ratio = jnp.exp(logratio)
    # http://joschu.net/blog/kl-approx.html
    old_approx_kl = mean(-logratio)
    approx_kl = mean((ratio - 1) - logratio)
    clipfrac = mean((jnp.abs(ratio - 1.0) > args.clip_coef).astype(jnp.float32))

    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * jnp.clip(ratio, 1 - args.clip_coef, 1 + args.clip_coef)
    pg_loss = mean(jnp.maximum(pg_loss1, pg_loss2))

    if args.clip_vloss:
        v_loss_unclipped = (newvalue - mb.returns) ** 2
        v_clipped = mb.values + jnp.clip(newvalue - mb.values, -args.clip_coef, args.clip_coef)
        v_loss_clipped = (v_clipped - mb.returns) ** 2
        v_loss = 0.5 * mean(jnp.maximum(v_loss_unclipped, v_loss_clipped))
    else:
        v_loss = 0.5 * mean((newvalue - mb.returns) ** 2)

    entropy_loss = mean(entropy)
    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
    stats = dict(
        policy_loss=pg_loss,
        value_loss=v_loss,
        entropy=entropy_loss,
        old_approx_kl=old_approx_kl,
        approx_kl=approx_kl,
        clipfrac=clipfrac,
    )
    return loss, jax.lax.stop_gradient(stats)


def prepare_batch(transitions: Transitions, next_value, key, args: Args, axis_name: str):
    """Advantages, the flat batch, one shuffle of it per epoch and the explained variance (of the job)."""
    t = transitions
    rewards = bootstrap_truncations(t.rewards, t.values, t.truncations, next_value, args.gamma)
    dones = t.dones.astype(jnp.float32)
    advantages, returns = compute_gae(rewards, t.values, dones, next_value, args.gamma, args.gae_lambda)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    batch = Batch(*map(flat, (t.obs, t.actions, t.logprobs, t.values, advantages, returns, t.played)))

    # Each device shuffles its own share: a minibatch is the union of one share of each device.
    keys = jax.random.split(jax.random.fold_in(key, jax.lax.axis_index(axis_name)), args.update_epochs)
    perms = jax.vmap(lambda k: jax.random.permutation(k, args.local_batch_size))(keys)

    weight = batch.played.astype(jnp.float32)
    sums = lambda x: jax.lax.psum(jnp.stack([(x * weight).sum(), (x**2 * weight).sum()]), axis_name)
    count = jax.lax.psum(weight.sum(), axis_name)
    variance = lambda s: s[1] / count - (s[0] / count) ** 2
    var_y = variance(sums(batch.returns))
    explained_var = jnp.where(var_y == 0, jnp.nan, 1 - variance(sums(batch.returns - batch.values)) / var_y)
    return batch, perms, explained_var


def update_minibatch(train_state, epoch, minibatch, batch: Batch, perms, learning_rate, agent, tx, args, axis_name):
    """One gradient step on minibatch `minibatch` of epoch `epoch` (this device's share of it)."""
    size = args.local_batch_size // args.num_minibatches
    indices = jax.lax.dynamic_slice_in_dim(perms[epoch], minibatch * size, size)
    mb = jax.tree.map(lambda x: x[indices], batch)
    advantages = normalize_advantages(mb.advantages, mb.played, axis_name) if args.norm_adv else mb.advantages
    num_played = jax.lax.psum(mb.played.sum(), axis_name)
    grads, stats = jax.grad(ppo_loss, has_aux=True)(train_state.params, agent, mb, advantages, num_played, args)
    # Data parallel: each device's gradient is its share of the minibatch's; their sum is the whole.
    grads, stats = jax.lax.psum((grads, stats), axis_name)
    updates, opt_state = tx.update(grads, train_state.opt_state)
    params = optax.apply_updates(train_state.params, jax.tree.map(lambda u: -learning_rate * u, updates))
    return TrainState(params, opt_state), stats


def update_epochs(train_state: TrainState, batch: Batch, perms, learning_rate, agent, tx, args: Args, axis_name: str):
    """All epochs and minibatches of one update as one compiled program: a `lax.scan` over epochs of
    `lax.scan`s over minibatches. --target-kl cannot break a compiled loop, so the epochs after the stop
    are skipped by a `lax.cond`. Returns the state and the statistics of the last minibatch that ran, but
    its clip fraction: the mean over all the minibatches that ran."""
    kwargs = dict(batch=batch, perms=perms, learning_rate=learning_rate, agent=agent, tx=tx, args=args)
    step = partial(update_minibatch, **kwargs, axis_name=axis_name)

    def run_epoch(train_state, epoch):
        return jax.lax.scan(lambda ts, m: step(ts, epoch, m), train_state, jnp.arange(args.num_minibatches))

    stats_shape = jax.eval_shape(run_epoch, train_state, 0)[1]

    def epoch_step(carry, epoch):
        train_state, stopped = carry
        skip = lambda ts, epoch: (ts, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), stats_shape))
        train_state, stats = jax.lax.cond(stopped, skip, run_epoch, train_state, epoch)
        ran = ~stopped
        if args.target_kl is not None:
            stopped = stopped | (stats["approx_kl"][-1] > args.target_kl)
        return (train_state, stopped), (stats, ran)

    (train_state, _), (stats, ran) = jax.lax.scan(epoch_step, (train_state, False), jnp.arange(args.update_epochs))
    last_epoch = ran.sum() - 1
    last_stats = jax.tree.map(lambda s: s[last_epoch, -1], stats)
    last_stats["clipfrac"] = (stats["clipfrac"] * ran[:, None]).sum() / (ran.sum() * args.num_minibatches)
    return train_state, last_stats


def main(args: Args):
    join_hosts(args)
    args.num_devices = jax.device_count()
    args.local_num_envs = args.num_envs // args.num_devices
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.batch_size = args.local_batch_size * args.num_devices
    args.minibatch_size = args.batch_size // max(args.num_minibatches, 1)
    args.num_iterations = args.total_timesteps // max(args.batch_size, 1)
    check_args(args)
    is_main = jax.process_index() == 0  # prints, videos, the model and wandb are process 0's; every process trains
    keeps_run = keep_run_files_here()  # TensorBoard and checkpoints: one process per disk (runs/ folder)
    device = jax.local_devices()[0]

    # The run is named after the game it plays (an evaluation's: the saved model's) and process 0's clock.
    env_id = load_model(args.eval_checkpoint, device)[1]["env_id"] if args.eval_checkpoint else args.env_id
    started = int(multihost_utils.broadcast_one_to_all(np.int32(time.time())))
    run_name = f"{env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{started}"
    if args.eval_checkpoint is not None:  # no training: play the saved model's games
        if is_main:
            writer = start_logging(args, run_name, None)
            run_evaluation(args, device, writer, run_name)
            writer.close()
        return
    # Several hosts: the newest checkpoint that any disk holds, copied first to every disk that lacks it.
    checkpoint = resume_on_every_disk(args, keeps_run) if args.resume is not None else None
    run_name = checkpoint["run_name"] if checkpoint else run_name  # a resumed run goes on in its own folder
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if keeps_run and (args.checkpoint_every or checkpoint) else None
    writer = start_logging(args if is_main else replace(args, track=False), run_name, checkpoint) if keeps_run else None

    # Adam's learning rate is applied by the update (annealed per iteration), not by optax.
    key, init_key = jax.random.split(jax.random.key(args.seed))
    num_actions = int(envpool.make_spec(envpool_task(args.env_id)).action_space.n)
    agent = Agent(num_actions, compute_dtype(args))
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.scale_by_adam(eps=1e-5))
    init = lambda key: TrainState(params := init_params(agent, key), tx.init(params))
    mesh = Mesh(np.array(jax.devices()), ("devices",))  # one axis over every device of the job
    replicated = NamedSharding(mesh, P())
    train_state = jax.jit(init, out_shardings=replicated)(init_key)  # the same on every device

    start_iteration, global_step, env0_games, recent_returns = 0, 0, 0, deque(maxlen=20)
    if checkpoint is not None:
        saved_state = flax.serialization.from_state_dict(jax.eval_shape(init, init_key), checkpoint["train_state"])
        # every process holds the same host arrays: together they make the replicated state
        train_state = jax.tree.map(partial(jax.make_array_from_process_local_data, replicated), saved_state)
        key = jax.random.wrap_key_data(checkpoint["key"])
        start_iteration, global_step = checkpoint["iteration"], checkpoint["global_step"]
        env0_games = checkpoint["env0_games"]  # the games env 0 finished: videos go on numbering from there
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only

    # Each device of this process gets its own envpool and its share of the envs; environment i of the
    # job gets seed + i. The games in progress at a checkpoint are not in it: a resumed run starts new
    # games, on seeds the run has not used (seed + iteration * num_envs + i).
    local_devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    device_index = {d: i for i, d in enumerate(mesh.devices.flat)}
    env_seed = args.seed + start_iteration * args.num_envs
    device_seeds = [env_seed + device_index[d] * args.local_num_envs for d in local_devices]
    env_threads = min(args.local_num_envs, max(1, (os.cpu_count() or 1) // len(local_devices)))
    sticky, time_limit = args.repeat_action_probability, args.max_episode_steps
    envs = [make_envs(args.env_id, args.local_num_envs, sticky, seed, time_limit, env_threads) for seed in device_seeds]
    env_states, env_steps = zip(*[start_envs(env) for env in envs])
    env_states = [jax.device_put(state, d) for state, d in zip(env_states, local_devices)]
    if is_main:
        print(
            f"{args.num_devices} {jax.default_backend()} device(s) on {jax.process_count()} process(es):"
            f" {args.num_envs} envs ({args.local_num_envs} per device), batch {args.batch_size},"
            f" minibatch {args.minibatch_size}, {args.num_iterations} iterations"
        )
        if args.mixed_precision == "bf16" and jax.default_backend() == "cpu":  # 0.70-0.74x fp32 (AVX-512 EPYC)
            print("warning: XLA:CPU has no fast bf16 path: bf16 runs slower than fp32", file=sys.stderr)
    video = None
    if args.capture_video and is_main:  # env 0 of the job: the first env of process 0's first device
        video = ReplayVideoRecorder(f"videos/{run_name}", args.env_id, device_seeds[0], args, env0_games)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)

    # One compiled rollout per device: envpool's XLA calls name their envpool in the program itself.
    rollouts = [jax.jit(partial(rollout, agent, env_step, num_steps=args.num_steps)) for env_step in env_steps]
    # The update, as programs over all devices (shard_map: each device sees its own share). check_vma=False:
    # the functions sum over devices themselves (psum), as the torch scripts all-reduce.
    sharded = lambda f, ins, outs: jax.shard_map(f, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)
    by_env, by_sample = P(None, "devices"), P("devices")
    prepare_program = partial(prepare_batch, args=args, axis_name="devices")
    prepare = jax.jit(sharded(prepare_program, (by_env, by_sample, P()), (by_sample, by_env, P())))
    update_program = partial(update_epochs, agent=agent, tx=tx, args=args, axis_name="devices")
    update = jax.jit(sharded(update_program, (P(), by_sample, by_env, P()), P()), donate_argnums=0)

    def global_array(arrays, axis: int, spec):
        """Joins this process's per-device arrays along `axis` into one array over the job's devices."""
        shape = list(arrays[0].shape)
        shape[axis] *= args.num_devices
        return jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(mesh, spec), list(arrays))

    host = lambda x: np.asarray(x.addressable_data(0))  # a replicated value, read on this process
    start_time, start_global_step, sps = time.time(), global_step, 0

    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        frac = 1.0 - (iteration - 1.0) / args.num_iterations if args.anneal_lr else 1.0
        learning_rate = frac * args.learning_rate

        # Rollout: each device plays its envs; the calls are asynchronous, so the devices run at once.
        key, rollout_key, update_key = jax.random.split(key, 3)
        outputs = []
        for d, play, env_state in zip(local_devices, rollouts, env_states):
            device_key = jax.device_put(jax.random.fold_in(rollout_key, device_index[d]), d)
            outputs.append(play(on_device(train_state.params, d), env_state, device_key))
        env_states = [env_state for env_state, _, _ in outputs]
        transitions = jax.tree.map(lambda *xs: global_array(xs, 1, by_env), *[t for _, t, _ in outputs])
        next_value = global_array([v for _, _, v in outputs], 0, by_sample)

        batch, perms, explained_var = prepare(transitions, next_value, update_key)
        train_state, stats = update(train_state, batch, perms, learning_rate)

        # The games that ended, in the job's order: the env steps of one vector step count as
        # consecutive global steps, env 0 first, so every game is logged at a step of its own.
        t = transitions
        game_over, returns, lengths = multihost_utils.process_allgather(
            (t.game_over, t.episodic_returns, t.episodic_lengths), tiled=True
        )
        env0_games += int(game_over[:, 0].sum())
        for step, i in zip(*np.nonzero(game_over)):
            recent_returns.append(float(returns[step, i]))
            if keeps_run:
                game_step = global_step + step * args.num_envs + i + 1
                writer.add_scalar("charts/episodic_return", returns[step, i], game_step)
                writer.add_scalar("charts/episodic_length", lengths[step, i], game_step)
        if video is not None:
            env0 = outputs[0][1]  # the transitions of this process's first device
            video.add(env0.actions[:, 0], env0.game_over[:, 0], env0.episodic_returns[:, 0])
        global_step += args.batch_size

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        if keeps_run:
            writer.add_scalar("charts/learning_rate", learning_rate, global_step)
            for name, value in stats.items():  # clipfrac: the mean of the update; the others: its last minibatch
                writer.add_scalar(f"losses/{name}", host(value), global_step)
            writer.add_scalar("losses/explained_variance", host(explained_var), global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
        if is_main:
            progress.show(global_step, sps, recent_returns)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            if keeps_run:
                writer.flush()  # everything up to this checkpoint is on disk before it counts
                saved_state = jax.device_get(on_device(train_state, local_devices[0]))
                state = dict(train_state=flax.serialization.to_state_dict(saved_state), iteration=iteration)
                state.update(key=np.asarray(jax.random.key_data(key)), global_step=global_step)
                state.update(env0_games=env0_games, recent_returns=list(recent_returns))
                save_checkpoint(checkpoint_folder, f"iteration-{iteration:07d}.msgpack", state, args, run_name)

    # Every device must hold the same parameters: the same gradient is applied everywhere.
    as_bytes = lambda params: b"".join(np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(params))
    digests = [hashlib.sha256(as_bytes(on_device(train_state.params, d))).hexdigest()[:16] for d in local_devices]
    print(f"process {jax.process_index()}: parameters sha256 per device {' '.join(digests)}")
    for env in envs:
        env.close()
    if video is not None:
        video.close()
    if is_main:
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        print(
            f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
            f"mean return of the last {len(recent_returns)} games {recent}"
        )
        if args.save_model:
            model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
            trained = agent.bind(on_device(train_state.params, local_devices[0]))  # a flax model: agent and parameters
            save_model(model_path, trained, args)
            print(f"model saved to {model_path}")
            run_evaluation(args, device, writer, run_name, trained)
    if writer is not None:
        writer.close()
    if run_lock is not None:
        run_lock.close()


def join_hosts(args: Args):
    """Several hosts: every process runs this script; jax.distributed joins their devices into one job. Under
    `srun` with several tasks JAX reads the coordinator and each process's place from Slurm's variables:
    without this, each task would train a job of its own, all on the same seeds."""
    coordinator_address = args.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator_address and (args.num_processes is not None or args.process_id is not None):
        fail("--num-processes and --process-id need --coordinator-address (or $JAX_COORDINATOR_ADDRESS)")
    if args.join_timeout <= 0 or args.heartbeat_timeout <= 0:
        fail(
            f"--join-timeout and --heartbeat-timeout must be positive seconds, got {args.join_timeout}, "
            f"{args.heartbeat_timeout}"
        )
    slurm_tasks = os.environ.get("SLURM_STEP_NUM_TASKS", "1")  # set by srun: this step's processes
    if coordinator_address or (slurm_tasks.isdigit() and int(slurm_tasks) > 1):
        env_int = lambda name: int(os.environ[name]) if name in os.environ else None
        num_processes = args.num_processes if args.num_processes is not None else env_int("JAX_NUM_PROCESSES")
        process_id = args.process_id if args.process_id is not None else env_int("JAX_PROCESS_ID")
        if coordinator_address:  # under Slurm without one, JAX takes it from Slurm's variables
            check_coordinator(coordinator_address, process_id, args.join_timeout)
        jax.distributed.initialize(
            coordinator_address,
            num_processes,
            process_id,
            initialization_timeout=args.join_timeout,
            heartbeat_timeout_seconds=args.heartbeat_timeout,
        )


# How long the hosts wait for each other: a resumed run may change it (it is not what the run learns).
WAITING_FOR_HOSTS = {"join_timeout", "heartbeat_timeout"}


def check_coordinator(address: str, process_id: int | None, timeout: int):
    """What would otherwise end in JAX's own abort (a C++ stack trace) or a silent wait: a coordinator
    address that is not HOST:PORT or does not resolve, its port taken on process 0's host, a coordinator
    that no other process reaches within the join timeout. Each is a one-line error naming the address."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        fail(f"--coordinator-address must be HOST:PORT, got {address!r}")
    host = host.strip("[]")  # an IPv6 address in brackets
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        fail(f"the coordinator's host {host!r} does not resolve on {socket.gethostname()}: {e.strerror}")
    if process_id == 0:  # the coordinator's service will listen on this port of every address of this host
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server's: TIME_WAIT is no owner
            try:
                probe.bind(("0.0.0.0", int(port)))
            except OSError as e:
                fail(f"the coordinator's port {port} is taken on {socket.gethostname()}: {e.strerror}")
        return
    deadline = time.time() + timeout  # process 0 starts the service when it joins: wait for it to listen
    while True:
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            return
        except OSError as e:
            if time.time() > deadline:
                fail(f"no coordinator answers at {address} from {socket.gethostname()} in {timeout} s: {e}")
            time.sleep(1)


def on_device(tree, device):
    """The copy of a replicated array tree that `device` holds, as a plain array of that device (no copy)."""
    shard = lambda x: next(s.data for s in x.addressable_shards if s.device == device)
    return jax.tree.map(lambda x: jax.device_put(shard(x), device), tree)


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
    if args.num_envs % args.num_devices != 0:
        devices = args.num_devices
        fail(f"--num-envs {args.num_envs} does not split evenly over {devices} devices; use a multiple of {devices}")
    if args.local_batch_size % args.num_minibatches != 0:
        share = f"each device's batch, num_envs / devices * num_steps = {args.local_batch_size},"
        fail(f"{share} is not divisible by num_minibatches = {args.num_minibatches}")
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


class ReplayVideoRecorder:
    """Records games of env 0 as RGB mp4 files, `{folder}/game-{k}.mp4` for the k-th game. The compiled
    rollout holds only the agent's 84x84 grayscale stacks, on the device: after each rollout, a one-env
    shadow of env 0 (same game, seed and settings, full 210x160 RGB screens) is given env 0's actions on
    a thread and plays the identical game, so training only hands the actions over. Where the rollout's
    games ended, and with which score, the shadow's must too: a shadow out of sync says so and records
    no more. A video holds one screen per played step; a game cut by close() is not kept. Under --track
    each finished file goes to wandb."""

    def __init__(self, folder: str, env_id: str, seed: int, args: Args, first_game=0, schedule=capped_cubic):
        os.makedirs(folder, exist_ok=True)
        self.folder, self.schedule, self.game, self.track = folder, schedule, first_game, args.track
        sticky, time_limit = args.repeat_action_probability, args.max_episode_steps
        self.shadow = make_envs(env_id, 1, sticky, seed, time_limit, num_threads=1, rgb_frames=True)
        self.rollouts, self.in_sync, self.error = queue.Queue(), True, None
        self.replayer = threading.Thread(target=self.replay, daemon=True)
        self.replayer.start()

    def add(self, actions, game_over, episodic_returns):
        """One rollout of env 0, each (num_steps,): its actions, where its games ended, with which score."""
        if self.in_sync:
            self.rollouts.put((np.asarray(actions), np.asarray(game_over), np.asarray(episodic_returns)))

    def replay(self):
        try:
            self.replay_rollouts()
        except Exception as e:  # re-raised by close(), in the main thread
            self.error = e

    def replay_rollouts(self):
        import imageio_ffmpeg  # imported here: only video runs pay for it

        self.shadow.reset()
        score, reset_next, writer, path = 0.0, False, None, None
        while self.in_sync and (rollout := self.rollouts.get()) is not None:
            for action, game_over, episodic_return in zip(*rollout):
                screen, _, terminated, truncated, info = self.shadow.step(np.array([action]))
                played, reset_next = not reset_next, bool(terminated[0] or truncated[0])  # a reset step: no screen
                score += float(info["reward"][0])
                shadow_game_over = bool(info["terminated"][0] or truncated[0])
                if shadow_game_over != game_over or (game_over and not np.isclose(score, episodic_return)):
                    print(f"warning: the video of env 0 lost sync in game {self.game}; no more videos", file=sys.stderr)
                    self.in_sync = False
                    break
                if played and self.schedule(self.game):
                    if writer is None:
                        path = os.path.join(self.folder, f"game-{self.game}")
                        writer = imageio_ffmpeg.write_frames(
                            f"{path}.partial.mp4", (160, 210), fps=30, macro_block_size=1
                        )
                        writer.send(None)  # starts ffmpeg
                    writer.send(np.ascontiguousarray(screen[0].transpose(1, 2, 0)))
                if game_over:
                    if writer is not None:
                        writer.close()
                        writer = None
                        os.replace(f"{path}.partial.mp4", f"{path}.mp4")
                        if self.track:
                            import wandb

                            wandb.save(f"{path}.mp4", base_path=os.path.dirname(self.folder), policy="now")
                    self.game, score = self.game + 1, 0.0
        if writer is not None:  # a game cut by the end of the run
            writer.close()
            os.remove(f"{path}.partial.mp4")

    def close(self):
        """Returns once the video of every finished game is written."""
        self.rollouts.put(None)
        self.replayer.join()
        self.shadow.close()
        if self.error is not None:
            raise self.error


def save_model(path: str, agent: nn.Module, args: Args):
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    model = {"params": agent.variables, "num_actions": agent.num_actions}  # this script
    Path(path + ".tmp").write_bytes(flax.serialization.msgpack_serialize({**model, "args": vars(args)}))  # this script
    os.replace(path + ".tmp", path)


def load_model(path: str, device) -> tuple[nn.Module, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = flax.serialization.msgpack_restore(Path(path).read_bytes())  # this script
        agent = Agent(payload["num_actions"]).bind(params_of(payload, device))  # this script
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return agent, dict(payload["args"])


def params_of(payload: dict, device):
    """A saved model's parameters, on `device`, in the tree of a fresh Agent's."""
    fresh = init_params(Agent(payload["num_actions"]), jax.random.key(0))
    return jax.device_put(flax.serialization.from_state_dict(fresh, payload["params"]), device)


def evaluate(agent: Agent, env_id: str, eval_episodes: int, device, args: Args, seed=0, video_folder=None) -> list:
    """Plays `eval_episodes` whole games (all lives, unclipped score) with the sampled policy of `agent` (a
    flax model: bound to its parameters), in the compiled training rollout on the training environment
    (episodic life: envpool presses FIRE after each lost life, as in training)."""
    num_envs = min(8, eval_episodes)
    # Each env plays a fixed quota of games: keeping the first games to finish would favour short (bad) ones.
    quota = [eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)]
    envs = make_envs(env_id, num_envs, args.repeat_action_probability, seed, args.max_episode_steps)
    env_state, env_step = start_envs(envs)
    module, params = agent.unbind()
    play = jax.jit(partial(rollout, module.clone(dtype=compute_dtype(args)), env_step, num_steps=args.num_steps))
    params = jax.device_put(params, device)
    first_games = lambda game: game < quota[0]
    video = ReplayVideoRecorder(video_folder, env_id, seed, args, schedule=first_games) if video_folder else None
    returns = [[] for _ in range(num_envs)]
    key = jax.random.fold_in(jax.random.key(seed), 1)  # not the stream training started from
    while any(len(r) < q for r, q in zip(returns, quota)):
        key, rollout_key = jax.random.split(key)
        env_state, t, _ = play(params, env_state, rollout_key)
        game_over, episodic_returns = np.asarray(t.game_over), np.asarray(t.episodic_returns)
        if video is not None:
            video.add(t.actions[:, 0], game_over[:, 0], episodic_returns[:, 0])
        for step, i in zip(*np.nonzero(game_over)):
            if len(returns[i]) < quota[i]:
                returns[i].append(float(episodic_returns[step, i]))
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
RESUMABLE_CHANGES |= {"coordinator_address", "num_processes", "process_id"} | WAITING_FOR_HOSTS  # this script: hosts
RESUMABLE_CHANGES |= {"num_devices", "local_num_envs", "local_batch_size"}  # this script: the job split anew


def save_checkpoint(folder: str, name: str, state: dict, args: Args, run_name: str, keep: int = 2):
    """Writes `state`, the random streams, the arguments and the script's SHA-256 to `folder/name`: to a
    temporary file, synced and renamed, so a crash leaves the previous checkpoint or this one, never half
    a file. The newest `keep` checkpoints are kept."""
    path = os.path.join(folder, name)
    state.update(
        args=vars(args), run_name=run_name, script_sha256=hashlib.sha256(Path(__file__).read_bytes()).hexdigest()
    )
    with open(path + ".tmp", "wb") as f:
        f.write(flax.serialization.msgpack_serialize(state))  # this script
        f.flush()  # this script: torch.save flushes its file itself
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    pattern = os.path.join(folder, "*.msgpack")  # this script
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
        found = glob.glob(f"runs/{glob.escape(run_prefix)}*/checkpoints/*.msgpack")  # this script
        if not found:
            print(f"--resume auto: no checkpoint of {run_prefix}* in runs/, starting a new run")
            return None
        resume = max(found, key=os.path.getmtime)
    if not os.path.isfile(resume):
        fail(f"--resume {resume!r}: no such checkpoint file (pass a runs/*/checkpoints/ file or auto)")
    try:
        checkpoint = flax.serialization.msgpack_restore(Path(resume).read_bytes())  # this script
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


# Several hosts, each with a disk of its own (this script's alone): every disk keeps the whole run, so that
# the loss of any host, process 0's included, loses no checkpoint and no TensorBoard step.
def keep_run_files_here() -> bool:
    """Whether this process keeps the run's TensorBoard events and checkpoints in its runs/ folder: exactly one
    process per folder, so that each host's disk holds the whole run and a folder that several processes see
    (one host, a shared filesystem) is written once. Process 0 claims its folder first, then the others, each
    by creating a marker file that only one process can create (O_EXCL), removed when all have tried."""
    if jax.process_count() == 1:
        return True
    os.makedirs("runs", exist_ok=True)
    token = int(multihost_utils.broadcast_one_to_all(np.int32(secrets.randbits(31))))  # new at every start
    marker, claimed = f"runs/.claimed-{token}", False
    for turn in ("process 0", "the others"):
        if (jax.process_index() == 0) == (turn == "process 0"):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                claimed = True
            except FileExistsError:  # this folder's keeper is another process
                pass
        multihost_utils.sync_global_devices(f"runs/ folders claimed by {turn}")
    if claimed:
        os.remove(marker)
    return claimed


def checkpoint_order(path: str | None) -> tuple[int, int]:
    """What makes a checkpoint newer: its run's start (the time in the run's name), then its iteration;
    (0, 0) for a file outside runs/*/checkpoints/, (-1, -1) for none."""
    if path is None or not os.path.isfile(path):
        return -1, -1
    numbers = re.search(r"__(\d+)/checkpoints/iteration-(\d+)\.msgpack$", path)
    return (int(numbers[1]), int(numbers[2])) if numbers else (0, 0)


def resume_on_every_disk(args: Args, keeps_run: bool) -> dict | None:
    """load_checkpoint for a job of several processes on hosts with disks of their own: the processes agree
    on the newest checkpoint that any of them holds, and its holder sends it, with the run's TensorBoard
    files, to each process that keeps a disk's run files and lacks it, before every process reads it."""
    if jax.process_count() == 1:
        return load_checkpoint(args.resume, args)
    if args.resume == "auto":  # as load_checkpoint's, but ordered by checkpoint_order: disks' clocks differ
        run_prefix = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__"
        path = max(
            glob.glob(f"runs/{glob.escape(run_prefix)}*/checkpoints/*.msgpack"), key=checkpoint_order, default=None
        )
    else:
        path = args.resume if os.path.isfile(args.resume) else None
    everyone = multihost_utils.process_allgather(np.array([*checkpoint_order(path), keeps_run], np.int32)).tolist()
    holder = max(range(len(everyone)), key=lambda i: (everyone[i][:2], -i))  # the lowest index among equals
    newest = everyone[holder][:2]
    lacking = [i for i, (*order, keeps) in enumerate(everyone) if keeps and order != newest]
    if newest == [-1, -1] or not lacking:  # no checkpoint anywhere, or every disk holds the newest
        return load_checkpoint(path or args.resume, args)

    is_holder, sent = jax.process_index() == holder, b""
    if is_holder:
        checkpoint = Path(path).read_bytes()
        run = f"runs/{flax.serialization.msgpack_restore(checkpoint)['run_name']}"
        events = {os.path.basename(f): Path(f).read_bytes() for f in glob.glob(f"{glob.escape(run)}/events.*")}
        sent = flax.serialization.msgpack_serialize(dict(path=path, run=run, checkpoint=checkpoint, events=events))
    sent = flax.serialization.msgpack_restore(broadcast_bytes(sent, is_holder))
    if jax.process_index() in lacking:  # its own events give way to the holder's, the run's up to the checkpoint
        for stale in glob.glob(f"{glob.escape(sent['run'])}/events.*"):
            os.remove(stale)
        os.makedirs(sent["run"], exist_ok=True)
        for name, content in sent["events"].items():
            Path(sent["run"], name).write_bytes(content)
        os.makedirs(os.path.dirname(sent["path"]) or ".", exist_ok=True)
        Path(sent["path"] + ".tmp").write_bytes(sent["checkpoint"])
        os.replace(sent["path"] + ".tmp", sent["path"])
        copied = f"{sent['path']} and {len(sent['events'])} TensorBoard file(s)"
        print(f"process {jax.process_index()}: copied {copied} from process {holder}", flush=True)
    multihost_utils.sync_global_devices("the newest checkpoint on every disk")
    return load_checkpoint(sent["path"], args)


def broadcast_bytes(data: bytes, is_source: bool) -> bytes:
    """The source process's bytes, on every process (a collective call: all call it, one as the source)."""
    size = int(multihost_utils.broadcast_one_to_all(np.int32(len(data)), is_source))
    buffer = np.frombuffer(data, np.uint8) if is_source else np.zeros(size, np.uint8)
    return multihost_utils.broadcast_one_to_all(buffer, is_source).tobytes()


@contextmanager
def exit_when_a_process_is_lost():
    """jax.distributed has no elastic restart: when a process of the job dies, the others' next collective
    call fails (gloo: the connection is reset). They exit at once with a one-line error, skipping JAX's
    shutdown barrier, which would wait for the lost process until its heartbeat times out (100 s) and abort."""
    try:
        yield
    except jax.errors.JaxRuntimeError as e:
        lost = jax.process_count() > 1 and any(sign in str(e) for sign in ("Gloo", "UNAVAILABLE", "heartbeat"))
        if not lost:
            raise
        cause = str(e).strip().splitlines()[0]
        print(
            f"error: process {jax.process_index()} lost the job ({cause}); restart it with --resume auto"
            " on the hosts left (--num-processes their number)",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(1)


if __name__ == "__main__":
    with exit_when_a_process_is_lost():
        main(tyro.cli(Args))
