"""Speed of the DQN, SAC and continuous PPO scripts against their serial bounds, measured in one run.

For each script, with its default arguments and one torch thread, in the learning phase:
  env   - seconds per environment step of the script's own environment under random actions;
  nn    - seconds of the network work per environment step, on random data of the real shapes:
          the forward pass that picks the action (DQN: on the share of greedy steps, 1 - epsilon on
          average over the measured steps), plus the share of an update that falls on one
          step (DQN: an update every train_frequency steps; SAC: a critic update and on average one
          actor update per step; PPO: an iteration's 10 epochs x 32 minibatches over its 2048 steps);
  real  - the script's own training run: its steady SPS in the learning phase (from the wall times
          of its charts/SPS events past learning_starts; for PPO after its first iteration).
  loop  - seconds per step of the smallest loop that does the same env and network work in the
          script's order and nothing else (no replay memory, normalizer, logging).
The serial bound is 1 / (env + nn), the parts timed alone. A loop that does nothing but step the
environment and run the network does not reach it when the parts are small: each evicts the
other's code and data from the caches (CartPole's step and DQN's act are tens of microseconds).
The loop measures what such a loop does reach. real / bound and real / loop are the fractions the
script reaches; the rest is the script's own work (replay buffer, normalizers, logging). Every
measurement runs in a fresh process, in `--rounds` interleaved rounds; the table shows medians (the
fractions: the medians of each round's fraction).

    python benchmark/serial_bound.py                          # the four scripts, 2 rounds, ~15 min
    python benchmark/serial_bound.py --scripts dqn --rounds 3
"""

import argparse
import glob
import importlib
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
import tyro

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.events import scalars, steady_sps  # noqa: E402
from benchmark.ppo_update import ppo_update  # noqa: E402

# script: (env id, arguments of the real run: a short learning phase reached early)
SCRIPTS = {
    "dqn": ("CartPole-v1", ["--learning-starts", "2000", "--total-timesteps", "30000"]),
    "dqn_atari": (
        "BreakoutNoFrameskip-v4",
        ["--learning-starts", "2000", "--buffer-size", "50000", "--total-timesteps", "8000"],
    ),
    "ppo_continuous_action": ("HalfCheetah-v5", ["--total-timesteps", str(6 * 2048)]),
    "sac_continuous_action": ("HalfCheetah-v5", ["--learning-starts", "1000", "--total-timesteps", "4000"]),
}
# steps of the loop measurement: a few seconds each
LOOP_STEPS = {"dqn": 6000, "dqn_atari": 600, "ppo_continuous_action": 2 * 2048, "sac_continuous_action": 600}
REAL_FROM_STEP = {"dqn": 2500, "dqn_atari": 2500, "ppo_continuous_action": 2048, "sac_continuous_action": 1500}


def in_fresh_process(function, *args):
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(function, args)


def timed(function, steps: int, warm_up: int, scale: float = 1.0) -> float:
    """Seconds per call of function(), after warm_up calls (both counts times `scale`, at least 1)."""
    steps, warm_up = max(1, int(steps * scale)), max(1, int(warm_up * scale))
    for _ in range(warm_up):
        function()
    start = time.perf_counter()
    for _ in range(steps):
        function()
    return (time.perf_counter() - start) / steps


# ---------------------------------------------------------------------------------------------
# The script's environment and network work
# ---------------------------------------------------------------------------------------------
def make_script_env(script: str, module, env_id: str):
    """The script's own environment, made as the script makes it, reset: (env, first observation).
    SAC steps a single env; the others a vector of one."""
    if script == "sac_continuous_action":
        env = module.make_env(env_id)
    elif script == "dqn":
        env = module.make_envs(env_id, 1, False, "serial-bound")
    elif script == "dqn_atari":
        env = module.make_envs(env_id, 1, 0.0)
    else:
        env = module.make_envs(env_id, 1)
    obs, _ = env.reset(seed=0)
    env.action_space.seed(0)
    return env, obs


def step_env(script: str, env, action):
    """One step; the next observation (a single env is reset at its episode ends, a vector one by itself)."""
    obs, _, terminated, truncated, _ = env.step(action)
    if script == "sac_continuous_action" and (terminated or truncated):
        obs, _ = env.reset()
    return obs


def greedy_fraction(script: str) -> float:
    """DQN runs its network to act only on greedy steps: the mean of 1 - epsilon over the steps of
    the script's real run that the steady SPS is measured on."""
    module = importlib.import_module(f"cleanrl.{script}")
    args = tyro.cli(module.Args, args=SCRIPTS[script][1])
    exploration_steps = args.exploration_fraction * args.total_timesteps
    steps = range(REAL_FROM_STEP[script], args.total_timesteps)
    return 1.0 - statistics.fmean(module.linear_schedule(args.start_e, args.end_e, exploration_steps, t) for t in steps)


@dataclass
class NetworkWork:
    """The network work of the script's learning phase, on random data of the real shapes."""

    act: Callable  # observation as the env gives it -> an action for the env
    update: Callable  # one update (PPO: an iteration's epochs)
    update_every: int  # env steps per update
    act_share: float = 1.0  # the share of steps that run act (DQN: the greedy steps)


