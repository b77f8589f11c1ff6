"""PPO on Atari (gymnasium 1.x + ale-py), data parallel under torchrun, one file.

The PPO of ppo_atari.py spread over N processes by `torchrun`: on one machine or several, on
CPUs (gloo) or GPUs (nccl). Each process plays its own `--local-num-envs` games and learns on its
share of every minibatch; the gradients are averaged over the processes with one all-reduce per
minibatch, so every process holds bit-identical weights. With `--checkpoint-every` a run can be
resumed (`--resume`), also by torchrun itself when it restarts failed workers (`--max-restarts`) or
when nodes join and leave (`--nnodes=MIN:MAX`). With `--env-split measured`, processes of unequal
speed get shares of the environments in proportion to their measured speed: none waits for a slow one.
Docs: docs/ppo_atari_multigpu.md
"""

import fcntl
import functools
import glob
import hashlib
import json
import math
import os
import queue
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401 (imported before the process group exists: see start_process_group)
import torch.nn as nn
import torch.optim as optim
import tyro
from ale_py.vector_env import AtariVectorEnv
from torch.distributed.elastic.multiprocessing.errors import ErrorHandler, record
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
    """if toggled, games 0, 1, 8, 27, ..., then every 1000th game of env 0 of rank 0 are saved as RGB mp4 files to `videos/{run_name}/`"""
    save_model: bool = False
    """if toggled, the model is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 autocasts the network's forward passes; loss, advantages, gradient all-reduce and optimizer stay fp32"""
    progress_interval: float = 30.0
    """seconds between plain progress lines when stderr is not a terminal (log files, Slurm, nohup)"""

    # Environment
    env_id: str = "BreakoutNoFrameskip-v4"
    """the game: `BreakoutNoFrameskip-v4`, `ALE/Breakout-v5` and `Breakout-v5` all name Breakout"""
    repeat_action_probability: float = 0.0
    """sticky actions; 0 is the NoFrameskip-v4 / envpool convention behind the published PPO scores"""
    max_episode_steps: int = 27_000
    """the time limit of a game in agent steps (108,000 emulator frames, as the v5 games); a game stopped by it is bootstrapped, not treated as a death"""

    # Algorithm
    total_timesteps: int = 10_000_000
    """total environment steps (agent steps, each 4 emulator frames) of the whole job"""
    learning_rate: float = 2.5e-4
    """the learning rate of the optimizer"""
    local_num_envs: int = 8
    """the number of parallel game environments in each process"""
    num_envs: int | None = None
    """the number of environments of the whole job, split over the processes by --env-split (instead of local_num_envs)"""
    num_steps: int = 128
    """the number of steps run in each environment per policy rollout"""
    anneal_lr: bool = True
    """toggle learning rate annealing to zero over the run"""
    gamma: float = 0.99
    """the discount factor gamma"""
    gae_lambda: float = 0.95
    """the lambda for the general advantage estimation"""
    num_minibatches: int = 4
    """the number of mini-batches (each process contributes a share of every one, in proportion to its environments)"""
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

    # Scale-out
    backend: str = "auto"
    """the torch.distributed backend: `nccl`, `gloo`, or `auto` (nccl when each process has a GPU, gloo otherwise)"""
    device_ids: list[int] | None = None
    """the GPU of each process on a node, indexed by LOCAL_RANK; unset, process LOCAL_RANK uses cuda:LOCAL_RANK"""
    env_split: Literal["even", "measured"] = "even"
    """how the job's environments are split over the processes: `even`, or `measured`: in proportion to each process's measured speed (for processes of unequal speed)"""
    split_every: int = 10
    """with --env-split measured: the iterations of one speed measurement, after which the split may change"""
    split_threshold: float = 0.1
    """with --env-split measured: the split changes only when the new one is predicted to shorten the job's iteration by more than this fraction (noise does not make it flap)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never)"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: of the checkpoints in runs/ of this env_id, exp_name and seed, the newest by modification time (none: a new run)"""

    # Computed at run time (hidden from the command line: a value given there would be overwritten)
    world_size: tyro.conf.Suppress[int] = 0
    """the number of processes of the job (torchrun's WORLD_SIZE)"""
    batch_size: tyro.conf.Suppress[int] = 0
    """the batch size of the whole job (num_envs * num_steps)"""
    local_batch_size: tyro.conf.Suppress[int] = 0
    """the batch size of this process (local_num_envs * num_steps)"""
    minibatch_size: tyro.conf.Suppress[int] = 0
    """the mini-batch size of the whole job (batch_size // num_minibatches)"""
    local_minibatch_size: tyro.conf.Suppress[int] = 0
    """the share of this process in each mini-batch (local_batch_size // num_minibatches)"""
    num_iterations: tyro.conf.Suppress[int] = 0
    """the number of iterations (total_timesteps // batch_size)"""


class UserError(Exception):
    """Bad input, raised by `fail`: the entry point (bottom of the file) prints it as one line and exits non-zero."""

    def __init__(self, message: str, printed: bool):
        super().__init__(message)
        self.printed = printed  # whether this rank prints it


def fail(message: str, all_ranks: bool = False):
    """A user error: one line naming the problem, a non-zero exit on every rank, no traceback.

    Errors every rank detects alike are printed by rank 0 alone; `all_ranks` prints a problem that only
    some processes see (a missing GPU, say) from each of them. Under torchrun every failing rank also
    records the line for torchrun's failure report (`OneLineUserErrors`)."""
    rank = int(os.environ.get("RANK", "0"))
    if all_ranks and rank != 0:
        message = f"(rank {rank}) {message}"
    raise UserError(message, printed=all_ranks or rank == 0)


