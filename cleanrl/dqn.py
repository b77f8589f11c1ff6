"""DQN for classic control (gymnasium 1.x), one file.

Deep Q-learning with a replay memory, a target network (a hard copy every `target_network_frequency`
steps, or Polyak averaging with `--tau` < 1) and a linearly decaying epsilon-greedy exploration, on
CartPole-v1 by default, in a gymnasium `SyncVectorEnv` with SAME_STEP autoreset: a time-limit
truncation is bootstrapped from the real last observation; only a termination ends the TD target.
Beside the algorithm: videos, and evaluation of a saved model.
Docs: docs/dqn.md
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
import torch.nn.functional as F
import torch.optim as optim
import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclass
class Args:
    # Experiment
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
    save_model: bool = False
    """if toggled, save the Q-network to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluate it"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` episodes"""
    eval_episodes: int = 10
    """the number of episodes played by the evaluation"""
    eval_epsilon: float = 0.05
    """the exploration rate of the evaluation's epsilon-greedy policy"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""

    # Environment
    env_id: str = "CartPole-v1"
    """the gymnasium id of the environment (discrete actions, flat observations)"""

    # Algorithm
    total_timesteps: int = 500000
    """total number of environment steps of the experiment (all envs together)"""
    learning_rate: float = 2.5e-4
    """the learning rate of the Adam optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    buffer_size: int = 10000
    """the replay memory size, in transitions (one env step each)"""
    gamma: float = 0.99
    """the discount factor"""
    tau: float = 1.0
    """the target network update rate: 1 copies the Q-network, below 1 is Polyak averaging"""
    target_network_frequency: int = 500
    """the number of environment steps between target network updates"""
    batch_size: int = 128
    """the number of transitions sampled from the replay memory for each update"""
    start_e: float = 1.0
    """the starting epsilon of the exploration"""
    end_e: float = 0.05
    """the final epsilon of the exploration"""
    exploration_fraction: float = 0.5
    """the fraction of `total_timesteps` over which epsilon decays from start_e to end_e"""
    learning_starts: int = 10000
    """the number of environment steps before learning starts (the memory fills meanwhile)"""
    train_frequency: int = 10
    """the number of environment steps between updates of the Q-network"""


# Losses, Q-values, epsilon and SPS are logged every this many environment steps.
LOG_EVERY = 100


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def make_env(env_id: str, video_folder: str | None = None, record_every_episode: bool = False) -> gym.Env:
    if video_folder is None:
        return gym.make(env_id)
    env = gym.make(env_id, render_mode="rgb_array")
    # RecordVideo's default trigger is the capped cubic schedule (episodes 0, 1, 8, 27, ..., 1000, 2000, ...)
    trigger = (lambda episode: True) if record_every_episode else None
    return gym.wrappers.RecordVideo(env, video_folder, episode_trigger=trigger)


def make_envs(env_id: str, num_envs: int, capture_video: bool, run_name: str) -> gym.vector.SyncVectorEnv:
    # SAME_STEP: the step that ends an episode already returns the next episode's first observation, and
    # the real last one comes in infos["final_obs"]. gymnasium 1.x's default, NEXT_STEP, would put its
    # reset step (reward 0, action ignored) into the replay memory as a fake transition.
    video_folder = f"videos/{run_name}" if capture_video else None
    thunks = [lambda i=i: make_env(env_id, video_folder if i == 0 else None) for i in range(num_envs)]
    return gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def real_next_obs(next_obs: np.ndarray, infos: dict, episode_done: np.ndarray) -> np.ndarray:
    """The observation each env's step really ended in, (num_envs, ...): where an episode ended, SAME_STEP
    autoreset returns the next episode's first observation in `next_obs` and the real last one in
    infos["final_obs"] (an object array, None where the episode goes on)."""
    if not episode_done.any():
        return next_obs
    real = next_obs.copy()
    real[episode_done] = np.stack(infos["final_obs"][episode_done])
    return real


class EpisodeStatistics:
    """Return and length of the running episode of each env, for logging."""

    def __init__(self, num_envs: int):
        self.returns = np.zeros(num_envs, dtype=np.float64)
        self.lengths = np.zeros(num_envs, dtype=np.int64)

    def update(self, rewards: np.ndarray, dones: np.ndarray) -> list[tuple[int, float, int]]:
        """Counts one step of every env; returns (env index, return, length) of each episode that ended."""
        self.returns += rewards
        self.lengths += 1
        if not dones.any():  # most steps: skip the bookkeeping below
            return []
        finished = [(int(i), float(self.returns[i]), int(self.lengths[i])) for i in np.flatnonzero(dones)]
        self.returns[dones] = 0.0
        self.lengths[dones] = 0
        return finished