def network_work(script: str, module, env) -> NetworkWork:
    torch.manual_seed(0)
    args = module.Args()
    return {
        "dqn": dqn_work,
        "dqn_atari": dqn_work,
        "ppo_continuous_action": ppo_work,
        "sac_continuous_action": sac_work,
    }[script](module, args, env)


def dqn_work(module, args, envs) -> NetworkWork:
    atari = hasattr(module, "FrameReplayBuffer")
    num_actions = int(envs.single_action_space.n)
    obs_shape = envs.single_observation_space.shape
    if atari:
        q_network = module.QNetwork(num_actions).to(memory_format=torch.channels_last)
        target_network = module.QNetwork(num_actions).to(memory_format=torch.channels_last)
        obs = torch.randint(0, 256, (args.batch_size, *obs_shape), dtype=torch.uint8)
    else:
        q_network, target_network = (
            module.QNetwork(obs_shape[0], num_actions),
            module.QNetwork(obs_shape[0], num_actions),
        )
        obs = torch.randn(args.batch_size, *obs_shape)
    loss_function = F.smooth_l1_loss if atari else F.mse_loss  # the scripts' losses
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=True)  # as the scripts'
    actions = torch.randint(0, num_actions, (args.batch_size,))
    rewards, dones = torch.randn(args.batch_size), torch.zeros(args.batch_size)

    def act(observation):
        if not atari:  # dqn.py acts through its own numpy path
            return q_network.greedy_actions(observation)
        with torch.inference_mode():
            return q_network(torch.as_tensor(observation)).argmax(dim=1).numpy()

    def update():
        with torch.no_grad():
            target = module.td_target(rewards, dones, target_network(obs), args.gamma)
        q_taken = q_network(obs).gather(1, actions[:, None]).squeeze(1)
        loss = loss_function(q_taken, target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    script = module.__name__.rsplit(".", 1)[-1]
    return NetworkWork(act, update, args.train_frequency, greedy_fraction(script))


def sac_work(module, args, env) -> NetworkWork:
    obs_dim, action_dim, batch = env.observation_space.shape[0], env.action_space.shape[0], args.batch_size
    actor = module.Actor(obs_dim, env.action_space.low, env.action_space.high)
    qf, qf_target = module.TwinSoftQNetwork(obs_dim, action_dim), module.TwinSoftQNetwork(obs_dim, action_dim)
    q_optimizer = torch.optim.Adam(qf.parameters(), lr=args.q_lr, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True)
    log_alpha = torch.zeros(1, requires_grad=True)
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr, fused=True)
    obs, next_obs, actions = torch.randn(batch, obs_dim), torch.randn(batch, obs_dim), torch.rand(batch, action_dim)
    rewards, terminations = torch.randn(batch), torch.zeros(batch)
    step = [0]

    def act(observation):
        with torch.no_grad():
            return actor.get_action(torch.as_tensor(observation, dtype=torch.float32)[None])[0][0].numpy()

    def update():  # the script's learning step: critic update, actor (and alpha) updates, targets
        step[0] += 1
        with torch.no_grad():
            next_actions, next_log_pi, _ = actor.get_action(next_obs)
            next_q = qf_target(next_obs, next_actions)
            target = module.soft_td_target(rewards, terminations, next_q, next_log_pi, 0.2, args.gamma)
        q1, q2 = qf(obs, actions)
        qf_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        q_optimizer.step()
        if step[0] % args.policy_frequency == 0:
            for _ in range(args.policy_frequency):
                actions_pi, log_pi, _ = actor.get_action(obs)
                q1_pi, q2_pi = qf(obs, actions_pi)
                actor_loss = (0.2 * log_pi - torch.min(q1_pi, q2_pi)).mean()
                actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward(inputs=list(actor.parameters()))
                actor_optimizer.step()
                alpha_loss = (-log_alpha.exp() * (log_pi.detach() - action_dim)).mean()
                a_optimizer.zero_grad(set_to_none=True)
                alpha_loss.backward()
                a_optimizer.step()
                log_alpha.exp().item()
        module.soft_update(qf_target, qf, args.tau)

    return NetworkWork(act, update, 1)


