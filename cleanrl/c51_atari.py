"""C51 on Atari (gymnasium 1.x + ale-py), one file.

Distributional deep Q-learning (Bellemare, Dabney and Munos 2017): the Nature-CNN network gives, for
each action, a distribution of the return over 51 fixed atoms; the target is the target network's
distribution of the greedy action, shifted by the reward, discounted and projected back onto the atoms;
the loss is the cross-entropy between the two. On dqn_atari.py's environment and its replay memory that
stores each frame once (1M transitions in 7 GB). Beside the algorithm: bf16 autocast, checkpoints and
resume (replay memory included), videos, and evaluation of a saved model.
Docs: docs/c51_atari.md
"""

import copy
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

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
import tyro
from ale_py.vector_env import AtariVectorEnv
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
    """if toggled, the Q-network is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    eval_epsilon: float = 0.05
    """the exploration rate of the evaluation's epsilon-greedy policy"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""
    checkpoint_every: int = 0
    """write a checkpoint to `runs/{run_name}/checkpoints/` every K env steps and at the end (0: never);
    only the newest is kept: it holds the replay memory, up to 7 GB"""
    resume: str | None = None
    """a checkpoint file to continue its run from, or `auto`: the newest of this env_id, exp_name and seed"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 autocasts the network's convolutions and 512-unit layer; the atom logits, loss and optimizer stay fp32"""

    # Environment
    env_id: str = "BreakoutNoFrameskip-v4"
    """the game: `BreakoutNoFrameskip-v4`, `ALE/Breakout-v5` and `Breakout-v5` all name Breakout"""
    repeat_action_probability: float = 0.0
    """sticky actions; 0 is the NoFrameskip-v4 convention behind the published DQN scores"""
    max_episode_steps: int = 27_000
    """the time limit of a game in agent steps (108,000 frames, as v5); a game cut by it is bootstrapped"""

    # Algorithm
    total_timesteps: int = 10_000_000
    """total environment steps (agent steps, each 4 emulator frames, all envs together)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the Adam optimizer"""
    num_envs: int = 1
    """the number of parallel game environments"""
    n_atoms: int = 51
    """the number of atoms of the return distribution"""
    v_min: float = -10.0
    """the return of the lowest atom"""
    v_max: float = 10.0
    """the return of the highest atom"""
    buffer_size: int = 1_000_000
    """the replay memory size, in env steps (all envs together; each env keeps buffer_size / num_envs)"""
    gamma: float = 0.99
    """the discount factor"""
    target_network_frequency: int = 10000
    """the number of environment steps between the copies of the Q-network into the target network"""
    batch_size: int = 32
    """the number of transitions sampled from the replay memory for each update"""
    start_e: float = 1.0
    """the starting epsilon of the exploration"""
    end_e: float = 0.01
    """the final epsilon of the exploration"""
    exploration_fraction: float = 0.10
    """the fraction of `total_timesteps` over which epsilon decays from start_e to end_e"""
    learning_starts: int = 80000
    """the number of environment steps before learning starts (the memory fills meanwhile)"""
    train_frequency: int = 4
    """the number of environment steps between updates of the Q-network"""