# ---------------------------------------------------------------------------------------------
# Replay memory
# ---------------------------------------------------------------------------------------------
class ReplayBuffer:
    """The last `size` transitions of all envs (one per env step), the oldest overwritten first. Each row
    holds (obs, action, reward, next_obs, termination): next_obs is the observation the step really ended
    in, also at a truncation, and `done` the termination alone, so the TD target bootstraps through a time
    limit and stops at a real end."""

    def __init__(self, size: int, obs_shape: tuple[int, ...]):
        self.size, self.pos, self.count = size, 0, 0
        self.obs = np.zeros((size, *obs_shape), dtype=np.float32)
        self.next_obs = np.zeros((size, *obs_shape), dtype=np.float32)
        self.actions = np.zeros(size, dtype=np.int64)
        self.rewards = np.zeros(size, dtype=np.float32)
        self.dones = np.zeros(size, dtype=np.float32)

    def add(self, obs, next_obs, actions, rewards, terminations):
        n = len(obs)
        # a slice unless the rows wrap around the end (4x faster than an index array per step)
        rows = slice(self.pos, self.pos + n) if self.pos + n <= self.size else (self.pos + np.arange(n)) % self.size
        self.obs[rows], self.next_obs[rows] = obs, next_obs
        self.actions[rows], self.rewards[rows], self.dones[rows] = actions, rewards, terminations
        self.pos = (self.pos + n) % self.size
        self.count = min(self.count + n, self.size)

    def sample(self, batch_size: int, rng: np.random.Generator, device) -> dict[str, torch.Tensor]:
        rows = rng.integers(0, self.count, size=batch_size)  # uniform with replacement, as the original DQN
        fields = ("obs", "actions", "rewards", "next_obs", "dones")
        return {name: torch.from_numpy(getattr(self, name)[rows]).to(device) for name in fields}


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    def __init__(self, obs_dim: int, num_actions: int):
        super().__init__()
        self.sizes = (obs_dim, num_actions)
        self.network = nn.Sequential(
            nn.Linear(obs_dim, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_actions),
        )
        self.numpy_views, self.numpy_views_at = [], None  # of the weights, for greedy_actions

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x)

    def greedy_actions(self, obs: np.ndarray) -> np.ndarray:
        """argmax_a Q(s, a) for each row s of obs (num_envs, obs_dim). Acting sees one state per env and
        step, where torch's per-call overhead is many times the math: a third of a CartPole step in the
        learning phase. So on the CPU the same three layers run in numpy (numpy_q_values), on views of the
        very weights: no copy, and Adam's in-place steps show in them at once. Both are float32 and agree to
        a relative 1e-7 (another summation order), so only a near-exact tie could pick the other action."""
        first_weight = self.network[0].weight
        if first_weight.device.type != "cpu":  # on a GPU the weights stay there
            with torch.inference_mode():
                q_values = self(torch.as_tensor(obs, dtype=torch.float32, device=first_weight.device))
                return q_values.argmax(dim=1).cpu().numpy()
        obs = np.asarray(obs, dtype=np.float32)
        if self.numpy_views_at != first_weight.data_ptr():  # the first call, or the weights moved
            self.numpy_views = [p.detach().numpy() for p in self.network.parameters()]
            self.numpy_views_at = first_weight.data_ptr()
            with torch.no_grad():  # the numpy layers must be the network's: an edited network stops here
                if not np.allclose(self.numpy_q_values(obs), self(torch.from_numpy(obs)).numpy(), 1e-4, 1e-4):
                    raise RuntimeError("QNetwork.numpy_q_values no longer computes forward(): edit both")
        return self.numpy_q_values(obs).argmax(axis=1)

    def numpy_q_values(self, obs: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2, w3, b3 = self.numpy_views
        hidden = np.maximum(obs @ w1.T + b1, 0)
        hidden = np.maximum(hidden @ w2.T + b2, 0)
        return hidden @ w3.T + b3


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def linear_schedule(start_e: float, end_e: float, duration: float, t: int) -> float:
    """Epsilon at step t: from start_e down to end_e in a straight line over `duration` steps, then end_e."""
    if t >= duration:
        return end_e
    return start_e + (end_e - start_e) * t / duration


def td_target(rewards: torch.Tensor, dones: torch.Tensor, next_q_values: torch.Tensor, gamma: float) -> torch.Tensor:
    """r + gamma * max_a Q_target(s', a), without the bootstrap where the episode terminated.
    rewards, dones: (batch,); dones is 1.0 where the transition terminated the episode (a truncation is
    not one: its s' is the real last observation and its future is bootstrapped). next_q_values:
    (batch, num_actions), the target network's Q-values of s'."""
    return rewards + gamma * (1.0 - dones) * next_q_values.max(dim=1).values


def epsilon_greedy(q_network: QNetwork, obs: np.ndarray, epsilon: float, num_actions: int, rng) -> np.ndarray:
    """One action per env: uniformly random with probability epsilon (each env on its own coin), else the
    argmax of the Q-values. A classic-control step costs a fraction of a millisecond, so this stays lean:
    one draw gives the coins and the random actions (numpy's integers() alone would add 5% to a step), and
    the network runs only when some env acts greedily."""
    coins, uniforms = rng.random((2, len(obs)))
    explore = coins < epsilon
    num_exploring = np.count_nonzero(explore)
    if num_exploring == len(obs):
        return (uniforms * num_actions).astype(np.int64)  # uniform over 0 .. num_actions - 1
    greedy = q_network.greedy_actions(obs)
    if num_exploring == 0:
        return greedy
    return np.where(explore, (uniforms * num_actions).astype(np.int64), greedy)


def update_target(target_network: nn.Module, q_network: nn.Module, tau: float):
    """target <- tau * online + (1 - tau) * target; tau = 1 is the hard copy of the original DQN."""
    with torch.no_grad():
        for target_param, param in zip(target_network.parameters(), q_network.parameters()):
            target_param.mul_(1.0 - tau).add_(param, alpha=tau)


def main(args: Args):
    check_args(args)
    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    torch.backends.cudnn.deterministic = args.torch_deterministic
    # The network is tiny, so extra intra-op threads gain nothing; when other processes share the
    # cores (several seeds at once) their spin-waits slow every step down many times.
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    if args.eval_checkpoint is not None:  # no training: play the saved model's episodes
        q_network, saved_args = load_model(args.eval_checkpoint, device)
        env_id = saved_args["env_id"]  # the run is named after the env it plays
        check_env_exists(env_id)
        run_name = f"{env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        writer = start_logging(args, run_name, None)
        evaluate_episodes(args, writer, run_name, q_network, env_id)
        return finish_logging(args, writer, run_name)
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        envs = make_envs(args.env_id, args.num_envs, args.capture_video, run_name)
        obs, _ = envs.reset(seed=args.seed)  # a missing render dependency of --capture-video (pygame) shows here
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: an id `module:Env`
        fail(f"cannot make environment {args.env_id!r}: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        fail(f"{args.env_id} has action space {envs.single_action_space}; DQN needs a Discrete one")
    obs_space = envs.single_observation_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        fail(f"{args.env_id} has observation space {obs_space}; this script needs a flat Box (vectors)")
    writer = start_logging(args, run_name, None)

    num_actions = int(envs.single_action_space.n)
    q_network = QNetwork(obs_space.shape[0], num_actions).to(device)
    # fused: one kernel for all parameters instead of a dozen small ops per tensor (the same algorithm)
    optimizer = optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)
    target_network = QNetwork(obs_space.shape[0], num_actions).to(device)
    target_network.load_state_dict(q_network.state_dict())
    rb = ReplayBuffer(args.buffer_size, obs_space.shape)
    rng = np.random.default_rng(args.seed)  # the exploration and the memory's sampling

    episode_stats = EpisodeStatistics(args.num_envs)
    num_vector_steps = args.total_timesteps // args.num_envs
    total_steps = num_vector_steps * args.num_envs
    progress = Progress(total_steps, args.progress_interval)
    exploration_steps = args.exploration_fraction * args.total_timesteps
    global_step, num_updates, recent_returns = 0, 0, deque(maxlen=20)
    window = []  # (TD loss, mean Q(s, a)) of the updates since the last log point
    start_time = time.time()

    for _ in range(num_vector_steps):
        epsilon = linear_schedule(args.start_e, args.end_e, exploration_steps, global_step)
        actions = epsilon_greedy(q_network, obs, epsilon, num_actions, rng)
        next_obs, rewards, terminations, truncations, infos = envs.step(actions)
        episode_done = terminations | truncations
        rb.add(obs, real_next_obs(next_obs, infos, episode_done), actions, rewards, terminations)
        obs = next_obs

        # The env steps of one vector step count as consecutive global steps, env 0 first, so every
        # episode is logged at a step of its own.
        for i, episodic_return, episodic_length in episode_stats.update(rewards, episode_done):
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
                    target = td_target(batch["rewards"], batch["dones"], target_network(batch["next_obs"]), args.gamma)
                q_taken = q_network(batch["obs"]).gather(1, batch["actions"][:, None]).squeeze(1)
                loss = F.mse_loss(q_taken, target)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                num_updates += 1
                window.append((loss.item(), q_taken.mean().item()))
            if step > args.learning_starts and step % args.target_network_frequency == 0:
                update_target(target_network, q_network, args.tau)
        previous_step, global_step = global_step, global_step + args.num_envs

        if global_step // LOG_EVERY > previous_step // LOG_EVERY or global_step == total_steps:
            sps = int(global_step / (time.time() - start_time))
            writer.add_scalar("charts/SPS", sps, global_step)
            writer.add_scalar("charts/epsilon", epsilon, global_step)
            if window:
                td_loss, q_values = np.mean(window, axis=0)
                writer.add_scalar("losses/td_loss", td_loss, global_step)
                writer.add_scalar("losses/q_values", q_values, global_step)
                window.clear()
            progress.show(global_step, sps, recent_returns)

    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {global_step} steps and {num_updates} updates, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} episodes {recent}"
    )
    envs.close()  # also finishes the last video
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_model(model_path, q_network, args)
        print(f"model saved to {model_path}")
        evaluate_episodes(args, writer, run_name, q_network, args.env_id)
    finish_logging(args, writer, run_name)