def ppo_work(module, args, envs) -> NetworkWork:
    obs_dim, action_dim = envs.single_observation_space.shape[0], envs.single_action_space.shape[0]
    batch_size = args.num_envs * args.num_steps
    agent = module.Agent(obs_dim, action_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    obs, actions = torch.randn(batch_size, obs_dim), torch.randn(batch_size, action_dim)
    logprobs, advantages, returns, values = torch.randn(4, batch_size)

    def act(observation):
        with torch.no_grad():
            action, _, _, _ = agent.get_action_and_value(torch.as_tensor(observation, dtype=torch.float32))
        return action.numpy()

    def update():  # an iteration's epochs over its rollout
        ppo_update(module, agent, optimizer, args, (obs, actions, logprobs, advantages, returns, values))

    return NetworkWork(act, update, args.num_steps)


# ---------------------------------------------------------------------------------------------
# env, nn and loop: each alone, then together
# ---------------------------------------------------------------------------------------------
def measure_env(script: str, env_id: str, steps: int = 2000) -> float:
    """Seconds per step of the script's environment under random actions."""
    module = importlib.import_module(f"cleanrl.{script}")
    env, _ = make_script_env(script, module, env_id)
    seconds = timed(lambda: step_env(script, env, env.action_space.sample()), steps, 100)
    env.close()
    return seconds


def measure_nn(script: str, env_id: str, scale: float = 1.0) -> float:
    """Seconds of network work per env step: act (on its share of the steps) and the update's share,
    each timed alone in a loop of its own."""
    module = importlib.import_module(f"cleanrl.{script}")
    env, obs = make_script_env(script, module, env_id)
    work = network_work(script, module, env)
    env.close()
    act_seconds = timed(lambda: work.act(obs), 500, 50, scale)
    update_seconds = timed(work.update, 200 if work.update_every < 100 else 2, 2, scale)
    return act_seconds * work.act_share + update_seconds / work.update_every


def measure_loop(script: str, env_id: str, scale: float = 1.0) -> float:
    """Seconds per env step of the smallest loop that does the script's env and network work in
    the script's order: act on the env's observation (DQN: on the greedy share of the steps, else
    a random action), step the env, run an update every update_every steps. Nothing else: no
    replay memory, normalizer or logging. Taken apart, the parts are faster than together (each
    evicts the other's code and data from the caches): the loop is what a script can reach."""
    module = importlib.import_module(f"cleanrl.{script}")
    env, obs = make_script_env(script, module, env_id)
    work = network_work(script, module, env)
    coins = np.random.default_rng(0)
    steps = max(work.update_every, int(LOOP_STEPS[script] * scale) // work.update_every * work.update_every)

    def run(num_steps: int):
        nonlocal obs
        for step in range(1, num_steps + 1):
            action = work.act(obs) if coins.random() < work.act_share else env.action_space.sample()
            obs = step_env(script, env, action)
            if step % work.update_every == 0:
                work.update()

    run(work.update_every)  # warm-up: one update cycle
    start = time.perf_counter()
    run(steps)
    seconds = (time.perf_counter() - start) / steps
    env.close()
    return seconds


# ---------------------------------------------------------------------------------------------
# real: the script's own run
# ---------------------------------------------------------------------------------------------
def measure_real(script: str, run_arguments: list[str]) -> float:
    cwd = tempfile.mkdtemp(prefix=f"serial-bound-{script}-")
    command = [sys.executable, os.path.join(REPO_ROOT, "cleanrl", f"{script}.py"), *run_arguments]
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=3600)
    if result.returncode != 0:
        sys.exit(f"error: {' '.join(command)} failed:\n{result.stderr[-2000:]}")
    (run_dir,) = glob.glob(os.path.join(cwd, "runs", "*"))
    return steady_sps(scalars(run_dir, "charts/SPS"), from_step=REAL_FROM_STEP[script])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    if options.rounds < 1:
        parser.exit(2, "error: --rounds must be at least 1\n")
    os.environ["OMP_NUM_THREADS"] = "1"  # one thread in every measurement: the fresh processes and the runs
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)

    samples = {script: {"env": [], "nn": [], "loop": [], "real": []} for script in options.scripts}
    for round_number in range(1, options.rounds + 1):
        for script in options.scripts:
            env_id, run_arguments = SCRIPTS[script]
            samples[script]["env"].append(in_fresh_process(measure_env, script, env_id))
            samples[script]["nn"].append(in_fresh_process(measure_nn, script, env_id))
            samples[script]["loop"].append(in_fresh_process(measure_loop, script, env_id))
            samples[script]["real"].append(measure_real(script, run_arguments))
            env, nn, loop, real = (samples[script][k][-1] for k in ("env", "nn", "loop", "real"))
            print(
                f"  round {round_number}, {script}: env {env * 1e3:.3f} ms, nn {nn * 1e3:.3f} ms per step, "
                f"bound {1 / (env + nn):.0f} SPS, loop {1 / loop:.0f} SPS, real {real:.0f} SPS",
                file=sys.stderr,
                flush=True,
            )

    # The fractions are the medians of each round's own: this machine's speed drifts over minutes,
    # and the measurements of one round are minutes apart at most.
    print("\n| script | env ms/step | nn ms/step | bound SPS | loop SPS | steady SPS | of the bound | of the loop |")
    print("|-|-|-|-|-|-|-|-|")
    for script in options.scripts:
        env, nn, loop, real = (samples[script][k] for k in ("env", "nn", "loop", "real"))
        of_bound = statistics.median(r * (e + n) for r, e, n in zip(real, env, nn))
        of_loop = statistics.median(r * s for r, s in zip(real, loop))
        print(
            f"| `{script}.py` | {statistics.median(env) * 1e3:.3f} | {statistics.median(nn) * 1e3:.3f} "
            f"| {1 / (statistics.median(env) + statistics.median(nn)):.0f} | {1 / statistics.median(loop):.0f} "
            f"| {statistics.median(real):.0f} | **{of_bound:.2f}** | **{of_loop:.2f}** |"
        )
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