# Loss, Q-values, epsilon and SPS are logged every this many environment steps.
LOG_EVERY = 100
# A memory slot is one 84x84 frame; a ring shorter than this could not hold a stack and its successor.
MIN_SLOTS_PER_ENV = 8


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
    # next game's first observation, so no fake transition enters the memory. rgb_frames: the same
    # games as full 210x160 RGB screens (for videos) instead of the agent's 84x84 grayscale stacks.
    return AtariVectorEnv(
        atari_game(env_id),
        num_envs,
        num_threads=min(num_envs, os.cpu_count() or 1),
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
# Replay memory: each frame stored once
# ---------------------------------------------------------------------------------------------
class FrameReplayBuffer:
    """The last `buffer_size` env steps, each 84x84 frame stored once; the stacks rebuilt when sampled.

    Every env has a ring of slots, written in order. A slot holds one frame (the newest of an
    observation) and, once its step is taken, that step's action, clipped reward and done flag (the end
    of a life or of the game); the next slot holds the newest frame of the observation the step ended in.
    A game over writes two slots: the real last frame (which has no step of its own) and the next game's
    first frame. So the stack of slot i is the frames of slots i-3..i, those from before the game's first
    slot zeroed (as ale-py pads a new game's stack: [0, 0, 0, first frame]), and its successor is the same
    at slot i+1. A life loss does not restart the stack: the game goes on, and so does what the agent saw.
    A slot whose stack reaches into an overwritten slot is no longer sampled.
    """

    SLOT_ARRAYS = ("frames", "actions", "rewards", "dones", "first", "valid")  # (num_envs, slots, ...)

    def __init__(self, buffer_size: int, num_envs: int, stack: int = 4):
        self.num_envs, self.slots, self.stack = num_envs, buffer_size // num_envs, stack
        shape = (num_envs, self.slots)
        # uint8 frames, 7,056 bytes each: 7.06 GB for 1M. Every page is written here, so a machine
        # without the memory fails now instead of hours into the run (and the RSS tells the truth).
        self.frames = np.empty(shape + (84, 84), dtype=np.uint8)
        self.frames.fill(0)
        self.actions = np.zeros(shape, dtype=np.uint8)  # Atari has at most 18 actions
        self.rewards = np.zeros(shape, dtype=np.float32)
        self.dones = np.zeros(shape, dtype=np.bool_)
        self.first = np.zeros(shape, dtype=np.bool_)  # the slot holds a game's first frame
        self.valid = np.zeros(shape, dtype=np.bool_)  # the slot's step is stored, with an intact stack
        self.pos = np.zeros(num_envs, dtype=np.int64)  # each env's slot of its current observation
        self.used = 0  # slots written so far in the fullest ring, up to self.slots

    def _write(self, envs: np.ndarray, slots: np.ndarray, frames: np.ndarray, first: bool):
        self.frames[envs, slots] = frames
        self.first[envs, slots] = first
        for k in range(self.stack):  # this slot, and the next ones: now the oldest, their stacks reached it
            self.valid[envs, (slots + k) % self.slots] = False
        self.used = max(self.used, min(int(slots.max()) + 1, self.slots))

    def start(self, obs: np.ndarray, resumed: bool = False):
        """obs: (num_envs, 4, 84, 84), the first observations of new games after envs.reset(). A resumed
        run ends each env's game of the checkpoint at its last stored observation (which has no step, as a
        game's last frame) and starts the new game in the next slot, as after a game over."""
        if resumed:
            self.pos = (self.pos + 1) % self.slots
        self._write(np.arange(self.num_envs), self.pos, obs[:, -1], first=True)

    def add(self, actions, rewards, dones, next_obs: np.ndarray, final_obs: np.ndarray | None, game_over: np.ndarray):
        """One vector step: the step taken in each env's current observation and where it ended.
        next_obs: what envs.step returned (a new game's first observation where a game ended);
        final_obs: info["final_obs"], the real last observations, read where game_over."""
        envs, slots, next_slots = np.arange(self.num_envs), self.pos, (self.pos + 1) % self.slots
        self.actions[envs, slots], self.rewards[envs, slots], self.dones[envs, slots] = actions, rewards, dones
        last_frames = next_obs[:, -1]
        if game_over.any():
            last_frames = np.where(game_over[:, None, None], final_obs[:, -1], last_frames)
        self._write(envs, next_slots, last_frames, first=False)
        self.valid[envs, slots] = True
        self.pos = next_slots
        if game_over.any():
            ended = np.flatnonzero(game_over)
            self.pos[ended] = (self.pos[ended] + 1) % self.slots
            self._write(ended, self.pos[ended], next_obs[ended, -1], first=True)

    def state_dict(self) -> dict:
        """The written slots, one tensor per env that shares its storage (no copy). Not one tensor of all
        envs: a strided view, of which torch.save writes the whole storage span, unwritten slots included."""
        written = {name: getattr(self, name)[:, : self.used] for name in self.SLOT_ARRAYS}
        state = {name: [torch.from_numpy(env_slots) for env_slots in array] for name, array in written.items()}
        return {**state, "pos": torch.from_numpy(self.pos), "used": self.used}

    def load_state_dict(self, state: dict):
        self.used = int(state["used"])
        for name in self.SLOT_ARRAYS:
            for env, env_slots in enumerate(state[name]):
                getattr(self, name)[env, : self.used] = env_slots.numpy()  # copied out of the (mapped) file
        self.pos[:] = state["pos"].numpy()

    def gather(self, envs: np.ndarray, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The transitions stored at (envs[b], slots[b]), stacks rebuilt: obs and next_obs (batch, 4, 84, 84)."""
        window = (slots[:, None] + np.arange(-(self.stack - 1), 2)) % self.slots  # slots i-3 .. i+1
        frames = self.frames[envs[:, None], window]  # (batch, 5, 84, 84)
        # A game's first slot at or after position j (among i-2..i) means the frame at j-1 belongs to the
        # previous game: zero it, as the env pads a new game's stack. (Slot i+1 is never a game's first.)
        first = self.first[envs[:, None], window[:, 1 : self.stack]]
        before_game = np.flip(np.logical_or.accumulate(np.flip(first, 1), 1), 1)
        frames[:, : self.stack - 1][before_game] = 0
        fields = dict(obs=frames[:, :-1], next_obs=frames[:, 1:], actions=self.actions[envs, slots].astype(np.int64))
        return dict(fields, rewards=self.rewards[envs, slots], dones=self.dones[envs, slots].astype(np.float32))

    def sample(self, batch_size: int, rng: np.random.Generator, device) -> dict[str, torch.Tensor]:
        """Uniform with replacement over the stored steps of all envs."""
        envs, slots = np.empty(0, np.int64), np.empty(0, np.int64)
        while len(envs) < batch_size:
            # Draw over the written slots and keep the valid ones: the few others (a game's last frame,
            # the ring's seam, the newest slot) are redrawn, so every stored step has the same chance.
            flat = rng.integers(0, self.num_envs * self.used, size=batch_size - len(envs))
            e, s = np.divmod(flat, self.used)
            keep = self.valid[e, s]
            envs, slots = np.concatenate([envs, e[keep]]), np.concatenate([slots, s[keep]])
        return {name: torch.from_numpy(array).to(device) for name, array in self.gather(envs, slots).items()}


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    """The Nature-DQN network with a distributional head: for each action, logits over `n_atoms` returns
    evenly spaced on [v_min, v_max] (the `atoms` buffer, saved with the weights)."""

    def __init__(self, num_actions: int, n_atoms: int = 51, v_min: float = -10.0, v_max: float = 10.0):
        super().__init__()
        self.num_actions, self.n_atoms = num_actions, n_atoms
        self.register_buffer("atoms", torch.linspace(v_min, v_max, n_atoms))
        convs = [nn.Conv2d(4, 32, 8, stride=4), nn.Conv2d(32, 64, 4, stride=2), nn.Conv2d(64, 64, 3, stride=1)]
        body = [layer for conv in convs for layer in (conv, nn.ReLU())]
        self.network = nn.Sequential(*body, nn.Flatten(), nn.Linear(64 * 7 * 7, 512), nn.ReLU())
        self.head = nn.Linear(512, num_actions * n_atoms)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """obs: (batch, 4, 84, 84) uint8 -> logits (batch, num_actions, n_atoms), fp32."""
        # Channels-last lets the conv kernels run without layout shuffles (1.6x faster updates on CPU);
        # the layout changes while the batch is still uint8, and the one conversion goes straight to the
        # dtype the body computes in (bf16 under autocast or in the bf16 acting copy).
        device = obs.device.type
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else self.network[0].weight.dtype
        hidden = self.network(obs.contiguous(memory_format=torch.channels_last).to(dtype).div_(255.0))
        # The head runs in fp32 even under bf16: a softmax over 51 atoms and its logarithm in the loss
        # would show bf16's 3 significant digits.
        with torch.autocast(device, enabled=False):
            return self.head(hidden.float()).view(-1, self.num_actions, self.n_atoms)


def acting_copy(q_network: QNetwork, dtype: torch.dtype) -> QNetwork:
    """A copy of the Q-network for acting only: its conv body stored in dtype, its head in fp32 as under
    autocast. Refreshed with `load_state_dict(q_network.state_dict())`, which casts, after each update."""
    acting = copy.deepcopy(q_network).requires_grad_(False)
    acting.network.to(dtype)
    return acting


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e in a straight line over `duration` steps, then end_e."""
    if t >= duration:
        return end_e
    return start_e + (end_e - start_e) * t / duration


def q_values(logits: torch.Tensor, atoms: torch.Tensor) -> torch.Tensor:
    """Q(s, a), the expected return of each action's distribution: logits (..., n_atoms) -> (...)."""
    return (F.softmax(logits, dim=-1) * atoms).sum(-1)


def project_distribution(
    next_probs: torch.Tensor, rewards: torch.Tensor, dones: torch.Tensor, atoms: torch.Tensor, gamma: float
) -> torch.Tensor:
    """The target distribution of C51: the distribution of r + gamma * Z(s', a*) projected onto the atoms.
    next_probs: (batch, n_atoms), the target network's probabilities of the greedy action a* in s';
    rewards, dones: (batch,), dones 1.0 where the learning episode ended (no future: all the mass moves to
    r); atoms: (n_atoms,), evenly spaced from v_min to v_max. Atom j's mass moves to r + gamma * z_j,
    clipped to [v_min, v_max], and is split between the two atoms around that point, each getting the
    share of its closeness. Returns (batch, n_atoms); each row sums to 1."""
    n_atoms = atoms.numel()
    v_min, delta_z = atoms[0], (atoms[-1] - atoms[0]) / (n_atoms - 1)
    moved = rewards[:, None] + gamma * (1.0 - dones[:, None]) * atoms
    # position on the support in atom units, clipped to its edges: the atoms outside are the edge atoms
    b = ((moved - v_min) / delta_z).clamp(0, n_atoms - 1)
    # The atom below b and the next one up, lower <= b <= lower + 1 always (b on the last atom: lower is
    # the one before it). A b exactly on an atom gives that atom all the mass, the other none, so no
    # special case; with floor(b) and ceil(b) the two would be the same atom and both shares zero.
    lower = b.floor().clamp(max=n_atoms - 2)
    upper_share = b - lower
    target = torch.zeros_like(next_probs)
    target.scatter_add_(1, lower.long(), next_probs * (1.0 - upper_share))
    target.scatter_add_(1, lower.long() + 1, next_probs * upper_share)
    return target


def epsilon_greedy(q_network: QNetwork, obs: np.ndarray, epsilon: float, rng: np.random.Generator, device):
    """One action per env: uniform with probability epsilon (each env on its own coin), else the action of
    the highest expected return. The network runs only when some env acts greedily."""
    actions = rng.integers(q_network.num_actions, size=len(obs))
    greedy = rng.random(len(obs)) >= epsilon
    if greedy.any():
        with torch.inference_mode():
            values = q_values(q_network(torch.from_numpy(obs).to(device)), q_network.atoms)
        actions = np.where(greedy, values.argmax(dim=1).cpu().numpy(), actions)
    return actions


def main(args: Args):
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    warn_if_bf16_is_slow(args.mixed_precision, device)
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
    run_name = checkpoint["run_name"] if checkpoint else run_name  # a resumed run goes on in its own directory
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if args.checkpoint_every or checkpoint else None
    writer = start_logging(args, run_name, checkpoint)

    envs = make_envs(args.env_id, args.num_envs, args.repeat_action_probability, args.max_episode_steps)
    num_actions = int(envs.single_action_space.n)
    distribution = (args.n_atoms, args.v_min, args.v_max)
    q_network = QNetwork(num_actions, *distribution).to(device).to(memory_format=torch.channels_last)
    # Adam's epsilon is the C51 paper's 0.01 / batch size. Fused: one kernel for all parameters instead
    # of a loop over them (on a 2-core CPU the Adam step took 3-4 ms instead of 25; the same update to 4e-9).
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, eps=0.01 / args.batch_size, fused=True)
    target_network = QNetwork(num_actions, *distribution).to(device).to(memory_format=torch.channels_last)
    target_network.load_state_dict(q_network.state_dict())
    atoms = q_network.atoms  # (n_atoms,)
    rb = FrameReplayBuffer(args.buffer_size, args.num_envs)
    rng = np.random.default_rng(args.seed)  # the exploration and the memory's sampling

    global_step, num_updates, env0_games, recent_returns = 0, 0, 0, deque(maxlen=20)
    if checkpoint is not None:  # everything is copied out of the memory-mapped file, then it is let go
        q_network.load_state_dict(checkpoint["model"])
        target_network.load_state_dict(checkpoint["target_network"])
        optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))  # Adam would keep the mapped tensors
        rb.load_state_dict(checkpoint["replay_memory"])
        rng.bit_generator.state = checkpoint["numpy_rng"]
        torch.set_rng_state(checkpoint["rng_state"]["torch"])
        cuda_states = checkpoint["rng_state"]["cuda"] or []  # a resume may run on a machine with fewer GPUs
        torch.cuda.set_rng_state_all(cuda_states[: torch.cuda.device_count()])
        global_step, num_updates = checkpoint["global_step"], checkpoint["num_updates"]
        env0_games = checkpoint["env0_games"]  # the games env 0 finished: videos go on numbering from there
        recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only
        del checkpoint
    # Under bf16 the envs' batch-of-1 forwards act with a copy of the Q-network whose conv body is stored
    # in bf16: autocast would cast every weight at every step (5 ms instead of 1.5 on a 2-core CPU); the
    # copy, refreshed after each update (0.2 ms), gives the same numbers bit for bit.
    acting_network = acting_copy(q_network, torch.bfloat16) if args.mixed_precision == "bf16" else q_network

    # Environment i gets seed + i. The games in progress at a checkpoint are not in it: a resumed run
    # starts new games, on seeds the run has not used (seed + global_step onwards).
    env_seed = args.seed + global_step
    obs, info = envs.reset(seed=env_seed)
    rb.start(obs, resumed=global_step > 0)
    lives = info["lives"].copy()
    episode_stats = EpisodeStatistics(args.num_envs)
    num_vector_steps = args.total_timesteps // args.num_envs
    total_steps = num_vector_steps * args.num_envs
    progress = Progress(total_steps, args.progress_interval)
    video = VideoRecorder(f"videos/{run_name}", args.env_id, env_seed, args, env0_games) if args.capture_video else None
    exploration_steps = args.exploration_fraction * args.total_timesteps
    window = []  # (loss, mean Q(s, a)) of the updates since the last log point
    start_time, start_step, sps = time.time(), global_step, 0

    for _ in range(global_step // args.num_envs, num_vector_steps):
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        actions = epsilon_greedy(acting_network, obs, epsilon, rng, device)
        next_obs, reward, terminated, truncated, info = envs.step(actions)
        game_over = terminated | truncated
        # Episodic life: losing a life ends the learning episode (no bootstrap across it) while the game
        # goes on. At a game over, info already holds the next game's lives: no life lost there (a game cut by
        # the time limit with bonus lives would have more than a new game starts with).
        life_lost = (info["lives"] < lives) & ~game_over
        lives = info["lives"].copy()
        # A time-limit truncation is not a death: its step is stored with the real last observation,
        # info["final_obs"], and bootstrapped from it.
        rb.add(actions, np.sign(reward), terminated | life_lost, next_obs, info.get("final_obs"), game_over)
        obs = next_obs

        if video is not None:
            video.step(actions[0])
        env0_games += bool(game_over[0])
        # The env steps of one vector step count as consecutive global steps, env 0 first, so every game
        # is logged at a step of its own.
        for i, episodic_return, episodic_length in episode_stats.step(reward, game_over):
            recent_returns.append(episodic_return)
            writer.add_scalar("charts/episodic_return", episodic_return, global_step + i + 1)
            writer.add_scalar("charts/episodic_length", episodic_length, global_step + i + 1)

        # The schedule is counted in env steps, whatever num_envs is: an update at every step past
        # learning_starts that is a multiple of train_frequency, a target update at every multiple of
        # target_network_frequency (with num_envs = 1, the original DQN loop).
        for step in range(global_step + 1, global_step + args.num_envs + 1):
            if step > args.learning_starts and step % args.train_frequency == 0:
                batch = rb.sample(args.batch_size, rng, device)
                with torch.no_grad():
                    with autocast:
                        next_logits = target_network(batch["next_obs"])  # (batch, num_actions, n_atoms)
                    next_probs = F.softmax(next_logits, dim=2)
                    next_actions = (next_probs * atoms).sum(2).argmax(1)  # a*: the target network's greedy action
                    next_probs = next_probs[torch.arange(len(next_actions), device=device), next_actions]
                    target = project_distribution(next_probs, batch["rewards"], batch["dones"], atoms, args.gamma)
                with autocast:
                    logits = q_network(batch["obs"])
                taken = batch["actions"][:, None, None].expand(-1, 1, args.n_atoms)
                logits_taken = logits.gather(1, taken).squeeze(1)  # (batch, n_atoms)
                loss = -(target * F.log_softmax(logits_taken, dim=1)).sum(1).mean()  # the cross-entropy
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                if acting_network is not q_network:
                    acting_network.load_state_dict(q_network.state_dict())
                num_updates += 1
                window.append((loss.item(), q_values(logits_taken.detach(), atoms).mean().item()))
            if step > args.learning_starts and step % args.target_network_frequency == 0:
                target_network.load_state_dict(q_network.state_dict())
        previous_step, global_step = global_step, global_step + args.num_envs

        if global_step // LOG_EVERY > previous_step // LOG_EVERY or global_step == total_steps:
            sps = int((global_step - start_step) / (time.time() - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/epsilon", epsilon, global_step)
            if window:
                mean_loss, mean_q = np.mean(window, axis=0)
                writer.add_scalar("losses/loss", mean_loss, global_step)
                writer.add_scalar("losses/q_values", mean_q, global_step)
                window.clear()
            progress.show(global_step, sps, recent_returns)

        every = args.checkpoint_every
        if every and (global_step // every > previous_step // every or global_step == total_steps):
            writer.flush()  # everything up to this checkpoint is on disk before it counts
            state = dict(model=q_network.state_dict(), target_network=target_network.state_dict())
            state.update(optimizer=optimizer.state_dict(), replay_memory=rb.state_dict(), num_updates=num_updates)
            state.update(numpy_rng=rng.bit_generator.state)
            state.update(global_step=global_step, env0_games=env0_games, recent_returns=list(recent_returns))
            # keep=1: a checkpoint holds the memory's frames written so far, up to 7 GB
            save_checkpoint(checkpoint_folder, f"step-{global_step:09d}.pt", state, args, run_name, keep=1)

    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {global_step} steps and {num_updates} updates, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} games {recent}"
    )
    envs.close()
    if video is not None:
        video.close()
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_model(model_path, q_network, args)
        print(f"model saved to {model_path}")
        run_evaluation(args, device, writer, run_name, q_network)
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
    if args.learning_rate < 0:
        fail(f"--learning-rate must not be negative, got {args.learning_rate}")
    # Env i gets seed + i, and a resumed run new seeds past the ones used (main): the emulator takes 32-bit seeds.
    last_env_seed = args.seed + max(args.total_timesteps, 0) + args.num_envs
    if args.seed < 0 or last_env_seed >= 2**31:
        fail(f"--seed {args.seed}: the run's env seeds, up to {last_env_seed:,}, must lie in [0, 2**31)")
    if not 0 <= args.repeat_action_probability < 1:  # at 1 no action of the agent's would ever be played
        fail(f"--repeat-action-probability must lie in [0, 1), got {args.repeat_action_probability}")
    counts = ("num_envs", "buffer_size", "batch_size", "total_timesteps", "train_frequency")
    for name in (*counts, "target_network_frequency", "eval_episodes", "max_episode_steps"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.max_episode_steps >= 2**29:  # the emulator counts a game's frames, 4 a step, in 32 bits
        fail(
            f"--max-episode-steps {args.max_episode_steps:,} overflows the emulator's frame counter: at most 2**29 - 1"
        )
    for name in ("gamma", "start_e", "end_e", "exploration_fraction", "eval_epsilon"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            fail(f"--{name.replace('_', '-')} must lie in [0, 1], got {getattr(args, name)}")
    if args.n_atoms < 2:
        fail(f"--n-atoms must be at least 2 (the support's two ends), got {args.n_atoms}")
    if not args.v_min < args.v_max:
        fail(f"--v-min must be below --v-max, got {args.v_min} and {args.v_max}")
    if args.checkpoint_every < 0:
        fail(f"--checkpoint-every must be 0 (never) or positive, got {args.checkpoint_every}")
    atari_game(args.env_id)  # an unknown env id fails here, before anything is written
    if args.eval_checkpoint is not None:
        return
    if args.buffer_size % args.num_envs != 0:
        fail(f"--buffer-size {args.buffer_size} is not divisible by --num-envs {args.num_envs}")
    if args.buffer_size // args.num_envs < MIN_SLOTS_PER_ENV:
        fail(f"--buffer-size {args.buffer_size} holds fewer than {MIN_SLOTS_PER_ENV} steps per env; raise it")
    if args.total_timesteps < args.num_envs:
        fail(f"--total-timesteps {args.total_timesteps} is less than one step of the {args.num_envs} envs")
    if not 0 <= args.learning_starts < args.total_timesteps:
        fail(
            f"--learning-starts {args.learning_starts} must lie in [0, total_timesteps = {args.total_timesteps}): "
            "the run would never update; lower it"
        )
    # The first update: the first multiple of train_frequency past learning_starts, within the steps the envs run
    first_update = (args.learning_starts // args.train_frequency + 1) * args.train_frequency
    total_steps = args.total_timesteps // args.num_envs * args.num_envs
    if first_update > total_steps:
        fail(
            f"the first update would come at step {first_update:,}, after the run's {total_steps:,} steps "
            "(--learning-starts, --train-frequency, --num-envs): the run would never update; lower --learning-starts"
        )


def warn_if_bf16_is_slow(mixed_precision: str, device: torch.device):
    # oneDNN has bf16 kernels only on CPUs with AVX-512 (or ARM's bf16); elsewhere autocast emulates
    # bf16, and training runs several times slower than fp32 (8x on a 2-core AVX2 EPYC).
    if mixed_precision == "bf16" and device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("warning: this CPU has no fast bf16 (oneDNN needs AVX-512): bf16 runs slower than fp32", file=sys.stderr)


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
    model = {"model": agent.state_dict(), "sizes": (agent.num_actions, agent.n_atoms)}  # this script
    torch.save({**model, "args": vars(args)}, path + ".tmp")  # this script
    os.replace(path + ".tmp", path)


def load_model(path: str, device) -> tuple[nn.Module, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location=device, weights_only=True)  # this script
        agent = QNetwork(*payload["sizes"]).to(device).to(memory_format=torch.channels_last)  # this script
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
    rng = np.random.default_rng(seed)  # this script
    agent = acting_copy(agent, torch.bfloat16) if args.mixed_precision == "bf16" else agent  # this script
    video = (
        VideoRecorder(video_folder, env_id, seed, args, schedule=lambda game: game < quota[0]) if video_folder else None
    )
    stats, returns = EpisodeStatistics(num_envs), [[] for _ in range(num_envs)]
    obs, _ = envs.reset(seed=seed)  # this script
    while any(len(r) < q for r, q in zip(returns, quota)):
        action = epsilon_greedy(agent, obs, args.eval_epsilon, rng, device)  # this script
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
RESUMABLE_CHANGES |= {"cuda", "eval_epsilon"}  # this script: where it runs, how it is evaluated


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