# =============================================================================================
# Run infrastructure: what makes a run watchable and reusable; not the algorithm. Each block is the
# same text in every script that has it (tests/test_blocks.py), but for lines marked `# this script`.
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
    if args.learning_rate < 0:
        fail(f"--learning-rate must not be negative, got {args.learning_rate}")
    if not 0 <= args.seed < 2**32:  # what numpy's seed takes
        fail(f"--seed must lie in [0, 2**32), got {args.seed}")
    counts = ("num_envs", "buffer_size", "batch_size", "total_timesteps", "train_frequency")
    for name in (*counts, "target_network_frequency", "eval_episodes"):
        if getattr(args, name) < 1:
            fail(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    for name in ("gamma", "start_e", "end_e", "exploration_fraction", "eval_epsilon"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            fail(f"--{name.replace('_', '-')} must lie in [0, 1], got {getattr(args, name)}")
    if not 0.0 < args.tau <= 1.0:
        fail(f"--tau must lie in (0, 1], got {args.tau}")
    if args.buffer_size < args.num_envs:  # one vector step would overwrite its own transitions
        fail(f"--buffer-size {args.buffer_size} is smaller than one step of the {args.num_envs} envs")
    if args.eval_checkpoint is not None:
        return
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


def save_model(path: str, agent: nn.Module, args: Args):
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    model = {"model": agent.state_dict(), "sizes": agent.sizes}  # this script
    torch.save({**model, "args": vars(args)}, path + ".tmp")  # this script
    os.replace(path + ".tmp", path)


def load_model(path: str, device) -> tuple[nn.Module, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location=device, weights_only=True)  # this script
        agent = QNetwork(*payload["sizes"]).to(device)  # this script
        agent.load_state_dict(payload["model"])  # this script
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return agent, dict(payload["args"])


def play_episodes(q_network, env_id: str, num_episodes: int, epsilon: float, seed=0, video_folder=None) -> list:
    """Plays whole episodes in one env (episode k on seed + k) epsilon-greedily; returns their returns. Not
    ppo_atari.py's `evaluate`, which plays games in a vector env of the Atari library."""
    env = make_env(env_id, video_folder, record_every_episode=True)
    rng = np.random.default_rng(seed)
    returns = []
    for episode in range(num_episodes):
        obs, _ = env.reset(seed=seed + episode)
        episode_return, done = 0.0, False
        while not done:
            action = int(epsilon_greedy(q_network, obs[None], epsilon, int(env.action_space.n), rng)[0])
            obs, reward, terminated, truncated, _ = env.step(action)
            episode_return += float(reward)
            done = terminated or truncated
        returns.append(episode_return)
    env.close()
    return returns


def evaluate_episodes(args: Args, writer: SummaryWriter, run_name: str, q_network, env_id: str) -> list:
    """Plays --eval-episodes episodes of env_id with the Q-network; prints and logs their returns."""
    video_folder = f"videos/{run_name}-eval" if args.capture_video else None
    returns = play_episodes(q_network, env_id, args.eval_episodes, args.eval_epsilon, args.seed, video_folder)
    for i, episodic_return in enumerate(returns):
        print(f"eval_episode={i}, episodic_return={episodic_return}")
        writer.add_scalar("eval/episodic_return", episodic_return, i)
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
