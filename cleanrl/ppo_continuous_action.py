"""PPO for continuous actions on gymnasium's MuJoCo tasks, one file: HalfCheetah-v5 by default, a Gaussian
policy with a state-independent log-std, running normalization of the observations and of the rewards,
GAE, and time-limit truncations bootstrapped from the real final observation. Docs: docs/ppo_continuous_action.md
"""

import math
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
    """if toggled, record episodes of env 0 to `videos/{run_name}/` (0, 1, 8, 27, ..., then every 1000th)"""
    save_model: bool = False
    """if toggled, save the model to `runs/{run_name}/{exp_name}.cleanrl_model` and evaluate it"""
    eval_checkpoint: str | None = None
    """if set, no training: load this saved model and play `eval_episodes` episodes"""
    eval_episodes: int = 10
    """the number of episodes played by the evaluation"""
    progress_interval: float = 30.0
    """the minimum seconds between two progress lines on stderr (the first and the last always print)"""

    # environment
    env_id: str = "HalfCheetah-v5"
    """the gymnasium id of the environment (continuous actions, flat observations)"""

    # algorithm
    total_timesteps: int = 1_000_000
    """total number of environment steps of the experiment"""
    learning_rate: float = 3e-4
    """the learning rate of the Adam optimizer"""
    num_envs: int = 1
    """the number of parallel environments"""
    num_steps: int = 2048
    """the number of steps per environment in each rollout"""
    anneal_lr: bool = True
    """if toggled, decay the learning rate linearly to 0 over the iterations"""
    gamma: float = 0.99
    """the discount factor (also of the return whose std scales the rewards)"""
    gae_lambda: float = 0.95
    """the lambda of generalized advantage estimation"""
    num_minibatches: int = 32
    """the number of minibatches each rollout is split into"""
    update_epochs: int = 10
    """the number of passes over the rollout in each update"""
    norm_adv: bool = True
    """if toggled, normalize the advantages of each minibatch"""
    clip_coef: float = 0.2
    """the clipping coefficient of the surrogate objective (and of the value loss)"""
    clip_vloss: bool = True
    """if toggled, clip the value loss as in the PPO paper's implementation"""
    ent_coef: float = 0.0
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


OBS_CLIP, REWARD_CLIP, EPS = 10.0, 10.0, 1e-8  # EPS keeps a division by a 0 variance finite


