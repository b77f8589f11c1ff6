"""PPO on Atari with envpool's XLA interface and JAX (flax + optax), one file.

The PPO of `ppo_atari_envpool.py` (Nature CNN, envpool's Atari preprocessing with episodic life and
reward clipping, reset steps kept out of the update, truncations bootstrapped), written in JAX.
envpool's XLA interface puts the environment steps inside the compiled rollout: one `jax.lax.scan`
plays all the steps of an iteration; GAE is a reverse scan; all epochs and minibatches of the
update are one compiled `lax.scan`. Data parallel over all local devices (shard_map), each with its
own envpool, and over several hosts with `jax.distributed`. With `--checkpoint-every K` a run can be
stopped and continued (`--resume`), on the same or another number of devices.
Docs: docs/ppo_atari_envpool_xla_jax_scan.md
"""

import fcntl
import glob
import hashlib
import os
import queue
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from functools import partial
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
    """if toggled, games 0, 1, 8, 27, ..., then every 1000th of env 0 are saved as RGB mp4 files in `videos/`"""
    save_model: bool = False
    """if toggled, the model is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 computes the network body in bfloat16; heads, parameters, gradients, loss and optimizer stay fp32"""
    progress_interval: float = 30.0
    """seconds between plain progress lines when stderr is not a terminal (log files, Slurm, nohup)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint (parameters, optimizer, random key, counters) to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never); several hosts must share runs/"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest checkpoint by modification time in runs/ of this env_id, exp_name and seed (none: a new run)"""

    # Environment
    env_id: str = "Breakout-v5"
    """the game: `Breakout-v5`, `ALE/Breakout-v5` and `BreakoutNoFrameskip-v4` all name Breakout"""
    repeat_action_probability: float = 0.0
    """sticky actions; 0 is the NoFrameskip-v4 / envpool convention behind the published PPO scores"""
    max_episode_steps: int = 27_000
    """time limit of a game in agent steps (27,000 = 108,000 frames); a cut game is bootstrapped"""

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
    """multi-host: `host:port` of process 0 (default: $JAX_COORDINATOR_ADDRESS; neither: one host)"""
    num_processes: int | None = None
    """multi-host: the number of processes (default: $JAX_NUM_PROCESSES, or cluster detection)"""
    process_id: int | None = None
    """multi-host: the index of this process (default: $JAX_PROCESS_ID, or cluster detection)"""

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


def fail(message: str):
    """A user error: one line naming the problem, a non-zero exit, no traceback."""
    sys.exit(f"error: {message}")


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
    env_id: str, num_envs: int, repeat_action_probability: float, seed: int, max_episode_steps: int = 27_000,
    num_threads: int | None = None, noop_max: int = 30, rgb_frames: bool = False,
):
    # Environment i is seeded with seed + i. Synchronous (batch_size = num_envs): each step returns
    # every environment in order, which the compiled rollout needs.
    # episodic_life: a lost life ends the learning episode (terminated) but the game goes on with
    # its remaining lives; FIRE is pressed on the reset step after it; info["terminated"] marks the
    # real game over. reward_clip: the returned reward is sign(reward), info["reward"] the raw one.
    # noop_max=0 crashes envpool 1.2.5; noop_max=1 means no no-op starts.
    # What the agent sees: a stack of the last 4 frames, 84x84 grayscale. rgb_frames: the same games
    # (no frame setting touches the emulator or its random numbers), seen as the screen of each step
    # in full-size RGB, (3, 210, 160): what a video shows.
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
        noop_max=noop_max,
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
    """Adds one step; returns the new statistics and (game_over, return, length) of this step.

    A game ends at a real game over or at the time limit: both reset the running return, so a
    truncated game's score is never carried into the next game. The length counts the steps whose
    action was played (envpool's `elapsed_step`), not the reset steps, whose action is ignored.
    """
    returns = stats.returns + raw_reward
    lengths = stats.lengths + played.astype(jnp.int32)
    finished = (game_over, returns, lengths)
    return EpisodeStatistics(jnp.where(game_over, 0.0, returns), jnp.where(game_over, 0, lengths)), finished


