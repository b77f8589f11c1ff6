"""PPO on Atari with envpool 1.x, one file.

Proximal Policy Optimization with the Nature-CNN agent and the standard Atari preprocessing
(noop reset, frame skip 4 with max-pool, fire on reset, 84x84 grayscale, stack of 4, episodic life
and reward clipping for learning), all done by envpool's C++ thread pool. envpool resets a finished
episode on the step after it ends; the loop leaves those reset steps out of the update.
With `--checkpoint-every K` a run can be stopped and continued (`--resume`).
Docs: docs/ppo_atari_envpool.md
"""

import fcntl
import glob
import hashlib
import os
import queue
import random
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
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
    """if toggled, games 0, 1, 8, 27, ..., then every 1000th game of env 0 are saved as RGB mp4 files to `videos/{run_name}/`"""
    save_model: bool = False
    """if toggled, the model is saved to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluated"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` full games"""
    eval_episodes: int = 10
    """the number of full games played by the evaluation"""
    mixed_precision: Literal["none", "bf16"] = "none"
    """bf16 autocasts the network's forward passes; loss, advantages and optimizer stay fp32"""
    progress_interval: float = 30.0
    """seconds between plain progress lines when stderr is not a terminal (log files, Slurm, nohup)"""
    checkpoint_every: int = 0
    """write a resumable checkpoint (weights, optimizer, random streams, counters) to `runs/{run_name}/checkpoints/` every K iterations and at the end (0: never)"""
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
    noop_max: int = 30, rgb_frames: bool = False,
):
    # Environment i is seeded with seed + i (envpool ignores reset(seed=...)). Synchronous:
    # batch_size = num_envs, so each step returns every environment in order.
    # episodic_life: a lost life ends the learning episode (terminated) but the game goes on with
    # its remaining lives; FIRE is pressed on the reset step after it; info["terminated"] marks the
    # real game over. reward_clip: the returned reward is sign(reward), info["reward"] the raw one.
    # noop_max=0 crashes envpool 1.2.5; noop_max=1 means no no-op starts.
    # rgb_frames: the same games, seen as full 210x160 RGB screens instead of the agent's stack of
    # 84x84 grayscale frames (for videos).
    return envpool.make(
        envpool_task(env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        num_threads=min(num_envs, os.cpu_count() or 1),
        seed=seed,
        max_episode_steps=max_episode_steps,
        repeat_action_probability=repeat_action_probability,
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
    """Running score and length of the game each environment is playing.

    A game ends at a real game over or at the time limit: both reset the running return, so a
    truncated game's score is never carried into the next game. The length counts the steps whose
    action was played (envpool's `elapsed_step`), not the reset steps, whose action is ignored.
    """

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def step(self, rewards: np.ndarray, game_over: np.ndarray, played: np.ndarray) -> list[tuple[int, float, int]]:
        """Adds one step of unclipped rewards; returns (env index, return, length) of finished games."""
        self.returns += rewards
        self.lengths += played
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

    The agent's envpool returns only 84x84 grayscale stacks, so a one-env shadow of env 0 (same
    game, seed and settings, full 210x160 RGB screens) is given env 0's actions and plays the
    identical game. Frames stream to a background thread that encodes them with ffmpeg as they
    come: training never waits for an encoder, and a long game is never held in memory.
    `close()` finishes the last file; under --track each finished file goes to wandb.
    A video holds every screen of its game: the first, one per step, and the screens of the reset
    steps after each lost life (envpool presses FIRE there).
    """

    def __init__(self, folder, env_id, seed, repeat_action_probability, max_episode_steps, schedule=capped_cubic,
                 first_game: int = 0, track: bool = False, fps: int = 30):
        import imageio_ffmpeg  # imported here: only video runs pay for it

        os.makedirs(folder, exist_ok=True)
        self.folder, self.schedule, self.game, self.track, self.fps = folder, schedule, first_game, track, fps
        self.shadow = make_envs(env_id, 1, repeat_action_probability, seed, max_episode_steps, rgb_frames=True)
        screen, _ = self.shadow.reset()
        self.frames = queue.Queue(maxsize=1000)  # bounded: a stalled encoder slows training, never fills memory
        self.encoder = threading.Thread(target=self.encode, args=(imageio_ffmpeg,), daemon=True)
        self.encoder.start()
        self.start_game(screen)
        self.game_over = False

    def start_game(self, screen):
        self.recording = self.schedule(self.game)
        if self.recording:
            self.frames.put(os.path.join(self.folder, f"game-{self.game}.mp4"))
            self.frames.put(screen[0].transpose(1, 2, 0))

    def step(self, action_env0: int):
        screen, _, _, truncated, info = self.shadow.step(np.array([action_env0]))
        if self.game_over:  # the reset step after a game over brings the next game's first screen
            self.game += 1
            self.start_game(screen)
        elif self.recording:
            self.frames.put(screen[0].transpose(1, 2, 0))
        self.game_over = bool(info["terminated"][0] or truncated[0])
        if self.game_over and self.recording:
            self.frames.put(None)  # end of this file

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


def bootstrap_truncations(rewards, values, truncations, next_value, gamma: float):
    """A time limit is not a death: a truncated step's reward gains gamma * V(its last observation).

    envpool returns that observation at the truncated step itself and resets the game only on the
    next step, so the observation is the one stored for the following step: its value is
    values[t + 1], or next_value after the rollout's last step. No extra forward pass is needed.
    rewards, values, truncations: (num_steps, num_envs); next_value: (num_envs,).
    """
    following_values = torch.cat([values[1:], next_value[None]])
    return rewards + gamma * following_values * truncations


def played_minibatches(played, num_minibatches: int) -> tuple[torch.Tensor, ...]:
    """Shuffled flat indices of the played steps, in `num_minibatches` parts of nearly equal size.

    played: (num_steps, num_envs) bool, False at envpool's reset steps, which never enter the update;
    the parts are a few samples short of batch_size / num_minibatches when reset steps fell in the rollout.
    """
    b_played = torch.nonzero(played.reshape(-1)).flatten()
    return torch.tensor_split(b_played[torch.randperm(len(b_played), device=played.device)], num_minibatches)


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
        # Reset steps leave the update, so a minibatch of tiny settings can hold a single sample:
        # its std would be NaN with Bessel's correction.
        std = advantages.std(correction=min(1, len(advantages) - 1))
        advantages = (advantages - advantages.mean()) / (std + 1e-8)
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


# Arguments a resumed run may change: how it is watched and saved, not what it learns.
RESUMABLE_CHANGES = {
    "cuda", "track", "wandb_project_name", "wandb_entity", "capture_video", "save_model", "eval_checkpoint",
    "eval_episodes", "progress_interval", "checkpoint_every", "resume",
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


def rng_state(device) -> dict:
    """The process's random streams, in types `torch.load(weights_only=True)` reads back."""
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


def save_checkpoint(folder: str, iteration: int, global_step: int, agent: Agent, optimizer, env0_games: int,
                    recent_returns: deque, device, args: Args, run_name: str) -> str:
    """Everything a resumed run needs. Written to a temporary file, synced and renamed, so a crash
    leaves either the previous checkpoint or this one, never a truncated file. The newest two are kept."""
    path = os.path.join(folder, f"iteration-{iteration:07d}.pt")
    payload = {
        "model": agent.state_dict(), "optimizer": optimizer.state_dict(),
        "iteration": iteration, "global_step": global_step, "rng_state": rng_state(device),
        "env0_games": env0_games,  # the games env 0 finished: a resumed run numbers its videos on
        "recent_returns": list(recent_returns), "args": vars(args), "run_name": run_name,
        "script_sha256": script_digest(),
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


def read_checkpoint(resume: str, args: Args) -> dict | None:
    """The checkpoint `--resume` names, or None when `auto` finds none. Its run's arguments must be
    this command's, but for RESUMABLE_CHANGES."""
    if resume == "auto":
        run_prefix = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__"
        found = glob.glob(os.path.join("runs", f"{glob.escape(run_prefix)}*", "checkpoints", "iteration-*.pt"))
        if not found:
            print(f"--resume auto: no checkpoint of {run_prefix}* in runs/, starting a new run")
            return None
        path = max(found, key=os.path.getmtime)
        print(f"--resume auto: {path}, the newest by modification time of {len(found)} checkpoint(s) of {run_prefix}*")
    else:
        path = resume
    if not os.path.isfile(path):
        fail(f"--resume {path!r}: no such checkpoint file (pass a runs/*/checkpoints/iteration-*.pt file or auto)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        payload["iteration"], payload["optimizer"], payload["rng_state"], payload["run_name"]
        saved_args = dict(payload["args"])
    except Exception as e:  # an unreadable file, or a saved model instead of a checkpoint
        fail(f"--resume {path!r} is not a readable {os.path.basename(__file__)} checkpoint ({type(e).__name__})")
    for name, value in vars(args).items():
        if name not in RESUMABLE_CHANGES and saved_args.get(name) != value:
            fail(f"--resume: the checkpoint's run has {name}={saved_args.get(name)!r}, this command {value!r}: "
                 "resume with the run's arguments")
    payload["path"] = path
    return payload


def restore_checkpoint(checkpoint: dict, agent: Agent, optimizer, recent_returns: deque, device) -> tuple[int, int]:
    """Puts what read_checkpoint() read back into the run; returns (iteration, global_step)."""
    agent.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    set_rng_state(checkpoint["rng_state"], device)
    recent_returns.extend(checkpoint["recent_returns"])  # for the progress lines only
    return checkpoint["iteration"], checkpoint["global_step"]


def evaluate(
    agent: Agent,
    env_id: str,
    eval_episodes: int,
    device,
    seed: int = 0,
    repeat_action_probability: float = 0.0,
    video_folder: str | None = None,
    mixed_precision: str = "none",
    max_episode_steps: int = 27_000,
) -> list[float]:
    """Plays `eval_episodes` full games (all lives, unclipped score) with the sampled policy."""
    num_envs = min(8, eval_episodes)
    # Each env plays a fixed quota of games: keeping only the first games to finish would favour
    # short (bad) games.
    quota = np.array([eval_episodes // num_envs + (i < eval_episodes % num_envs) for i in range(num_envs)])
    # The same environment as for training: with episodic life envpool presses FIRE after each lost
    # life, so an agent trained on it may never have learned to launch the ball itself.
    envs = make_envs(env_id, num_envs, repeat_action_probability, seed, max_episode_steps)
    stats = EpisodeStatistics(num_envs)
    if video_folder is not None:  # every evaluation game of env 0
        video = VideoRecorder(
            video_folder, env_id, seed, repeat_action_probability, max_episode_steps, schedule=lambda game: game < quota[0]
        )
    returns = [[] for _ in range(num_envs)]
    obs, _ = envs.reset()
    reset_step = np.zeros(num_envs, dtype=bool)
    while any(len(r) < q for r, q in zip(returns, quota)):
        with torch.inference_mode(), torch.autocast(device.type, torch.bfloat16, enabled=mixed_precision == "bf16"):
            action, _, _, _ = agent.get_action_and_value(torch.from_numpy(obs).to(device))
        action = action.cpu().numpy()
        obs, _, terminated, truncated, info = envs.step(action)
        game_over = info["terminated"].astype(bool) | truncated
        if video_folder is not None:
            video.step(action[0])
        for i, episodic_return, _ in stats.step(info["reward"], game_over, ~reset_step):
            if len(returns[i]) < quota[i]:
                returns[i].append(episodic_return)
        reset_step = terminated | truncated
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
        agent, env_id, args.eval_episodes, device, args.seed, args.repeat_action_probability, video_folder,
        args.mixed_precision, args.max_episode_steps,
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
    args.batch_size = args.num_envs * args.num_steps
    counts = (args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs, args.eval_episodes)
    if min(*counts, args.max_episode_steps) < 1:
        fail(
            "--num-envs, --num-steps, --num-minibatches, --update-epochs, --eval-episodes and --max-episode-steps"
            " must be positive"
        )
    if args.num_steps < 2:
        # A one-step rollout of envs that all sit on a reset step would leave nothing to learn from.
        fail("--num-steps must be at least 2: envpool spends a step on every reset")
    if args.batch_size % args.num_minibatches != 0:
        fail(
            f"num_envs * num_steps = {args.batch_size} is not divisible by num_minibatches = {args.num_minibatches}"
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

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    autocast = lambda: torch.autocast(device.type, torch.bfloat16, enabled=args.mixed_precision == "bf16")
    warn_if_bf16_is_slow(args.mixed_precision, device)

    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    training = args.eval_checkpoint is None
    checkpoint = read_checkpoint(args.resume, args) if training and args.resume is not None else None
    if checkpoint is not None:
        run_name = checkpoint["run_name"]  # a resumed run goes on in its own directory
    checkpoint_folder = f"runs/{run_name}/checkpoints"
    run_lock = lock_run(checkpoint_folder) if training and (args.checkpoint_every or checkpoint) else None
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
    writer = SummaryWriter(f"runs/{run_name}", purge_step=checkpoint["global_step"] + 1 if checkpoint else None)
    if checkpoint is None:
        writer.add_text(
            "hyperparameters",
            "|param|value|\n|-|-|\n%s" % ("\n".join([f"|{key}|{value}|" for key, value in vars(args).items()])),
        )

    if not training:
        run_evaluation(args, device, writer, run_name)
        writer.close()
        return

    # Environment i gets seed + i. The games in progress at a checkpoint are not in it (nor logged):
    # a resumed run starts new games, on seeds the run has not used (seed + iteration * num_envs + i).
    start_iteration = checkpoint["iteration"] if checkpoint is not None else 0
    env_seed = args.seed + start_iteration * args.num_envs
    envs = make_envs(args.env_id, args.num_envs, args.repeat_action_probability, env_seed, args.max_episode_steps)
    num_actions = int(envs.single_action_space.n)
    agent = Agent(num_actions).to(device).to(memory_format=torch.channels_last)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)

    # Rollout storage. Observations stay uint8: 4x less memory and copying than float.
    obs = torch.zeros((args.num_steps, args.num_envs, 4, 84, 84), dtype=torch.uint8, device=device)
    actions = torch.zeros((args.num_steps, args.num_envs), dtype=torch.long, device=device)
    logprobs = torch.zeros((args.num_steps, args.num_envs), device=device)
    rewards = torch.zeros((args.num_steps, args.num_envs), device=device)
    dones = torch.zeros((args.num_steps, args.num_envs), device=device)
    truncations = torch.zeros((args.num_steps, args.num_envs), device=device)
    played = torch.zeros((args.num_steps, args.num_envs), dtype=torch.bool, device=device)
    values = torch.zeros((args.num_steps, args.num_envs), device=device)

    global_step, env0_games = 0, 0
    recent_returns = deque(maxlen=20)
    if checkpoint is not None:
        start_iteration, global_step = restore_checkpoint(checkpoint, agent, optimizer, recent_returns, device)
        env0_games = checkpoint["env0_games"]
        print(f"resumed {run_name} at iteration {start_iteration} (step {global_step:,}) from {checkpoint['path']}",
              flush=True)
        if checkpoint["script_sha256"] != script_digest():
            print(f"warning: {os.path.basename(__file__)} has changed since the checkpoint was written: "
                  "the run goes on with the code as it is now", flush=True)
        del checkpoint

    next_obs_np, _ = envs.reset()
    next_obs = torch.from_numpy(next_obs_np).to(device)
    # envpool resets an environment on the step *after* its episode ended: that reset step ignores
    # the action and returns the new episode's first observation, reward 0. Its "transition" (last
    # observation of one episode -> first of the next) is not one the agent can cause, so it is kept
    # out of the update (played = False); it still counts towards global_step.
    reset_step = np.zeros(args.num_envs, dtype=bool)
    episode_stats = EpisodeStatistics(args.num_envs)
    progress = Progress(args.num_iterations * args.batch_size, args.progress_interval)
    if args.capture_video:
        video = VideoRecorder(
            f"videos/{run_name}", args.env_id, env_seed, args.repeat_action_probability, args.max_episode_steps,
            first_game=env0_games, track=args.track,
        )
    start_time, start_global_step, sps = time.time(), global_step, 0

    for iteration in range(start_iteration + 1, args.num_iterations + 1):
        if args.anneal_lr:
            frac = 1.0 - (iteration - 1.0) / args.num_iterations
            optimizer.param_groups[0]["lr"] = frac * args.learning_rate

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
            # Episodic life: `terminated` is set at each lost life (the game goes on), which makes
            # the value of losing a life visible to the agent; `reward` is already clipped.
            # The real end of a game, for the statistics: info["terminated"] or the time limit.
            game_over = info["terminated"].astype(bool) | truncated
            rewards[step] = torch.from_numpy(reward).to(device)
            dones[step] = torch.from_numpy(terminated | truncated).to(device)
            # envpool also flags the time limit on a game that ended on its last allowed step: that
            # game is over, nothing to bootstrap.
            truncations[step] = torch.from_numpy(truncated & ~info["terminated"].astype(bool)).to(device)
            played[step] = torch.from_numpy(~reset_step).to(device)
            next_obs = torch.from_numpy(next_obs_np).to(device)

            if args.capture_video:
                video.step(action[0])
            env0_games += bool(game_over[0])
            for i, episodic_return, episodic_length in episode_stats.step(info["reward"], game_over, ~reset_step):
                recent_returns.append(episodic_return)
                # The env steps of one vector step count as consecutive global steps, env 0 first,
                # so every game is logged at a step of its own.
                writer.add_scalar("charts/episodic_return", episodic_return, global_step - args.num_envs + i + 1)
                writer.add_scalar("charts/episodic_length", episodic_length, global_step - args.num_envs + i + 1)
            reset_step = terminated | truncated

        with torch.inference_mode(), autocast():
            next_value = agent.get_value(next_obs).flatten()
        # Reset steps need no care here: the step before each has done = 1, which cuts the
        # advantage off from them; their own advantages are never used.
        bootstrapped_rewards = bootstrap_truncations(rewards, values, truncations, next_value, args.gamma)
        advantages, returns = compute_gae(bootstrapped_rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs = obs.reshape((-1, 4, 84, 84))
        b_logprobs = logprobs.reshape(-1)
        b_actions = actions.reshape(-1)
        b_advantages = advantages.reshape(-1)
        b_returns = returns.reshape(-1)
        b_values = values.reshape(-1)
        b_played = played.reshape(-1)

        clipfracs = []
        for epoch in range(args.update_epochs):
            for mb_inds in played_minibatches(played, args.num_minibatches):
                if len(mb_inds) == 0:  # fewer played steps than minibatches (tiny settings)
                    continue
                with autocast():
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                loss, stats = ppo_loss(
                    newlogprob, entropy, newvalue, b_logprobs[mb_inds], b_advantages[mb_inds],
                    b_returns[mb_inds], b_values[mb_inds], args,
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        y_pred, y_true = b_values[b_played].cpu().numpy(), b_returns[b_played].cpu().numpy()
        var_y = np.var(y_true)
        explained_var = np.nan if var_y == 0 else 1 - np.var(y_true - y_pred) / var_y

        sps = int((global_step - start_global_step) / (time.time() - start_time))
        writer.add_scalar("charts/learning_rate", optimizer.param_groups[0]["lr"], global_step)
        writer.add_scalar("losses/value_loss", stats["value_loss"].item(), global_step)
        writer.add_scalar("losses/policy_loss", stats["policy_loss"].item(), global_step)
        writer.add_scalar("losses/entropy", stats["entropy"].item(), global_step)
        writer.add_scalar("losses/old_approx_kl", stats["old_approx_kl"].item(), global_step)
        writer.add_scalar("losses/approx_kl", stats["approx_kl"].item(), global_step)
        writer.add_scalar("losses/clipfrac", torch.stack(clipfracs).mean().item(), global_step)
        writer.add_scalar("losses/explained_variance", explained_var, global_step)
        writer.add_scalar("charts/SPS", sps, global_step)
        progress.show(global_step, sps, recent_returns)

        if args.checkpoint_every and (iteration % args.checkpoint_every == 0 or iteration == args.num_iterations):
            writer.flush()  # everything up to this checkpoint is on disk before it counts
            path = save_checkpoint(checkpoint_folder, iteration, global_step, agent, optimizer, env0_games,
                                   recent_returns, device, args, run_name)
            print(f"checkpoint {path}", flush=True)

    progress.close()
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} games {recent}"
    )
    envs.close()
    if args.capture_video:
        video.close()

    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_model(model_path, agent, args)
        print(f"model saved to {model_path}")
        run_evaluation(args, device, writer, run_name, agent)
    writer.close()
    if run_lock is not None:
        run_lock.close()


if __name__ == "__main__":
    main(tyro.cli(Args))