# ---------------------------------------------------------------------------------------------
# Environment
# ---------------------------------------------------------------------------------------------
def make_envs(env_id: str, num_envs: int, video_folder: str | None = None) -> gym.vector.VectorEnv:
    thunks = [lambda: gym.make(env_id)] * num_envs
    if video_folder is not None:  # env 0's episodes 0, 1, 8, 27, ..., then every 1000th (RecordVideo's default)
        os.environ.setdefault("MUJOCO_GL", "egl")  # renders offscreen: MuJoCo's default, GLFW, needs a display
        thunks[0] = lambda: gym.wrappers.RecordVideo(gym.make(env_id, render_mode="rgb_array"), video_folder)
    # SAME_STEP: the step that ends an episode already returns the next one's first observation. gymnasium
    # 1.x defaults to NEXT_STEP, which inserts a fake transition (reward 0, action ignored) after each end.
    envs = gym.vector.SyncVectorEnv(thunks, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    return gym.wrappers.vector.RecordEpisodeStatistics(envs)  # infos["episode"]: raw returns and lengths


class RunningMeanStd:
    """Mean and (population) variance of every sample seen so far, merged one batch at a time with the
    parallel formula of Chan et al., so the result equals the statistics of all samples at once."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.mean, self.var, self.count = np.zeros(shape, dtype=np.float64), np.ones(shape, dtype=np.float64), 0

    def update(self, batch: np.ndarray):  # batch: (n, *shape)
        n = batch.shape[0]  # np.add.reduce: on a few numbers twice a step, .mean()'s Python wrapper costs more
        batch_mean = np.add.reduce(batch, axis=0) / n
        batch_var = np.add.reduce(np.square(batch - batch_mean), axis=0) / n
        total = self.count + n
        delta = batch_mean - self.mean
        m2 = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean, self.var, self.count = self.mean + delta * n / total, m2 / total, total


def normalize_obs(obs: np.ndarray, mean: np.ndarray, var: np.ndarray) -> np.ndarray:
    return np.clip((obs - mean) / np.sqrt(var + EPS), -OBS_CLIP, OBS_CLIP).astype(np.float32)


class RewardNormalizer:
    """Divides rewards by the running std of each env's discounted return (not centred: a reward keeps its
    sign), then clips them. The return restarts at every episode end, terminated or truncated alike."""

    def __init__(self, num_envs: int, gamma: float):
        self.gamma, self.returns, self.return_rms = gamma, np.zeros(num_envs, dtype=np.float64), RunningMeanStd()

    def __call__(self, rewards: np.ndarray, dones: np.ndarray) -> np.ndarray:
        self.returns = self.returns * self.gamma + rewards
        self.return_rms.update(self.returns)
        self.returns[dones] = 0.0
        return np.clip(rewards / np.sqrt(self.return_rms.var + EPS), -REWARD_CLIP, REWARD_CLIP).astype(np.float32)


# ---------------------------------------------------------------------------------------------
# Network
# ---------------------------------------------------------------------------------------------
def layer_init(layer: nn.Linear, std: float = np.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    torch.nn.init.orthogonal_(layer.weight, std)
    torch.nn.init.constant_(layer.bias, bias_const)
    return layer


def gaussian_log_prob_and_entropy(action: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor):
    """log N(action; mean, exp(log_std)^2) and the entropy of a diagonal Gaussian, each summed over the action dims."""
    z = (action - mean) * torch.exp(-log_std)
    log_prob = (-0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
    return log_prob, (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)


def tanh_mlp(in_dim: int, out_dim: int, out_std: float) -> nn.Sequential:
    hidden = [layer_init(nn.Linear(in_dim, 64)), nn.Tanh(), layer_init(nn.Linear(64, 64)), nn.Tanh()]
    return nn.Sequential(*hidden, layer_init(nn.Linear(64, out_dim), std=out_std))


class Agent(nn.Module):
    def __init__(self, obs_dim: int, action_dim: int):
        super().__init__()
        self.critic = tanh_mlp(obs_dim, 1, out_std=1.0)
        self.actor_mean = tanh_mlp(obs_dim, action_dim, out_std=0.01)
        self.actor_logstd = nn.Parameter(torch.zeros(1, action_dim))  # state-independent, learned, starts at std 1

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x)

    def get_action_and_value(self, x: torch.Tensor, action: torch.Tensor | None = None):
        mean = self.actor_mean(x)
        log_std = self.actor_logstd.expand_as(mean)
        if action is None:
            action = mean + torch.exp(log_std) * torch.randn_like(mean)
        return action, *gaussian_log_prob_and_entropy(action, mean, log_std), self.critic(x)


# ---------------------------------------------------------------------------------------------
# The math: small pure functions, tested alone
# ---------------------------------------------------------------------------------------------
def compute_gae(rewards, values, dones, next_value, gamma: float, gae_lambda: float):
    """Generalized advantage estimation over one rollout, in NumPy (a fraction of torch's per-op overhead on small
    arrays). rewards, values, dones: (num_steps, num_envs), dones[t] = 1 where step t ended the episode."""
    num_steps = rewards.shape[0]
    advantages = np.zeros_like(rewards)
    lastgaelam = np.zeros_like(next_value)
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
    # Tiny networks: more threads gain nothing, and beside other processes their spin-waits slow every step.
    torch.set_num_threads(1)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")

    if args.eval_checkpoint is not None:  # no training: play the saved policy's episodes
        agent, obs_rms, saved_args = load_policy(args.eval_checkpoint, device)  # a bad file fails before any output
        check_env_exists(saved_args["env_id"])
        run_name = f"{saved_args['env_id'].replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
        writer = start_logging(args, run_name, None)
        evaluate_policy(args, saved_args["env_id"], agent, obs_rms, device, writer, run_name)
        return finish_logging(args, writer, run_name)
    run_name = f"{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{int(time.time())}"
    try:
        envs = make_envs(args.env_id, args.num_envs, f"videos/{run_name}" if args.capture_video else None)
    except (gym.error.Error, ModuleNotFoundError) as e:  # ModuleNotFoundError: an id `module:Env`
        fail(f"cannot make environment {args.env_id!r}: {e}")
    if not isinstance(envs.single_action_space, gym.spaces.Box):
        fail(f"{args.env_id} has actions {envs.single_action_space}; this script needs continuous (Box) ones")
    obs_space = envs.single_observation_space
    if not (isinstance(obs_space, gym.spaces.Box) and len(obs_space.shape) == 1):
        fail(f"{args.env_id} has observation space {obs_space}; this script needs a flat Box (vectors)")
    first_obs, _ = envs.reset(seed=args.seed)
    writer = start_logging(args, run_name, None)

    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    low, high = envs.single_action_space.low, envs.single_action_space.high
    agent = Agent(obs_dim, action_dim).to(device)
    # fused: one kernel for all parameters, not a dozen small ops per tensor (4-5x faster steps on CPU)
    optimizer = optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)

    # Rollout storage in NumPy on the host (less per-store overhead than torch), on the device once per iteration
    obs, actions = (np.zeros((args.num_steps, args.num_envs, dim), np.float32) for dim in (obs_dim, action_dim))
    logprobs, rewards, dones, values = (np.zeros((args.num_steps, args.num_envs), np.float32) for _ in range(4))

    # The statistics are those of the observations the policy acts on (reset ones included), updated as they
    # arrive; an episode's final observation, on which no action is taken, is normalized but not counted.
    obs_rms, reward_normalizer = RunningMeanStd((obs_dim,)), RewardNormalizer(args.num_envs, args.gamma)
    obs_rms.update(first_obs)
    next_obs = normalize_obs(first_obs, obs_rms.mean, obs_rms.var)
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
                action, logprob, _, value = agent.get_action_and_value(torch.from_numpy(next_obs).to(device))
            actions[step], logprobs[step], values[step] = (x.cpu().numpy() for x in (action, logprob, value.flatten()))

            # The env gets the action clipped to its bounds; the rollout keeps the sampled one (for the ratio).
            raw_obs, reward, terminations, truncations, infos = envs.step(np.clip(actions[step], low, high))
            rewards[step] = reward_normalizer(reward, terminations | truncations)
            # A time limit is not a death: the critic estimates the future of the state it cuts from the real
            # last observation (infos["final_obs"]). Folded into the reward, it lets GAE end every episode alike.
            cut_by_time_limit = truncations & ~terminations
            if cut_by_time_limit.any():
                final_obs = normalize_obs(np.stack(infos["final_obs"][cut_by_time_limit]), obs_rms.mean, obs_rms.var)
                with torch.no_grad():
                    final_values = agent.get_value(torch.from_numpy(final_obs).to(device)).flatten().cpu().numpy()
                rewards[step, cut_by_time_limit] += args.gamma * final_values
            dones[step] = terminations | truncations
            obs_rms.update(raw_obs)
            next_obs = normalize_obs(raw_obs, obs_rms.mean, obs_rms.var)

            # The env steps of one vector step count as consecutive global steps, env 0 first, so
            # every episode is logged at a step of its own.
            for i in np.flatnonzero(infos.get("_episode", [])):
                episode_step = global_step - args.num_envs + i + 1
                recent_returns.append(float(infos["episode"]["r"][i]))
                writer.add_scalar("charts/episodic_return", infos["episode"]["r"][i], episode_step)
                writer.add_scalar("charts/episodic_length", infos["episode"]["l"][i], episode_step)

        with torch.no_grad():
            next_value = agent.get_value(torch.from_numpy(next_obs).to(device)).flatten().cpu().numpy()
        advantages, returns = compute_gae(rewards, values, dones, next_value, args.gamma, args.gae_lambda)

        b_obs, b_actions, b_logprobs, b_advantages, b_returns, b_values = (
            torch.from_numpy(x.reshape(args.batch_size, *x.shape[2:])).to(device)
            for x in (obs, actions, logprobs, advantages, returns, values)
        )

        clipfracs = []
        for epoch in range(args.update_epochs):
            b_inds = torch.randperm(args.batch_size, device=device)
            for start in range(0, args.batch_size, args.minibatch_size):
                mb_inds = b_inds[start : start + args.minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(b_obs[mb_inds], b_actions[mb_inds])
                old = (b_logprobs[mb_inds], b_advantages[mb_inds], b_returns[mb_inds], b_values[mb_inds])
                loss, stats = ppo_loss(newlogprob, entropy, newvalue, *old, args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()
                clipfracs.append(stats["clipfrac"])
            if args.target_kl is not None and stats["approx_kl"] > args.target_kl:
                break

        y_pred, y_true = values.reshape(-1), returns.reshape(-1)
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
    recent = f"{np.mean(recent_returns):.2f}" if recent_returns else "n/a"
    print(
        f"finished {args.num_iterations} iterations, {global_step} steps, {sps} SPS, "
        f"mean return of the last {len(recent_returns)} episodes {recent}"
    )
    if args.save_model:
        model_path = f"runs/{run_name}/{args.exp_name}.cleanrl_model"
        save_policy(model_path, agent, obs_rms, args)
        print(f"model saved to {model_path}")
        evaluate_policy(args, args.env_id, agent, obs_rms, device, writer, run_name)
    finish_logging(args, writer, run_name)


# =============================================================================================
# Run infrastructure: what makes a run watchable, resumable and reusable; not the algorithm. Each block
# is the same text in every script that has it (tests/test_blocks.py), but for lines marked `# this script`.
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
    # Below 0, each trains silently wrong: ascent (rate, value loss), flipped gradients, clamp(min > max), stops at once
    for name in ("learning_rate", "max_grad_norm", "clip_coef", "vf_coef", "target_kl"):
        if (getattr(args, name) or 0) < 0:  # target_kl: None never stops
            fail(f"--{name.replace('_', '-')} must not be negative, got {getattr(args, name)}")
    if not (0 <= args.gamma <= 1 and 0 <= args.gae_lambda <= 1):
        fail(f"--gamma and --gae-lambda must lie in [0, 1], got {args.gamma}, {args.gae_lambda}")
    if not 0 <= args.seed < 2**32:  # what numpy's seed takes
        fail(f"--seed must lie in [0, 2**32), got {args.seed}")
    if min(args.num_envs, args.num_steps, args.num_minibatches, args.update_epochs, args.eval_episodes) < 1:
        fail("--num-envs, --num-steps, --num-minibatches, --update-epochs and --eval-episodes must be positive")
    if args.batch_size % args.num_minibatches != 0:
        fail(f"num_envs * num_steps = {args.batch_size} is not divisible by num_minibatches = {args.num_minibatches}")
    if args.norm_adv and args.minibatch_size < 2:
        fail(f"minibatches of {args.minibatch_size} sample cannot normalize advantages; use fewer --num-minibatches")
    if args.eval_checkpoint is None and args.num_iterations < 1:
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


def save_policy(path: str, agent: Agent, obs_rms: RunningMeanStd, args: Args):
    # The observation statistics are part of the policy: the network only knows normalized inputs.
    # Written to a temporary file and renamed, so a crash never leaves a truncated file.
    sizes = {"obs_dim": agent.actor_mean[0].in_features, "action_dim": agent.actor_mean[-1].out_features}
    obs_stats = {name: torch.as_tensor(value) for name, value in vars(obs_rms).items()}
    torch.save({"model": agent.state_dict(), "obs_rms": obs_stats, "args": vars(args), **sizes}, path + ".tmp")
    os.replace(path + ".tmp", path)


def load_policy(path: str, device) -> tuple[Agent, RunningMeanStd, dict]:
    if not os.path.isfile(path):
        fail(f"checkpoint {path!r} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        agent = Agent(payload["obs_dim"], payload["action_dim"]).to(device)
        agent.load_state_dict(payload["model"])
        obs_rms, saved_args = RunningMeanStd(), dict(payload["args"])
        obs_rms.__dict__.update({name: value.numpy() for name, value in payload["obs_rms"].items()})
        saved_args["env_id"]  # a checkpoint without it is foreign (KeyError)
    except Exception as e:  # any unreadable or foreign file is the same user error
        fail(f"checkpoint {path!r} is not a readable {os.path.basename(__file__)} model ({type(e).__name__})")
    return agent, obs_rms, saved_args


def evaluate_policy(args: Args, env_id: str, agent: Agent, obs_rms: RunningMeanStd, device, writer, run_name: str):
    """Plays --eval-episodes whole episodes with the mean action of the policy; prints and logs their raw returns.
    The observation statistics stay frozen: evaluation must see the inputs the network was trained on."""
    envs, returns = make_envs(env_id, 1, f"videos/{run_name}-eval" if args.capture_video else None), []
    low, high = envs.single_action_space.low, envs.single_action_space.high
    obs, _ = envs.reset(seed=args.seed)
    while len(returns) < args.eval_episodes:
        with torch.no_grad():
            mean_action = agent.actor_mean(torch.from_numpy(normalize_obs(obs, obs_rms.mean, obs_rms.var)).to(device))
        obs, _, _, _, infos = envs.step(np.clip(mean_action.cpu().numpy(), low, high))
        if "episode" in infos:
            returns.append(float(infos["episode"]["r"][0]))
            print(f"eval_episode={len(returns) - 1}, episodic_return={returns[-1]}")
            writer.add_scalar("eval/episodic_return", returns[-1], len(returns) - 1)
    envs.close()
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