class VideoRecorder:
    """Saves whole games of one environment as mp4 files of the real screen (RGB, 210x160).

    The compiled rollout has only the agent's 84x84 grayscale stacks, on the device. A "shadow"
    envpool of one environment, made with the recorded environment's seed and settings but RGB
    frames, is fed the recorded environment's actions and so plays the identical game (envpool is
    deterministic given its seed and the actions; tested). A background thread steps the shadow and
    streams the frames of the scheduled games to ffmpeg, so the training loop only hands over the
    actions of each rollout. Kept: games 0, 1, 8, 27, ..., 729, then every 1000th (gymnasium's capped
    cubic schedule), at most `max_games`; each game is written as `game-{n}.partial.mp4` and renamed
    `game-{n}.mp4` when it ends, and the game still running at close() is discarded.
    """

    def __init__(
        self, folder: str, env_id: str, seed: int, repeat_action_probability: float, max_episode_steps: int,
        max_games: int | None = None, upload: bool = False, fps: int = 30, first_game: int = 0,
    ):
        from gymnasium.utils.save_video import capped_cubic_video_schedule  # imported here: only videos need it

        os.makedirs(folder, exist_ok=True)
        self.env = make_envs(
            env_id, 1, repeat_action_probability, seed, max_episode_steps, num_threads=1, rgb_frames=True
        )
        self.scheduled = lambda game: capped_cubic_video_schedule(game) and (max_games is None or game < max_games)
        self.folder, self.upload, self.fps, self.first_game = folder, upload, fps, first_game
        self.rollouts, self.in_sync, self.error = queue.Queue(), True, None
        self.thread = threading.Thread(target=self._record, daemon=True)
        self.thread.start()

    def add(self, actions, game_over, episodic_returns):
        """One rollout of the recorded environment, each (num_steps,): the actions it played, and where
        its games ended with which score, which the shadow's games must match."""
        if self.in_sync:
            self.rollouts.put((np.asarray(actions), np.asarray(game_over), np.asarray(episodic_returns)))

    def close(self):
        """Returns once the video of every finished game is written."""
        self.rollouts.put(None)
        self.thread.join()
        self.env.close()
        if self.error is not None:
            raise self.error

    def _record(self):
        try:
            self._replay()
        except Exception as e:  # re-raised by close(), in the main thread
            self.error = e

    def _replay(self):
        from moviepy.video.io.ffmpeg_writer import FFMPEG_VideoWriter

        self.env.reset()
        game, score, reset_next, video = self.first_game, 0.0, False, None
        path = lambda game, suffix="": os.path.join(self.folder, f"game-{game}{suffix}.mp4")
        while (rollout := self.rollouts.get()) is not None:
            for action, game_over, episodic_return in zip(*rollout):
                frame, _, terminated, truncated, info = self.env.step(np.array([action]))
                played = not reset_next  # the step after an episode's end is a reset step: no frame of its own
                reset_next = bool(terminated[0] or truncated[0])
                score += float(info["reward"][0])
                shadow_game_over = bool(info["terminated"][0] or truncated[0])
                if shadow_game_over != game_over or (game_over and not np.isclose(score, episodic_return)):
                    print(f"warning: the video of env 0 lost sync in game {game}; no more videos", file=sys.stderr)
                    self.in_sync = False
                    break
                if played and self.scheduled(game):
                    if video is None:
                        video = FFMPEG_VideoWriter(path(game, ".partial"), (160, 210), self.fps, threads=1)
                    video.write_frame(frame[0].transpose(1, 2, 0))
                if game_over:
                    if video is not None:
                        video.close()
                        os.replace(path(game, ".partial"), path(game))
                        video = None
                        if self.upload:
                            import wandb

                            wandb.save(path(game), base_path=os.path.dirname(self.folder), policy="now")
                    game, score = game + 1, 0.0
            if not self.in_sync:
                break
        if video is not None:  # a game cut by the end of the run
            video.close()
            os.remove(path(game, ".partial"))


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
def layer_init(std=np.sqrt(2), bias_const=0.0) -> dict:
    """Orthogonal weights of gain `std` and constant biases: the torch scripts' initialization."""
    return dict(kernel_init=nn.initializers.orthogonal(std), bias_init=nn.initializers.constant(bias_const))


# XLA:CPU computes a convolution inside a compiled loop (the rollout's and the update's lax.scan)
# very slowly: measured on the 2-core CPU, one minibatch step of the compiled update took 8.5 s
# with XLA's convolutions and 0.24 s with the same convolutions as matrix products of image
# patches ("im2col", the Conv below), 36x; the rollout of 8 envs x 128 steps 1.27 s against
# 0.83 s. False: XLA's convolution everywhere. Other backends always use XLA's (cuDNN on GPU).
PATCH_CONVOLUTIONS_ON_CPU = True