class OneLineUserErrors(ErrorHandler):
    """Writes a failed worker's error to the file torchrun reads (TORCHELASTIC_ERROR_FILE) for the
    "Root Cause" of its failure report: a user error as its one `error:` line, any other exception
    with its traceback (torch's default). `record` passes SystemExit through unrecorded, hence `UserError`."""

    def record_exception(self, e: BaseException):
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not isinstance(e, UserError) or path is None:
            return super().record_exception(e)
        line = f"error: {e}"
        with open(path, "w") as f:
            extra = {"py_callstack": line, "timestamp": str(int(time.time()))}  # the box shows py_callstack
            json.dump({"message": {"message": line, "extraInfo": extra}}, f)


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


def make_envs(
    env_id: str,
    num_envs: int,
    repeat_action_probability: float,
    max_episode_steps: int = 27_000,
    noop_max: int = 30,
    rgb_frames: bool = False,
) -> AtariVectorEnv:
    # Life loss and reward clipping are applied by the training loop, not by the environment:
    # ale-py's `episodic_life=True` restarts the whole game at each life loss, which is not the
    # usual trick (the game goes on with its remaining lives). Keeping the real game here also
    # gives the episode statistics the full game's unclipped score.
    # SAME_STEP autoreset: a finished game's step already returns the next game's first
    # observation, so no fake transition enters the rollout.
    # rgb_frames: the same games, seen as full 210x160 RGB screens instead of the agent's stack of
    # 84x84 grayscale frames (for videos).
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


def capped_cubic(game: int) -> bool:
    """Games 0, 1, 8, 27, ..., 729, then every 1000th: many videos early, few in a long run."""
    return round(game ** (1 / 3)) ** 3 == game if game < 1000 else game % 1000 == 0


STOP = object()  # tells the encoder thread to finish