class Conv(nn.Module):
    """nn.Conv(features, (k, k), strides=(s, s), padding="VALID"): the same parameters and function.

    With `im2col` (default: on CPU, see PATCH_CONVOLUTIONS_ON_CPU) it is computed as one matrix
    product of the image patches; otherwise with XLA's convolution.
    """

    features: int
    kernel_size: int
    stride: int
    dtype: Any = jnp.float32
    kernel_init: Any = nn.initializers.lecun_normal()
    bias_init: Any = nn.initializers.zeros
    im2col: bool | None = None  # None: PATCH_CONVOLUTIONS_ON_CPU on the CPU backend

    @nn.compact
    def __call__(self, x):  # x: (batch, height, width, channels)
        k, s, channels = self.kernel_size, self.stride, x.shape[-1]
        kernel = self.param("kernel", self.kernel_init, (k, k, channels, self.features))
        bias = self.param("bias", self.bias_init, (self.features,))
        x, kernel, bias = x.astype(self.dtype), kernel.astype(self.dtype), bias.astype(self.dtype)
        im2col = self.im2col
        if im2col is None:
            im2col = PATCH_CONVOLUTIONS_ON_CPU and jax.default_backend() == "cpu"
        if not im2col:
            y = jax.lax.conv_general_dilated(x, kernel, (s, s), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"))
            return y + bias
        height, width = (x.shape[1] - k) // s + 1, (x.shape[2] - k) // s + 1
        # patches[..., (i * k + j) * channels + c] = x[:, s * row + i, s * col + j, c]: the kernel's order
        rows, cols = s * (height - 1) + 1, s * (width - 1) + 1
        windows = [x[:, i : i + rows : s, j : j + cols : s] for i in range(k) for j in range(k)]
        patches = jnp.concatenate(windows, axis=-1)
        return patches @ kernel.reshape(k * k * channels, self.features) + bias


class Agent(nn.Module):
    num_actions: int
    dtype: Any = jnp.float32  # the compute dtype; parameters are always fp32

    def setup(self):
        self.network = nn.Sequential([
            Conv(32, 8, 4, dtype=self.dtype, **layer_init()),
            nn.relu,
            Conv(64, 4, 2, dtype=self.dtype, **layer_init()),
            nn.relu,
            Conv(64, 3, 1, dtype=self.dtype, **layer_init()),
            nn.relu,
            lambda x: x.reshape(x.shape[0], -1),
            nn.Dense(512, dtype=self.dtype, **layer_init()),
            nn.relu,
        ])
        self.actor = nn.Dense(self.num_actions, dtype=jnp.float32, **layer_init(0.01))
        self.critic = nn.Dense(1, dtype=jnp.float32, **layer_init(1.0))

    def hidden(self, obs):
        # obs: (batch, 4, 84, 84) uint8 from envpool; flax convolutions are channels-last.
        x = jnp.transpose(obs, (0, 2, 3, 1)).astype(self.dtype) / 255.0
        return self.network(x)

    def heads(self, hidden):
        # The two heads compute in fp32 even under bf16: values and log-probabilities feed GAE, value
        # clipping and the probability ratio, where bf16's 3 significant digits would show; the two
        # small layers cost nothing. Returns (logits, value).
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


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
class EnvState(NamedTuple):
    """What the rollout carries from one step to the next, for one device's envpool."""

    handle: jax.Array  # envpool's XLA handle: threading it orders the env steps
    obs: jax.Array  # (num_envs, 4, 84, 84) uint8: the observation to act on
    reset_next: jax.Array  # (num_envs,) bool: the last step ended an episode, so the next is a reset step
    episode: EpisodeStatistics


class Transitions(NamedTuple):
    """One rollout: every field is (num_steps, num_envs, ...)."""

    obs: jax.Array
    actions: jax.Array
    logprobs: jax.Array
    values: jax.Array
    rewards: jax.Array  # clipped: what the agent learns from
    dones: jax.Array  # the step ended the learning episode: a lost life, a game over or the time limit
    truncations: jax.Array  # the step reached the time limit with the game still on: bootstrap it
    played: jax.Array  # False at envpool's reset steps, which never enter the update
    game_over: jax.Array  # for the statistics: a game ended at this step, with this return and length
    episodic_returns: jax.Array
    episodic_lengths: jax.Array


def rollout(agent: Agent, env_step, params, env_state: EnvState, key, num_steps: int):
    """Plays num_steps steps of every environment as one `lax.scan`, env steps included.

    Returns the new env state, the transitions and the value of the observation after the last step.
    """

    def step(env_state: EnvState, key):
        action, logprob, _, value = agent.apply(params, env_state.obs, key, method=Agent.get_action_and_value)
        handle, (next_obs, reward, terminated, truncated, info) = env_step(env_state.handle, action)
        # envpool resets an environment on the step *after* its episode ended (a lost life, a game
        # over or the time limit): that reset step ignores the action and returns reward 0 and the
        # new episode's first observation. Its "transition" is nothing the agent caused: played = False.
        played = ~env_state.reset_next
        game_over = info["terminated"].astype(bool) | truncated
        episode, (game_over, episodic_return, episodic_length) = update_episode_statistics(
            env_state.episode, info["reward"], game_over, played
        )
        done = terminated | truncated
        # envpool also flags the time limit on a game that ended on its last allowed step: that game
        # is over, nothing to bootstrap.
        truncated_alive = truncated & ~info["terminated"].astype(bool)
        transition = Transitions(
            env_state.obs, action, logprob, value, reward, done, truncated_alive, played, game_over, episodic_return,
            episodic_length,
        )
        return EnvState(handle, next_obs, done, episode), transition

    env_state, transitions = jax.lax.scan(step, env_state, jax.random.split(key, num_steps))
    next_value = agent.apply(params, env_state.obs, method=Agent.get_value)
    return env_state, transitions, next_value


def bootstrap_truncations(rewards, values, truncations, next_value, gamma: float):
    """A time limit is not a death: a truncated step's reward gains gamma * V(its last observation).

    envpool returns that observation at the truncated step itself and resets the game only on the
    next step, so it is the observation stored for the following step: its value is values[t + 1],
    or next_value after the rollout's last step. rewards, values, truncations: (num_steps, num_envs).
    """
    following_values = jnp.concatenate([values[1:], next_value[None]])
    return rewards + gamma * following_values * truncations


def compute_gae(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimation as a reverse `lax.scan` over the steps.

    rewards, values, dones: (num_steps, num_envs); dones[t] = 1 if the transition at step t ended
    the (learning) episode. next_value: (num_envs,), the value of the observation after the last step.
    Returns (advantages, returns), both (num_steps, num_envs).
    """
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
    """The clipped PPO objective of one minibatch; returns the loss and the statistics to log.

    Means are over the played steps of the whole minibatch (`num_played`, all devices): this
    device's loss and statistics are its share of those means, so the shares of all devices add up
    to the minibatch's loss, gradient and statistics.
    """
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
    rewards = bootstrap_truncations(
        transitions.rewards, transitions.values, transitions.truncations, next_value, args.gamma
    )
    advantages, returns = compute_gae(
        rewards, transitions.values, transitions.dones.astype(jnp.float32), next_value, args.gamma, args.gae_lambda
    )
    flat = lambda x: x.reshape((-1,) + x.shape[2:])
    t = transitions
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


def update_minibatch(
    train_state: TrainState, epoch, minibatch, batch: Batch, perms, learning_rate, agent: Agent, tx, args: Args,
    axis_name: str,
):
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
    """All epochs and minibatches of one update as one compiled program: a `lax.scan` over epochs
    of `lax.scan`s over minibatches.

    --target-kl cannot break a compiled loop, so the epochs after the stop are skipped by a
    `lax.cond`. Returns the state, the last minibatch's statistics and the mean clip fraction of the
    minibatches that ran.
    """
    step = partial(update_minibatch, batch=batch, perms=perms, learning_rate=learning_rate, agent=agent, tx=tx,
                   args=args, axis_name=axis_name)

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
    clipfrac = (stats["clipfrac"] * ran[:, None]).sum() / (ran.sum() * args.num_minibatches)
    return train_state, last_stats, clipfrac


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
@partial(jax.jit, static_argnums=0)
def init_params(agent: Agent, key):
    return agent.init(key, jnp.zeros((1, 4, 84, 84), jnp.uint8), key, method=Agent.get_action_and_value)


def save_model(path: str, params, args: Args, num_actions: int):
    # msgpack of plain arrays, written to a temporary file and renamed, so a crash never leaves a
    # truncated checkpoint.
    payload = {"params": flax.serialization.to_state_dict(jax.device_get(params)), "args": vars(args),
               "num_actions": num_actions}
    with open(path + ".tmp", "wb") as f:
        f.write(flax.serialization.msgpack_serialize(payload))
    os.replace(path + ".tmp", path)


def load_model(path: str) -> tuple[int, Any, dict]:
    """Returns (num_actions, params, saved args)."""
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        with open(path, "rb") as f:
            payload = flax.serialization.msgpack_restore(f.read())
        num_actions = int(payload["num_actions"])
        template = init_params(Agent(num_actions), jax.random.key(0))
        params = flax.serialization.from_state_dict(template, payload["params"])
        for saved, expected in zip(jax.tree.leaves(params), jax.tree.leaves(template), strict=True):
            if saved.shape != expected.shape or saved.dtype != expected.dtype:
                raise ValueError("parameter shapes differ")
        saved_args = dict(payload["args"])
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return num_actions, params, saved_args


# Arguments a resumed run may change: how it is watched and saved, and the devices it runs on (the
# job's batch, minibatches and environments stay the run's), not what it learns.
RESUMABLE_CHANGES = {
    "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "eval_checkpoint", "eval_episodes",
    "progress_interval", "checkpoint_every", "resume", "coordinator_address", "num_processes", "process_id",
    "num_devices", "local_num_envs", "local_batch_size",
}


def script_digest() -> str:
    """The SHA-256 of this file: a resumed run says when the code changed since its checkpoint."""
    with open(__file__, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def lock_run(folder: str):
    """Holds the run's checkpoint folder for this process, as long as the returned file stays open:
    a second process resuming the same run (a job started twice, a trainer that outlived its
    runner) would log every step twice and remove the other's checkpoints."""
    os.makedirs(folder, exist_ok=True)
    lock = open(os.path.join(folder, "lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        fail(f"{folder} is in use: another process is running this run (stop it, or wait for it to end)")
    return lock


def save_checkpoint(folder: str, iteration: int, global_step: int, train_state: TrainState, key, env0_games: int,
                    recent_returns: deque, args: Args, run_name: str) -> str:
    """Everything a resumed run needs (train_state: host arrays), as msgpack. Written to a temporary
    file, synced and renamed, so a crash leaves either the previous checkpoint or this one, never a
    truncated file. The newest two are kept."""
    path = os.path.join(folder, f"iteration-{iteration:07d}.msgpack")
    payload = {
        "train_state": flax.serialization.to_state_dict(train_state), "key": np.asarray(jax.random.key_data(key)),
        "iteration": iteration, "global_step": global_step,
        "env0_games": env0_games,  # the games env 0 finished: a resumed run numbers its videos on
        "recent_returns": list(recent_returns), "args": vars(args), "run_name": run_name,
        "script_sha256": script_digest(),
    }
    with open(path + ".tmp", "wb") as f:
        f.write(flax.serialization.msgpack_serialize(payload))
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    directory = os.open(folder, os.O_RDONLY)  # the rename itself must reach the disk too
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    for older in sorted(glob.glob(os.path.join(folder, "iteration-*.msgpack")))[:-2]:
        os.remove(older)
    return path


def read_checkpoint(resume: str, args: Args, template: TrainState) -> dict | None:
    """The checkpoint `--resume` names, its train state rebuilt on `template` (host arrays), or None
    when `auto` finds none. Its run's arguments must be this command's, but for RESUMABLE_CHANGES."""
    if resume == "auto":
        run_prefix = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__"
        found = glob.glob(os.path.join("runs", f"{glob.escape(run_prefix)}*", "checkpoints", "iteration-*.msgpack"))
        if not found:
            print(f"--resume auto: no checkpoint of {run_prefix}* in runs/, starting a new run")
            return None
        path = max(found, key=os.path.getmtime)
        print(f"--resume auto: {path}, the newest by modification time of {len(found)} checkpoint(s) of {run_prefix}*")
    else:
        path = resume
    if not os.path.isfile(path):
        fail(f"--resume {path!r}: no such checkpoint file (pass a runs/*/checkpoints/iteration-*.msgpack file or auto)")
    try:
        with open(path, "rb") as f:
            payload = flax.serialization.msgpack_restore(f.read())
        payload["iteration"], payload["global_step"], payload["run_name"]
        saved_args = dict(payload["args"])
        train_state = flax.serialization.from_state_dict(template, payload["train_state"])
        for saved, expected in zip(jax.tree.leaves(train_state), jax.tree.leaves(template), strict=True):
            if saved.shape != expected.shape or saved.dtype != expected.dtype:
                raise ValueError("parameter shapes differ")
        payload["train_state"], payload["key"] = train_state, jax.random.wrap_key_data(payload["key"])
    except Exception as e:  # an unreadable file, or a saved model instead of a checkpoint
        fail(f"--resume {path!r} is not a readable {os.path.basename(__file__)} checkpoint ({type(e).__name__})")
    for name, value in vars(args).items():
        if name not in RESUMABLE_CHANGES and saved_args.get(name) != value:
            fail(f"--resume: the checkpoint's run has {name}={saved_args.get(name)!r}, this command {value!r}: "
                 "resume with the run's arguments")
    payload["path"] = path
    return payload


def evaluate(
    agent: Agent, params, env_id: str, eval_episodes: int, seed: int = 0, repeat_action_probability: float = 0.0,
    max_episode_steps: int = 27_000, num_steps: int = 128, video_folder: str | None = None, upload: bool = False,
) -> tuple[list[float], list[int]]:
    """Plays `eval_episodes` full games (all lives, unclipped score) with the sampled policy;
    returns their scores and lengths, env by env (env 0's games first).

    The games run in the training rollout, compiled, on the training environment (episodic life:
    envpool presses FIRE after each lost life, which an agent trained on it may never have learned).
    With `video_folder`, env 0's games are recorded there (and uploaded to wandb with `upload`).
    """
    num_envs = min(8, eval_episodes)
    # Each env plays a fixed quota of games: keeping only the first games to finish would favour
    # short (bad) games.
    quota = [eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)]
    envs = make_envs(env_id, num_envs, repeat_action_probability, seed, max_episode_steps)
    recorder = None
    if video_folder is not None:
        recorder = VideoRecorder(
            video_folder, env_id, seed, repeat_action_probability, max_episode_steps, max_games=quota[0], upload=upload
        )
    handle, _, _, env_step = envs.xla()
    obs, _ = envs.reset()
    episode = EpisodeStatistics(np.zeros(num_envs, np.float32), np.zeros(num_envs, np.int32))
    env_state = EnvState(handle, obs, np.zeros(num_envs, bool), episode)
    play = jax.jit(partial(rollout, agent, env_step, num_steps=num_steps))
    games = [[] for _ in range(num_envs)]  # (return, length) of each env's games
    key = jax.random.fold_in(jax.random.key(seed), 1)  # not the stream training started from
    while any(len(g) < q for g, q in zip(games, quota)):
        key, rollout_key = jax.random.split(key)
        env_state, t, _ = play(params, env_state, rollout_key)
        game_over, episodic_returns, episodic_lengths = (
            np.asarray(x) for x in (t.game_over, t.episodic_returns, t.episodic_lengths)
        )
        if recorder is not None:
            recorder.add(t.actions[:, 0], game_over[:, 0], episodic_returns[:, 0])
        for step, i in zip(*np.nonzero(game_over)):
            if len(games[i]) < quota[i]:
                games[i].append((float(episodic_returns[step, i]), int(episodic_lengths[step, i])))
    envs.close()
    if recorder is not None:
        recorder.close()
    games = [game for env_games in games for game in env_games]
    return [r for r, _ in games], [length for _, length in games]


def run_evaluation(args: Args, writer: SummaryWriter, run_name: str, agent: Agent | None = None, params=None):
    if params is None:
        num_actions, params, saved_args = load_model(args.eval_checkpoint)
        env_id = saved_args["env_id"]
        # The games are played under this command's emulator settings, not necessarily the training run's
        for name in ("repeat_action_probability", "max_episode_steps"):
            if name in saved_args and saved_args[name] != getattr(args, name):
                print(f"warning: evaluating with --{name.replace('_', '-')} {getattr(args, name)}; "
                      f"the model was trained with {saved_args[name]}", file=sys.stderr)
        agent = Agent(num_actions, jnp.bfloat16 if args.mixed_precision == "bf16" else jnp.float32)
    else:
        env_id = args.env_id
    returns, lengths = evaluate(
        agent, params, env_id, args.eval_episodes, args.seed, args.repeat_action_probability, args.max_episode_steps,
        video_folder=f"videos/{run_name}-eval" if args.capture_video else None, upload=args.track,
    )
    for i, (episodic_return, length) in enumerate(zip(returns, lengths)):
        print(f"eval_episode={i}, episodic_return={episodic_return}")
        writer.add_scalar("eval/episodic_return", episodic_return, i)
        writer.add_scalar("eval/episodic_length", length, i)
    print(f"eval: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} games")
    return returns


# ---------------------------------------------------------------------------------------------
# Progress display
# ---------------------------------------------------------------------------------------------
class Progress:
    """The progress line on stderr: rewritten in place on a terminal; off one (a log file, Slurm,
    nohup), where nobody sees a rewritten line, a plain line at most every `interval` seconds, and
    always the first and the last one."""

    def __init__(self, total: int, interval: float):
        self.total, self.interval, self.printed_at = total, interval, None

    def show(self, global_step: int, sps: int, recent_returns: deque):
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "-"
        eta = (self.total - global_step) / max(sps, 1)
        line = (
            f"{global_step:,}/{self.total:,} steps | {sps:,} SPS | return (last {len(recent_returns)}) {recent}"
            f" | ETA {int(eta // 3600)}:{int(eta % 3600 // 60):02d}:{int(eta % 60):02d}"
        )
        last = global_step >= self.total
        if sys.stderr.isatty():
            print(f"\r{line}   ", end="\n" if last else "", file=sys.stderr, flush=True)
        elif self.printed_at is None or last or time.monotonic() - self.printed_at >= self.interval:
            print(line, file=sys.stderr, flush=True)
            self.printed_at = time.monotonic()


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def main(args: Args):
    coordinator_address = args.coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
    if not coordinator_address and (args.num_processes is not None or args.process_id is not None):
        fail("--num-processes and --process-id need --coordinator-address (or $JAX_COORDINATOR_ADDRESS)")
    if coordinator_address:
        # Several hosts: every process runs this script; jax.distributed joins their devices into one job.
        env_int = lambda name: int(os.environ[name]) if name in os.environ else None
        jax.distributed.initialize(
            coordinator_address,
            args.num_processes if args.num_processes is not None else env_int("JAX_NUM_PROCESSES"),
            args.process_id if args.process_id is not None else env_int("JAX_PROCESS_ID"),
        )

    counts = (args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs, args.max_episode_steps,
              args.eval_episodes)
    if min(counts) < 1:
        fail(
            "--num-envs, --num-steps, --num-minibatches, --update-epochs, --max-episode-steps and --eval-episodes"
            " must be positive"
        )
    args.num_devices = jax.device_count()
    if args.num_envs % args.num_devices != 0:
        fail(
            f"--num-envs {args.num_envs} does not split evenly over {args.num_devices} devices;"
            f" use a multiple of {args.num_devices}"
        )
    args.local_num_envs = args.num_envs // args.num_devices
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.batch_size = args.local_batch_size * args.num_devices
    if args.local_batch_size % args.num_minibatches != 0:
        fail(
            f"each device's batch, num_envs / devices * num_steps = {args.local_batch_size}, is not divisible by"
            f" --num-minibatches {args.num_minibatches}"
        )
    args.minibatch_size = args.batch_size // args.num_minibatches
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    args.num_iterations = args.total_timesteps // args.batch_size
    envpool_task(args.env_id)  # an unknown env id fails here, before anything is written
    if args.eval_checkpoint is None and args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} steps)")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}")

    # Logging is process 0's job; every process trains.
    is_main = jax.process_index() == 0
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    training = args.eval_checkpoint is None
    if not training:
        if is_main:
            if args.track:
                import wandb

                wandb.init(project=args.wandb_project_name, entity=args.wandb_entity, sync_tensorboard=True,
                           config=vars(args), name=run_name, save_code=True)
            writer = SummaryWriter(f"runs/{run_name}")
            run_evaluation(args, writer, run_name)
            writer.close()
        return

    # The agent and its optimizer come first: a checkpoint is read back into their shapes.
    # Adam's learning rate is applied by the update (annealed per iteration), not by optax.
    key = jax.random.key(args.seed)
    key, init_key = jax.random.split(key)
    num_actions = int(envpool.make_spec(envpool_task(args.env_id)).action_space.n)
    agent = Agent(num_actions, jnp.bfloat16 if args.mixed_precision == "bf16" else jnp.float32)
    tx = optax.chain(optax.clip_by_global_norm(args.max_grad_norm), optax.scale_by_adam(eps=1e-5))
    init = lambda key: TrainState(params := init_params(agent, key), tx.init(params))
    mesh = Mesh(np.array(jax.devices()), ("devices",))
    replicated = NamedSharding(mesh, P())
    train_state = jax.jit(init, out_shardings=replicated)(init_key)  # the same on every device

    # Every process reads the checkpoint (several hosts: from the runs/ they share) and checks that
    # they all found the same one.
    checkpoint = None
    if args.resume is not None:
        checkpoint = read_checkpoint(args.resume, args, jax.eval_shape(init, init_key))
    if jax.process_count() > 1:
        found = multihost_utils.process_allgather(np.int64(checkpoint["global_step"] if checkpoint else -1))
        if len(set(found.tolist())) > 1:
            fail(f"--resume: the processes found different checkpoints (at steps {found.tolist()}, -1: none)")
    start_iteration, global_step, env0_games = 0, 0, 0
    recent_returns = deque(maxlen=20)
    if checkpoint is not None:
        run_name = checkpoint["run_name"]  # a resumed run goes on in its own directory
        # every process holds the same host arrays: together they make the replicated state
        to_devices = partial(jax.make_array_from_process_local_data, replicated)
        train_state = jax.tree.map(to_devices, checkpoint["train_state"])
        key, start_iteration, global_step = checkpoint["key"], checkpoint["iteration"], checkpoint["global_step"]
        env0_games = checkpoint["env0_games"]
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if is_main and (args.checkpoint_every or checkpoint) else None

    writer = None
    if is_main:
        if args.track:
            import wandb

            wandb.init(
                project=args.wandb_project_name,
                entity=args.wandb_entity,
                sync_tensorboard=True,
                config=vars(args),
                name=run_name,
                id=run_name,  # a resumed run continues the same wandb run
                resume="allow",
                save_code=True,
            )
        # A resumed run hides whatever the interrupted one logged after its checkpoint: no step twice.
        writer = SummaryWriter(f"runs/{run_name}", purge_step=global_step + 1 if checkpoint else None)
        if checkpoint is None:
            writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
            )
        else:
            print(f"resumed {run_name} at iteration {start_iteration} (step {global_step:,}) from {checkpoint['path']}",
                  flush=True)
            if checkpoint["script_sha256"] != script_digest():
                print(f"warning: {os.path.basename(__file__)} has changed since the checkpoint was written: "
                      "the run goes on with the code as it is now", flush=True)
    del checkpoint

    # Devices: one mesh axis over every device of the job. Each device of this process gets its own
    # envpool and its share of the environments; environment i of the job has seed seed + i. The games
    # in progress at a checkpoint are not in it (nor logged): a resumed run starts new games, on seeds
    # the run has not used (seed + iteration * num_envs + i).
    local_devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    device_index = {d: i for i, d in enumerate(mesh.devices.flat)}
    env_seed = args.seed + start_iteration * args.num_envs
    if is_main:
        print(
            f"{args.num_devices} {jax.default_backend()} device(s) on {jax.process_count()} process(es):"
            f" {args.num_envs} envs ({args.local_num_envs} per device), batch {args.batch_size},"
            f" minibatch {args.minibatch_size}, {args.num_iterations} iterations"
        )

    env_threads = max(1, (os.cpu_count() or 1) // len(local_devices))
    envs, env_states, env_steps = [], [], []
    for device in local_devices:
        env = make_envs(
            args.env_id, args.local_num_envs, args.repeat_action_probability,
            env_seed + device_index[device] * args.local_num_envs, args.max_episode_steps,
            num_threads=min(args.local_num_envs, env_threads),
        )
        handle, _, _, env_step = env.xla()
        obs, _ = env.reset()
        n = args.local_num_envs
        episode = EpisodeStatistics(np.zeros(n, np.float32), np.zeros(n, np.int32))
        envs.append(env)
        env_states.append(jax.device_put(EnvState(handle, obs, np.zeros(n, bool), episode), device))
        env_steps.append(env_step)
    recorder = None
    if args.capture_video and is_main:
        # The first env of this process's first device: env 0 of the job on process 0.
        recorder = VideoRecorder(
            f"videos/{run_name}", args.env_id, env_seed + device_index[local_devices[0]] * args.local_num_envs,
            args.repeat_action_probability, args.max_episode_steps, upload=args.track, first_game=env0_games,
        )
    # One compiled rollout per device: envpool's XLA calls name their envpool in the program itself.
    rollouts = [jax.jit(partial(rollout, agent, env_step, num_steps=args.num_steps)) for env_step in env_steps]

    # The update, as programs over all devices (shard_map: each device sees its own share).
    def sharded(f, in_specs, out_specs, **jit_kwargs):
        # check_vma=False: the functions sum over devices themselves (psum), as the torch scripts all-reduce.
        per_device = jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)
        return jax.jit(per_device, **jit_kwargs)

    by_env, by_sample = P(None, "devices"), P("devices")
    prepare = sharded(
        partial(prepare_batch, args=args, axis_name="devices"), (by_env, by_sample, P()), (by_sample, by_env, P())
    )
    update = sharded(
        partial(update_epochs, agent=agent, tx=tx, args=args, axis_name="devices"), (P(), by_sample, by_env, P()), P(),
        donate_argnums=0,
    )

    def on_device(tree, device):
        """The copy of a replicated array tree that `device` holds, as a plain array of that device (no copy)."""
        shard = lambda x: next(s.data for s in x.addressable_shards if s.device == device)
        return jax.tree.map(lambda x: jax.device_put(shard(x), device), tree)

    def global_array(arrays, axis: int, spec):
        """Joins this process's per-device arrays along `axis` into one array over the job's devices."""
        shape = list(arrays[0].shape)
        shape[axis] *= args.num_devices
        return jax.make_array_from_single_device_arrays(tuple(shape), NamedSharding(mesh, spec), list(arrays))

    host = lambda x: np.asarray(x.addressable_data(0))  # a replicated value, read on this process

    start_time, start_global_step, sps = time.time(), global_step, 0
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        learning_rate = args.learning_rate
        if args.anneal_lr:
            learning_rate *= 1.0 - (iteration - 1.0) / args.num_iterations

        # Rollout: each device plays its envs; the calls are asynchronous, so the devices run at once.
        key, rollout_key, update_key = jax.random.split(key, 3)
        outputs = []
        for device, play, env_state in zip(local_devices, rollouts, env_states):
            device_key = jax.device_put(jax.random.fold_in(rollout_key, device_index[device]), device)
            outputs.append(play(on_device(train_state.params, device), env_state, device_key))
        env_states = [env_state for env_state, _, _ in outputs]
        transitions = jax.tree.map(lambda *xs: global_array(xs, 1, by_env), *[t for _, t, _ in outputs])
        next_value = global_array([v for _, _, v in outputs], 0, by_sample)

        batch, perms, explained_var = prepare(transitions, next_value, update_key)
        train_state, stats, clipfrac = update(train_state, batch, perms, learning_rate)

        # The games that ended, in the job's order: the env steps of one vector step count as
        # consecutive global steps, env 0 first, so every game is logged at a step of its own.
        game_over, episodic_returns, episodic_lengths = multihost_utils.process_allgather(
            (transitions.game_over, transitions.episodic_returns, transitions.episodic_lengths), tiled=True
        )
        env0_games += int(game_over[:, 0].sum())
        for step, i in zip(*np.nonzero(game_over)):
            game_step = global_step + step * args.num_envs + i + 1
            recent_returns.append(float(episodic_returns[step, i]))
            if is_main:
                writer.add_scalar("charts/episodic_return", episodic_returns[step, i], game_step)
                writer.add_scalar("charts/episodic_length", episodic_lengths[step, i], game_step)
        if recorder is not None:
            recorded = outputs[0][1]  # the transitions of this process's first device
            recorder.add(recorded.actions[:, 0], recorded.game_over[:, 0], recorded.episodic_returns[:, 0])
        global_step += args.batch_size

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        if is_main:
            writer.add_scalar("charts/learning_rate", learning_rate, global_step)
            writer.add_scalar("losses/value_loss", host(stats["value_loss"]), global_step)
            writer.add_scalar("losses/policy_loss", host(stats["policy_loss"]), global_step)
            writer.add_scalar("losses/entropy", host(stats["entropy"]), global_step)
            writer.add_scalar("losses/old_approx_kl", host(stats["old_approx_kl"]), global_step)
            writer.add_scalar("losses/approx_kl", host(stats["approx_kl"]), global_step)
            writer.add_scalar("losses/clipfrac", host(clipfrac), global_step)
            writer.add_scalar("losses/explained_variance", host(explained_var), global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            progress.show(global_step, sps, recent_returns)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            if is_main:
                writer.flush()  # everything up to this checkpoint is on disk before it counts
                host_state = jax.device_get(on_device(train_state, local_devices[0]))
                path = save_checkpoint(checkpoint_folder, iteration, global_step, host_state, key, env0_games,
                                       recent_returns, args, run_name)
                print(f"checkpoint {path}", flush=True)

    # Every device must hold the same parameters: the same gradient is applied everywhere.
    as_bytes = lambda params: b"".join(np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(params))
    digests = [hashlib.sha256(as_bytes(on_device(train_state.params, d))).hexdigest()[:16] for d in local_devices]
    print(f"process {jax.process_index()}: parameters sha256 per device {' '.join(digests)}")
    if is_main:
        recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
        print(
            f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
            f"mean return of the last {len(recent_returns)} games {recent}"
        )
    for env in envs:
        env.close()
    if recorder is not None:
        recorder.close()

    if args.save_model and is_main:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        params = on_device(train_state.params, local_devices[0])
        save_model(model_path, params, args, num_actions)
        print(f"model saved to {model_path}")
        run_evaluation(args, writer, run_name, agent, params)
    if is_main:
        writer.close()
    if run_lock is not None:
        run_lock.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