class VideoRecorder:
    """Records games of env 0 as RGB mp4 files, `{folder}/game-{k}.mp4` for the k-th game.

    The C++ vector env returns only the agent's 84x84 grayscale stacks, so a one-env shadow of
    env 0 (same game, seed and settings, full 210x160 RGB screens) is given env 0's actions and
    plays the identical game. Frames stream to a background thread that encodes them with
    ffmpeg as they come: training never waits for an encoder, and a long game is never held in
    memory. `close()` finishes the last file; under --track each finished file goes to wandb.
    """

    def __init__(self, folder, env_id, seed, repeat_action_probability, max_episode_steps, schedule=capped_cubic,
                 first_game: int = 0, track: bool = False, fps: int = 30):
        import imageio_ffmpeg  # imported here: only video runs pay for it

        os.makedirs(folder, exist_ok=True)
        self.folder, self.schedule, self.game, self.track, self.fps = folder, schedule, first_game, track, fps
        self.shadow = make_envs(env_id, 1, repeat_action_probability, max_episode_steps, rgb_frames=True)
        screen, _ = self.shadow.reset(seed=seed)
        self.frames = queue.Queue(maxsize=1000)  # bounded: a stalled encoder slows training, never fills memory
        self.encoder = threading.Thread(target=self.encode, args=(imageio_ffmpeg,), daemon=True)
        self.encoder.start()
        self.start_game(screen)

    def start_game(self, screen):
        self.recording = self.schedule(self.game)
        if self.recording:
            self.frames.put(os.path.join(self.folder, f"game-{self.game}.mp4"))
            self.frames.put(screen[0, -1])

    def step(self, action_env0: int):
        screen, _, terminated, truncated, info = self.shadow.step(np.array([action_env0]))
        if terminated[0] or truncated[0]:
            if self.recording:
                self.frames.put(info["final_obs"][0, -1])
                self.frames.put(None)  # end of this file
            self.game += 1
            self.start_game(screen)
        elif self.recording:
            self.frames.put(screen[0, -1])

    def encode(self, imageio_ffmpeg):
        writer, path = None, None
        while True:
            item = self.frames.get()
            if isinstance(item, str):
                path = item
                writer = imageio_ffmpeg.write_frames(path, (160, 210), fps=self.fps, macro_block_size=1)
                writer.send(None)  # starts ffmpeg
            elif item is None or item is STOP:
                if writer is not None:
                    writer.close()
                    if self.track and item is None:
                        import wandb

                        wandb.log({"videos/game": wandb.Video(path, format="mp4")}, commit=False)
                writer = None
                if item is STOP:
                    return
            else:
                writer.send(np.ascontiguousarray(item))

    def close(self):
        """Waits for the encoder. A game still being played is kept up to its last frame so far."""
        self.frames.put(STOP)
        self.encoder.join()
        self.shadow.close()


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
        # obs: (batch, 4, 84, 84) uint8. Channels-last lets the CPU and GPU conv kernels run
        # without layout shuffles: 1.6x faster updates on CPU. The layout changes while the
        # batch is still uint8, and the one conversion goes straight to the dtype the convs
        # compute in (bf16 under autocast), not through float32: a 1.4x faster bf16 update on
        # CPU, same numbers (0..255 are exact in bf16).
        device = obs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else torch.float32
        x = obs.contiguous(memory_format=torch.channels_last).to(dtype).div_(255.0)
        return self.network(x)

    def heads(self, hidden):
        # The two heads run in fp32 even under bf16 autocast: values and log-probabilities feed
        # GAE, value clipping and the probability ratio, where bf16's 3 significant digits would
        # show (value errors of 5e-3 were measured); the two small layers cost nothing.
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


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def compute_gae(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimation over one rollout.

    rewards, values, dones: (num_steps, num_envs); dones[t] = 1 if the transition at step t ended
    the (learning) episode. next_value: (num_envs,), the value of the observation after the last step.
    Returns (advantages, returns), both (num_steps, num_envs).
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


def ppo_loss(
    newlogprob, entropy, newvalue, logprobs, advantages, returns, values, args: Args
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
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
class CollectiveTime:
    """Seconds this process has spent in collective calls, mostly waiting for the slower processes.
    `--env-split measured` counts a process's work as its iteration time without them. On a GPU the
    calls are asynchronous: `cuda_sync` makes the clock wait for the GPU on entry and exit."""

    seconds = 0.0
    cuda_sync = False


def collective(function):
    @functools.wraps(function)
    def timed(*args, **kwargs):
        if CollectiveTime.cuda_sync:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            result = function(*args, **kwargs)
            if CollectiveTime.cuda_sync:
                torch.cuda.synchronize()
            return result
        finally:
            CollectiveTime.seconds += time.perf_counter() - start

    return timed


@collective
def global_mean_std(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation (unbiased, as `torch.std`) of the union of every rank's `x`.

    One all-reduce of each rank's (count, mean, sum of squared deviations), combined exactly
    (Chan et al.), in float64. Without a process group (or with one process) it is `x.mean(), x.std()`.
    """
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
    """The job's mean of a statistic each rank computed on its share: the sum over ranks of
    weight * x, where weight is the rank's fraction of the job's samples (1 / world size when equal)."""
    x = x * weight
    dist.all_reduce(x)
    return x


@collective
def average_gradients(agent: nn.Module, world_size: int, weight: float | None = None):
    """Replaces every gradient by its mean over the processes, weighted by their shares of the minibatch.

    Each rank's loss is a mean over its share, so the gradient of the whole minibatch is the sum over
    ranks of (share / minibatch) * gradient: `weight` is this rank's fraction of the minibatch (None:
    equal shares, 1 / world_size). One all-reduce of a single flat fp32 buffer, the fewest collective calls: faster than an all-reduce
    per parameter, as fast as DistributedDataParallel (whose default bucket holds the whole gradient)
    without its forward() wrapper (docs/ppo_atari_multigpu.md). The gradients are fp32 under bf16
    autocast too, since the parameters are.
    """
    if world_size == 1:
        return
    grads = [p.grad for p in agent.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    if weight is None:
        dist.all_reduce(flat)
        flat /= world_size
    else:
        flat *= weight
        dist.all_reduce(flat)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view(g.shape))
        offset += g.numel()


@collective
def gather_to_rank_0(obj, rank: int, world_size: int) -> list | None:
    """Every rank's `obj`, in a list on rank 0 (None on the other ranks)."""
    gathered = [None] * world_size if rank == 0 else None
    dist.gather_object(obj, gathered, dst=0)
    return gathered


def tensor_digest(tensors) -> str:
    """A hash of the tensors' bytes: equal digests mean bit-identical tensors."""
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def parameter_digest(agent: nn.Module) -> str:
    return tensor_digest(agent.state_dict().values())


def optimizer_digest(optimizer_state: dict) -> str:
    """A hash of an optimizer state_dict's tensors (Adam: step, exp_avg, exp_avg_sq of each parameter)."""
    state = optimizer_state["state"]
    return tensor_digest(tensor for i in sorted(state) for _, tensor in sorted(state[i].items()))


# ---------------------------------------------------------------------------------------------
# Saving and evaluation
# ---------------------------------------------------------------------------------------------
def save_model(path: str, agent: Agent, args: Args):
    # Written to a temporary file and renamed, so a crash never leaves a truncated checkpoint.
    payload = {"model": agent.state_dict(), "args": vars(args), "num_actions": agent.actor.out_features}
    torch.save(payload, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_model(path: str, device) -> tuple[Agent, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location=device, weights_only=True)
        agent = Agent(payload["num_actions"]).to(device)
        agent.load_state_dict(payload["model"])
        saved_args = dict(payload["args"])
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return agent.to(memory_format=torch.channels_last), saved_args


def rng_state(device) -> dict:
    """This process's random streams, in types `torch.load(weights_only=True)` reads back."""
    name, keys, position, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": (name, keys.tolist(), int(position), int(has_gauss), float(cached_gaussian)),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def set_rng_state(state: dict, device):
    random.setstate(state["python"])
    name, keys, position, has_gauss, cached_gaussian = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), position, has_gauss, cached_gaussian))
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def save_checkpoint(
    folder: str, agent: Agent, optimizer, iteration: int, global_step: int, rng_states: list, env0_games: int,
    args: Args, run_name: str, env_split: list[int] | None = None,
) -> str:
    """Everything a resumed run needs. Written to a temporary file, synced and renamed, so a crash
    leaves either the previous checkpoint or this one, never a truncated file. The newest two are kept."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"iteration-{iteration:07d}.pt")
    payload = {
        "model": agent.state_dict(),
        "optimizer": optimizer.state_dict(),
        "iteration": iteration,
        "global_step": global_step,
        "rng_states": rng_states,  # one per rank
        "env0_games": env0_games,  # the games rank 0's env 0 finished: a resumed run numbers its videos on
        "env_split": env_split or [args.num_envs // args.world_size] * args.world_size,  # environments per rank
        "args": vars(args),
        "run_name": run_name,
    }
    with open(path + ".tmp", "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    directory = os.open(folder, os.O_RDONLY)  # the rename itself must reach the disk too
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    for older in sorted(glob.glob(os.path.join(folder, "iteration-*.pt")))[:-2]:
        os.remove(older)
    return path


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


def read_checkpoint(resume: str, run_prefix: str) -> dict | None:
    """The checkpoint `--resume` names, or None when `auto` finds none."""
    if resume == "auto":
        found = glob.glob(os.path.join("runs", f"{glob.escape(run_prefix)}*", "checkpoints", "iteration-*.pt"))
        if not found:
            print(f"--resume auto: no checkpoint of {run_prefix}* in runs/, starting a new run")
            return None
        path = max(found, key=os.path.getmtime)
        print(f"--resume auto: {path}, the newest by modification time of {len(found)} checkpoints of {run_prefix}*")
    else:
        path = resume
    if not os.path.isfile(path):
        fail(f"--resume {path!r}: no such checkpoint file (pass a runs/*/checkpoints/iteration-*.pt file or auto)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        payload["iteration"], payload["global_step"], payload["rng_states"], payload["model"], payload["optimizer"]
        payload["env0_games"], payload["run_name"]
        [payload["args"][name] for name in ("num_envs", *RESUME_MUST_MATCH)]
    except Exception as e:  # an unreadable file or a saved model instead of a checkpoint
        fail(f"--resume {path!r} is not a readable {os.path.basename(__file__)} checkpoint ({type(e).__name__})")
    payload["path"] = path
    return payload


def evaluate(
    agent: Agent,
    env_id: str,
    eval_episodes: int,
    device,
    seed: int = 0,
    repeat_action_probability: float = 0.0,
    max_episode_steps: int = 27_000,
    video_folder: str | None = None,
    mixed_precision: str = "none",
) -> list[float]:
    """Plays `eval_episodes` full games (all lives, unclipped score) with the sampled policy."""
    num_envs = min(8, eval_episodes)
    # Each env plays a fixed quota of games: keeping only the first games to finish would favour
    # short (bad) games.
    quota = np.array([eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)])
    envs = make_envs(env_id, num_envs, repeat_action_probability, max_episode_steps)
    stats = EpisodeStatistics(num_envs)
    if video_folder is not None:  # every evaluation game of env 0
        video = VideoRecorder(
            video_folder, env_id, seed, repeat_action_probability, max_episode_steps, schedule=lambda game: game < quota[0]
        )
    returns = [[] for _ in range(num_envs)]
    obs, _ = envs.reset(seed=seed)
    while any(len(r) < q for r, q in zip(returns, quota)):
        with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=mixed_precision == "bf16"):
            action, _, _, _ = agent.get_action_and_value(torch.from_numpy(obs).to(device))
        action = action.cpu().numpy()
        obs, reward, terminated, truncated, info = envs.step(action)
        game_over = terminated | truncated
        if video_folder is not None:
            video.step(action[0])
        for i, episodic_return, _ in stats.step(reward, game_over):
            if len(returns[i]) < quota[i]:
                returns[i].append(episodic_return)
    envs.close()
    if video_folder is not None:
        video.close()
    return [r for env_returns in returns for r in env_returns]


def run_evaluation(args: Args, device, writer: SummaryWriter | None, run_name: str, agent: Agent | None = None):
    if agent is None:
        agent, saved_args = load_model(args.eval_checkpoint, device)
        env_id = saved_args["env_id"]
        # The games are played under this command's emulator settings, not necessarily the training run's
        for name in ("repeat_action_probability", "max_episode_steps"):
            if name in saved_args and saved_args[name] != getattr(args, name):
                print(f"warning: evaluating with --{name.replace('_', '-')} {getattr(args, name)}; "
                      f"the model was trained with {saved_args[name]}", file=sys.stderr)
    else:
        env_id = args.env_id
    video_folder = f"videos/{run_name}-eval" if args.capture_video else None
    returns = evaluate(
        agent, env_id, args.eval_episodes, device, args.seed, args.repeat_action_probability, args.max_episode_steps,
        video_folder, args.mixed_precision,
    )
    for i, episodic_return in enumerate(returns):
        print(f"eval_episode={i}, episodic_return={episodic_return}")
        if writer is not None:
            writer.add_scalar("eval/episodic_return", episodic_return, i)
    print(f"eval: mean return {np.mean(returns):.2f} +- {np.std(returns):.2f} over {len(returns)} games")
    return returns


# ---------------------------------------------------------------------------------------------
# Progress display
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def derive_sizes(args: Args):
    """The job's sizes from the per-process ones (or from --num-envs). Every rank computes the same from
    the same input, so a bad combination stops all of them before any collective call: no rank is left waiting.
    The sizes of this process's share are set by `take_share`."""
    counts = (args.local_num_envs, args.num_steps, args.num_minibatches, args.update_epochs, args.eval_episodes)
    if min(*counts, args.max_episode_steps, args.split_every, 1 if args.num_envs is None else args.num_envs) < 1:
        fail(
            "--local-num-envs, --num-envs, --num-steps, --num-minibatches, --update-epochs, --eval-episodes, "
            "--max-episode-steps and --split-every must be positive"
        )
    if not 0 <= args.split_threshold < 1:
        fail(f"--split-threshold {args.split_threshold} must be at least 0 and below 1")
    if args.num_envs is None:
        args.num_envs = args.local_num_envs * args.world_size
    # Each process cuts its own rollout into the minibatches: all run the same number of them.
    granularity = split_granularity(args.num_steps, args.num_minibatches)
    if args.env_split == "even":
        if args.num_envs % args.world_size != 0:
            fail(f"--num-envs {args.num_envs} cannot be split evenly over {args.world_size} processes")
        local_batch_size = args.num_envs // args.world_size * args.num_steps
        if local_batch_size % args.num_minibatches != 0:
            fail(
                f"local_num_envs * num_steps = {local_batch_size} is not divisible by num_minibatches = "
                f"{args.num_minibatches}"
            )
    elif args.num_envs % granularity != 0 or args.num_envs < granularity * args.world_size:
        fail(
            f"--env-split measured gives each process a multiple of {granularity} environments (a rollout of "
            f"{args.num_steps} steps that divides into {args.num_minibatches} minibatches): --num-envs "
            f"{args.num_envs} must be a multiple of {granularity} and at least {granularity * args.world_size}"
        )
    args.batch_size = args.num_envs * args.num_steps
    args.minibatch_size = args.batch_size // args.num_minibatches
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    args.num_iterations = args.total_timesteps // args.batch_size


def split_granularity(num_steps: int, num_minibatches: int) -> int:
    """The fewest environments whose rollout divides into the minibatches: each process's share is a multiple of it."""
    return num_minibatches // math.gcd(num_steps, num_minibatches)


def even_split(num_envs: int, world_size: int, granularity: int) -> list[int]:
    """Environments per process, as equal as multiples of `granularity` allow."""
    units = num_envs // granularity
    return [(units // world_size + (rank < units % world_size)) * granularity for rank in range(world_size)]


def balanced_split(num_envs: int, seconds_per_env: list[float], granularity: int) -> list[int]:
    """Environments per process for processes whose iteration takes `seconds_per_env` per environment:
    the split whose slowest process finishes first. One share (of `granularity` environments) each, then
    every further share to the process that would finish it soonest."""
    split = [granularity] * len(seconds_per_env)
    for _ in range(num_envs // granularity - len(split)):
        soonest = min(range(len(split)), key=lambda rank: (split[rank] + granularity) * seconds_per_env[rank])
        split[soonest] += granularity
    return split


def iteration_seconds(split: list[int], seconds_per_env: list[float]) -> float:
    """The job's iteration time for a split: that of its slowest process (every process waits for it)."""
    return max(envs * seconds for envs, seconds in zip(split, seconds_per_env))


def take_share(args: Args, split: list[int], rank: int):
    """This process's sizes under a split."""
    args.local_num_envs = split[rank]
    args.local_batch_size = args.local_num_envs * args.num_steps
    args.local_minibatch_size = args.local_batch_size // args.num_minibatches


def per_process(split: list[int], factor: float = 1) -> str:
    """[2, 2] -> '2'; [3, 1] -> '3 + 1'."""
    sizes = [int(envs * factor) for envs in split]
    return str(sizes[0]) if len(set(sizes)) == 1 else " + ".join(map(str, sizes))


def resumable_world_sizes(num_envs: int, num_steps: int, num_minibatches: int, env_split: str = "even") -> list[int]:
    """The world sizes a run of `num_envs` environments can resume on: those that split the environments
    into per-process rollouts that the minibatches divide (evenly, or any multiple of the granularity)."""
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


# What a resumed run's command must share with its checkpoint: the game, its seeds and emulator
# settings, and the batch's layout in time. The other arguments come from the command line.
RESUME_MUST_MATCH = (
    "env_id", "seed", "repeat_action_probability", "max_episode_steps", "num_steps", "num_minibatches",
    "total_timesteps",
)


def resize_for_checkpoint(args: Args, saved: dict):
    """A resumed run keeps the checkpoint's global batch, re-split over this world size, whatever
    --local-num-envs or --num-envs say."""
    for field in RESUME_MUST_MATCH:
        if getattr(args, field) != saved[field]:
            fail(
                f"--resume: the checkpoint's run has {field}={saved[field]!r}, this command {getattr(args, field)!r}: "
                "resume with the run's arguments"
            )
    world_sizes = resumable_world_sizes(saved["num_envs"], saved["num_steps"], saved["num_minibatches"], args.env_split)
    if args.world_size not in world_sizes:
        fail(
            f"--resume: the run's {saved['num_envs']} environments cannot be split over {args.world_size} processes: "
            f"resume on {in_words(world_sizes)}"
        )
    args.num_envs = saved["num_envs"]
    derive_sizes(args)


# ---------------------------------------------------------------------------------------------
# Set-up of a process of the job
# ---------------------------------------------------------------------------------------------
def process_device(args: Args, local_rank: int) -> torch.device:
    """This process's GPU (cuda:LOCAL_RANK, or the LOCAL_RANK-th of --device-ids), or the CPU."""
    if not (torch.cuda.is_available() and args.cuda):
        return torch.device("cpu")
    if args.device_ids is not None and len(args.device_ids) <= local_rank:
        fail(f"--device-ids lists {len(args.device_ids)} GPUs, fewer than this node's processes", all_ranks=True)
    gpu = args.device_ids[local_rank] if args.device_ids is not None else local_rank
    if gpu >= torch.cuda.device_count():
        fail(
            f"process LOCAL_RANK={local_rank} needs cuda:{gpu} but this node has {torch.cuda.device_count()} "
            "GPUs: start fewer processes per node or pass --device-ids",
            all_ranks=True,
        )
    device = torch.device("cuda", gpu)
    torch.cuda.set_device(device)
    return device


def start_process_group(args: Args, rank: int, device: torch.device) -> str:
    """Joins this process to the job's process group; returns the backend.

    destroy_process_group (bottom of the file) must really end the group: torch.distributed.nn,
    which torch imports with the optimizer, takes `group=group.WORLD` as a default argument; imported
    after this function it would keep the group, its gloo threads and sockets alive until the
    interpreter exits, and a gloo thread that then drops its last collective's tensors needs the
    GIL of a finalizing interpreter: std::terminate, SIGABRT. Hence its import at the top."""
    if args.backend not in ("auto", "nccl", "gloo"):
        fail(f"unknown backend {args.backend!r}: use auto, nccl or gloo")
    backend = args.backend if args.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
    if backend == "nccl" and device.type != "cuda":
        fail("--backend nccl needs a GPU in every process: use --backend gloo (or auto)")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        # torchrun's agent hosts the store and keeps it when it restarts the workers (--max-restarts);
        # torch 2.13 then hands the new workers the old workers' keys and gloo dials dead sockets.
        # Each attempt gets keys of its own.
        agent_store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        attempt_store = dist.PrefixStore(f"attempt-{os.environ['TORCHELASTIC_RESTART_COUNT']}", agent_store)
        dist.init_process_group(backend, store=attempt_store, rank=rank, world_size=args.world_size)
    elif "WORLD_SIZE" in os.environ:
        dist.init_process_group(backend)  # MASTER_ADDR and MASTER_PORT: a store of this job's own
    else:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return backend


def name_run_and_read_checkpoint(args: Args, rank: int):
    """The run's name and, under --resume, its checkpoint: the same on every rank; and on rank 0 the
    run's lock (lock_run), held while the process lives, when the run writes or reads checkpoints.

    Rank 0 names the run and reads the checkpoint, then hands both to every rank: all ranks resume
    together, and only rank 0's node needs the files. An error found by rank 0 stops every rank. A
    resumed run keeps its name and its global batch, re-split over this world size."""
    run_prefix = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__"
    shared = {"run_name": f"{run_prefix}{int(time.time())}", "checkpoint": None, "error": None}
    run_lock = None
    if rank == 0 and args.eval_checkpoint is None:
        try:
            if args.resume is not None:
                shared["checkpoint"] = read_checkpoint(args.resume, run_prefix)
            if args.checkpoint_every or shared["checkpoint"] is not None:
                folder_run = shared["checkpoint"]["run_name"] if shared["checkpoint"] else shared["run_name"]
                run_lock = lock_run(f"runs/{folder_run}/checkpoints")
        except UserError as e:  # stops every rank, not rank 0 alone
            shared["error"] = str(e)
    box = [shared]
    dist.broadcast_object_list(box, src=0)
    run_name, checkpoint, error = box[0]["run_name"], box[0]["checkpoint"], box[0]["error"]
    if error is not None:
        fail(error)
    if checkpoint is not None:
        run_name = checkpoint["run_name"]
        checkpoint["requested_num_envs"] = args.num_envs
        resize_for_checkpoint(args, checkpoint["args"])
    return run_name, checkpoint, run_lock


def first_split(args: Args, checkpoint: dict | None, rank: int) -> list[int]:
    """The environments of each process at the start: even, or as even as the granularity allows under
    --env-split measured, which then re-measures. A resumed run on the same world size keeps its split."""
    if args.env_split == "even":
        split = [args.num_envs // args.world_size] * args.world_size
    else:
        split = even_split(args.num_envs, args.world_size, split_granularity(args.num_steps, args.num_minibatches))
    if checkpoint is None:
        return split
    saved_split = checkpoint.get("env_split", [checkpoint["args"]["num_envs"] // checkpoint["args"]["world_size"]] *
                                 checkpoint["args"]["world_size"])
    if args.env_split == "measured" and len(saved_split) == args.world_size:
        split = saved_split
    if rank == 0 and (split != saved_split or checkpoint["requested_num_envs"] != args.num_envs):
        print(
            f"the run's {args.num_envs} environments (on {in_words([len(saved_split)])} before) are split over "
            f"{in_words([args.world_size])}: {per_process(split)} per process"
        )
    return split


def restore(checkpoint: dict, agent: Agent, optimizer, args: Args, rank: int, device) -> tuple[int, int]:
    """Loads a checkpoint's weights, optimizer and random streams; returns its iteration and global step."""
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    # The optimizer state brings back the checkpoint's learning rate; this command's is the one
    # to use (the annealing sets it again each iteration when it is on).
    optimizer.param_groups[0]["lr"] = args.learning_rate
    if checkpoint["args"]["world_size"] == args.world_size:
        set_rng_state(checkpoint["rng_states"][rank], device)
    else:  # the old ranks' streams do not map onto the new ones: fresh, distinct streams
        torch.manual_seed(args.seed + checkpoint["iteration"] * args.world_size + rank)
    if rank == 0:
        print(
            f"resuming {checkpoint['run_name']} from {checkpoint['path']}: iteration {checkpoint['iteration']}, "
            f"weights sha256 {parameter_digest(agent)}, optimizer sha256 {optimizer_digest(optimizer.state_dict())}",
            flush=True,
        )
    return checkpoint["iteration"], checkpoint["global_step"]


def start_environments(args: Args, split: list[int], rank: int, iteration: int, device):
    """This process's share of the job's environments, started at an iteration boundary; returns them,
    the job's index of the first, its seed, the first observations and lives. Every environment of the job
    gets its own seed, seed + its index in the job + iteration * num_envs: environments started later (by a
    resume or a re-split) never replay a seed."""
    env_offset = sum(split[:rank])
    env_seed = args.seed + env_offset + iteration * args.num_envs
    envs = make_envs(args.env_id, split[rank], args.repeat_action_probability, args.max_episode_steps)
    next_obs, info = envs.reset(seed=env_seed)
    return envs, env_offset, env_seed, torch.from_numpy(next_obs).to(device), info["lives"].copy()


def rollout_storage(args: Args, device) -> tuple[torch.Tensor, ...]:
    """obs, actions, logprobs, rewards, dones, values of one rollout of this process's share.
    Observations stay uint8: 4x less memory and copying than float."""
    shape = (args.num_steps, args.local_num_envs)
    obs = torch.zeros(shape + (4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros(shape, dtype=torch.long, device=device)
    return obs, actions, *(torch.zeros(shape, device=device) for _ in range(4))


def measured_split(split: list[int], seconds_per_env: float, args: Args) -> tuple[list[int], str]:
    """--env-split measured: gathers every process's measured seconds per environment-iteration and
    returns the balanced split if it is predicted to shorten the job's iteration by more than
    --split-threshold (else the current split), with a line that says what was measured."""
    measured = [None] * args.world_size
    dist.all_gather_object(measured, seconds_per_env)
    balanced = balanced_split(args.num_envs, measured, split_granularity(args.num_steps, args.num_minibatches))
    now, then = iteration_seconds(split, measured), iteration_seconds(balanced, measured)
    change = then < (1 - args.split_threshold) * now
    line = (
        f"env split {per_process(split)} -> {per_process(balanced if change else split)} per process: measured "
        f"{' / '.join(f'{1000 * seconds:.0f}' for seconds in measured)} ms per env and iteration, predicted iteration "
        f"{now:.2f} s -> {then:.2f} s"
    )
    return (balanced if change else split), line


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def warn_if_bf16_is_slow(mixed_precision: str, device: torch.device):
    """oneDNN has bf16 kernels only for CPUs with AVX-512 (or ARM's bf16 extension). Elsewhere
    autocast emulates bf16, and the update runs many times slower than in fp32 (13x, and training
    8x, on a 2-core AVX2 EPYC): say so rather than let a user wait."""
    if mixed_precision != "bf16" or device.type != "cpu":
        return
    try:
        has_bf16_kernels = torch.ops.mkldnn._is_mkldnn_bf16_supported()  # torch's own (private) check
    except (AttributeError, RuntimeError):  # a torch without it: no warning rather than a crash
        return
    if not has_bf16_kernels:
        print("warning: this CPU has no fast bf16 (oneDNN needs AVX-512): --mixed-precision bf16 runs several times"
              " slower than fp32 here", file=sys.stderr)


def main(args: Args):
    # torchrun gives each process its global RANK, its LOCAL_RANK on its node and the WORLD_SIZE;
    # a plain `python` run is a job of one process.
    rank, local_rank = int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))
    args.world_size = int(os.environ.get("WORLD_SIZE", 1))
    derive_sizes(args)
    atari_game(args.env_id)  # an unknown env id fails here, before anything is written
    if args.eval_checkpoint is None and args.num_iterations < 1:
        fail(f"--total-timesteps {args.total_timesteps} is smaller than one batch ({args.batch_size} steps)")
    if args.checkpoint_every < 0:
        fail("--checkpoint-every must be 0 (never) or positive")

    # Each rank draws its own actions and minibatches; the weights all come from rank 0 (below).
    random.seed(args.seed + rank)
    np.random.seed(args.seed + rank)
    torch.manual_seed(args.seed + rank)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = process_device(args, local_rank)
    autocast = lambda: torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")
    if rank == 0:
        warn_if_bf16_is_slow(args.mixed_precision, device)
    backend = start_process_group(args, rank, device)

    run_name, checkpoint, run_lock = name_run_and_read_checkpoint(args, rank)
    split = first_split(args, checkpoint, rank)
    take_share(args, split, rank)
    writer = None
    if rank == 0:
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
        purge_step = checkpoint["global_step"] + 1 if checkpoint is not None else None
        writer = SummaryWriter(f"runs/{run_name}", purge_step=purge_step)
        if checkpoint is None:
            writer.add_text(
                "hyperparameters",
                "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
            )

    if args.eval_checkpoint is not None:
        if rank == 0:
            run_evaluation(args, device, writer, run_name)
            writer.close()
        return

    start_iteration = checkpoint["iteration"] if checkpoint is not None else 0
    envs, env_offset, env_seed, next_obs, lives = start_environments(args, split, rank, start_iteration, device)
    num_actions = int(envs.single_action_space.n)
    agent = Agent(num_actions).to(device).to(memory_format=torch.channels_last)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    global_step, env0_games = 0, 0
    if checkpoint is not None:
        start_iteration, global_step = restore(checkpoint, agent, optimizer, args, rank, device)
        env0_games = checkpoint["env0_games"]
        del checkpoint
    # Every rank starts from rank 0's weights, bit for bit.
    for tensor in agent.state_dict().values():
        dist.broadcast(tensor, src=0)

    episode_stats = EpisodeStatistics(args.local_num_envs)
    obs, actions, logprobs, rewards, dones, values = rollout_storage(args, device)
    if rank == 0:
        print(
            f"world size {args.world_size}: {args.num_envs} envs ({per_process(split)} per process), "
            f"batch {args.batch_size} ({per_process(split, args.num_steps)} per process), minibatch "
            f"{args.minibatch_size} ({per_process(split, args.num_steps / args.num_minibatches)} per process), "
            f"{args.num_iterations} iterations",
            flush=True,
        )
        if args.checkpoint_every and start_iteration == 0:
            # A restart on a world size that cannot split the environments fails on every restart alike.
            world_sizes = resumable_world_sizes(args.num_envs, args.num_steps, args.num_minibatches, args.env_split)
            print(f"this run's {args.num_envs} environments can resume on {in_words(world_sizes)}", flush=True)
    # Every rank prints this line to the output they share: one write with its newline (print writes
    # the newline apart, and another rank's line could come between the two).
    print(
        f"rank {rank}/{args.world_size}: pid {os.getpid()}, {device}, {backend}, {torch.get_num_threads()} threads, "
        f"env seeds {env_seed}..{env_seed + args.local_num_envs - 1}\n",
        end="", flush=True,
    )

    start_global_step, sps, games_played = global_step, 0, 0
    start_time = time.time()
    recent_returns = deque(maxlen=20)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    video = None
    if args.capture_video and rank == 0:
        video = VideoRecorder(
            f"videos/{run_name}", args.env_id, env_seed, args.repeat_action_probability, args.max_episode_steps,
            first_game=env0_games, track=args.track,
        )
    # --env-split measured: this process's busy time (its iteration minus its time in collective calls,
    # where it waits for the others), over windows of --split-every iterations, each after one of warm-up
    # (a first iteration pays for start-up and for new batch shapes).
    CollectiveTime.cuda_sync = args.env_split == "measured" and device.type == "cuda"
    busy_seconds, measured_iterations, warming_up = 0.0, 0, True

    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        iteration_start, waited_before = time.perf_counter(), CollectiveTime.seconds
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

        finished_games = []  # (global step, return, length) of this rank's games
        for step in range(args.num_steps):
            global_step += args.num_envs
            obs[step] = next_obs
            with torch.inference_mode(), autocast():
                action, logprob, _, value = agent.get_action_and_value(next_obs)
            values[step] = value.flatten()
            actions[step] = action
            logprobs[step] = logprob

            action = action.cpu().numpy()
            next_obs_np, reward, terminated, truncated, info = envs.step(action)
            game_over = terminated | truncated
            # Episodic life: losing a life ends the learning episode (the game goes on), which
            # makes the value of losing a life visible to the agent.
            life_lost = info["lives"] < lives
            lives = info["lives"].copy()
            clipped_reward = np.sign(reward).astype(np.float32)
            if truncated.any():
                # A time limit is not a death: bootstrap from the value of the real last
                # observation, which SAME_STEP autoreset keeps in info["final_obs"].
                with torch.inference_mode(), autocast():
                    final_values = agent.get_value(torch.from_numpy(info["final_obs"]).to(device)).flatten()
                bootstrap = args.gamma * final_values.cpu().numpy() * (truncated & ~terminated)
                clipped_reward = clipped_reward + bootstrap.astype(np.float32)
            rewards[step] = torch.from_numpy(clipped_reward).to(device)
            dones[step] = torch.from_numpy(game_over | life_lost).to(device)
            next_obs = torch.from_numpy(next_obs_np).to(device)

            if video is not None:
                video.step(action[0])
            env0_games += bool(game_over[0])
            # The env steps of one vector step of the job count as consecutive global steps, in the
            # order of the job's env index (env_offset + i), so every game is logged at a step of its own.
            for i, episodic_return, episodic_length in episode_stats.step(reward, game_over):
                game_step = global_step - args.num_envs + env_offset + i + 1
                finished_games.append((game_step, episodic_return, episodic_length))

        # Rank 0 logs the games of the whole job: every rank's finished games are gathered to it.
        games_played += len(finished_games)
        games_of_all_ranks = gather_to_rank_0(finished_games, rank, args.world_size)
        if rank == 0:
            for game_step, episodic_return, episodic_length in sorted(sum(games_of_all_ranks, [])):
                recent_returns.append(episodic_return)
                writer.add_scalar("charts/episodic_return", episodic_return, game_step)
                writer.add_scalar("charts/episodic_length", episodic_length, game_step)

        with torch.inference_mode(), autocast():
            next_value = agent.get_value(next_obs).flatten()
        advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs = obs.reshape((-1, 4, 84, 84))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)

        # Every process cuts its rollout into num_minibatches shares: with unequal rollouts the shares
        # differ in size, and this process's gradient and statistics count by its fraction of the samples.
        share = args.local_num_envs / args.num_envs
        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.local_batch_size, device=device)
            for start in range(0, args.local_batch_size, args.local_minibatch_size):
                mb_inds = b_inds[start : start + args.local_minibatch_size]
                with autocast():
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                loss, stats = ppo_loss(
                    newlogprob, entropy, newvalue, b_logprobs[mb_inds], b_advantages[mb_inds],
                    b_returns[mb_inds], b_values[mb_inds], args,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                average_gradients(agent, args.world_size, share)
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            # Stopping early changes the control flow: decided on the job's KL, the same on every
            # rank, so that no rank stops alone (and leaves the others waiting in an all-reduce).
            if args.target_kl is not None and job_mean(stats["approx_kl"], share) > args.target_kl:
                break

        # The logged figures are the job's: statistics averaged over ranks, explained variance of all values.
        job_stats = dict(stats, clipfrac=torch.stack(clipfracs).mean())
        job_stats = dict(zip(job_stats, job_mean(torch.stack(list(job_stats.values())), share).tolist()))
        var_y = global_mean_std(b_returns)[1].item() ** 2
        explained_var = np.nan if var_y == 0 else 1 - global_mean_std(b_returns - b_values)[1].item() ** 2 / var_y

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        if rank == 0:
            writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
            writer.add_scalar("losses/value_loss", job_stats["value_loss"], global_step)
            writer.add_scalar("losses/policy_loss", job_stats["policy_loss"], global_step)
            writer.add_scalar("losses/entropy", job_stats["entropy"], global_step)
            writer.add_scalar("losses/old_approx_kl", job_stats["old_approx_kl"], global_step)
            writer.add_scalar("losses/approx_kl", job_stats["approx_kl"], global_step)
            writer.add_scalar("losses/clipfrac", job_stats["clipfrac"], global_step)
            writer.add_scalar("losses/explained_variance", explained_var, global_step)
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/world_size", args.world_size, global_step)
            for r, envs_of_r in enumerate(split):
                writer.add_scalar(f"charts/local_num_envs/rank_{r}", envs_of_r, global_step)
            progress.show(global_step, sps, recent_returns)

        # No new split after the last iteration: none would use it, and the final checkpoint keeps the split
        # the run ended with.
        if args.env_split == "measured" and iteration < args.num_iterations:
            if warming_up:
                warming_up = False
            else:
                busy_seconds += time.perf_counter() - iteration_start - (CollectiveTime.seconds - waited_before)
                measured_iterations += 1
            if measured_iterations == args.split_every:
                new_split, line = measured_split(split, busy_seconds / measured_iterations / args.local_num_envs, args)
                busy_seconds, measured_iterations = 0.0, 0
                if new_split != split:
                    # A process whose share changes starts new environments: its games in progress end
                    # unfinished and are not logged (docs: "Processes of unequal speed").
                    if rank == 0:
                        print(f"iteration {iteration}: {line}", flush=True)
                    old_envs, split = split[rank], new_split
                    take_share(args, split, rank)
                    env_offset = sum(split[:rank])
                    if args.local_num_envs != old_envs:
                        envs.close()
                        envs, env_offset, env_seed, next_obs, lives = start_environments(
                            args, split, rank, iteration, device
                        )
                        episode_stats = EpisodeStatistics(args.local_num_envs)
                        obs, actions, logprobs, rewards, dones, values = rollout_storage(args, device)
                        if video is not None:  # env 0 of rank 0 is a new environment: so is its shadow
                            video.close()
                            video = VideoRecorder(
                                f"videos/{run_name}", args.env_id, env_seed, args.repeat_action_probability,
                                args.max_episode_steps, first_game=env0_games, track=args.track,
                            )
                    warming_up = True

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            # The weights and the optimizer are the same on every rank; the random streams are not.
            rng_states = gather_to_rank_0(rng_state(device), rank, args.world_size)
            if rank == 0:
                writer.flush()  # everything up to this checkpoint is on disk before it counts
                path = save_checkpoint(
                    f"runs/{run_name}/checkpoints", agent, optimizer, iteration, global_step, rng_states, env0_games,
                    args, run_name, split,
                )
                print(f"checkpoint {path}", flush=True)

    if rank == 0:
        progress.close()
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
    if rank == 0:
        writer.close()
    if run_lock is not None:
        run_lock.close()


if __name__ == "__main__":
    try:
        # Under torchrun, `record` writes a failing worker's error to torchrun's error file: its failure
        # report then names the script's message as the root cause.
        record(main, error_handler=OneLineUserErrors())(tyro.cli(Args))
    except UserError as e:
        sys.exit(f"error: {e}" if e.printed else 1)
    finally:  # on success and on error alike
        if dist.is_initialized():
            dist.destroy_process_group()
