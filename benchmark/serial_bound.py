"""Speed of the DQN, SAC and continuous PPO scripts against their serial bounds, measured in one run.

For each script, with its default arguments and one torch thread, in the learning phase:
  env   - seconds per environment step of the script's own environment under random actions;
  nn    - seconds of the network work per environment step, on random data of the real shapes:
          the forward pass that picks the action, plus the share of an update that falls on one
          step (DQN: an update every train_frequency steps; SAC: a critic update and on average one
          actor update per step; PPO: an iteration's 10 epochs x 32 minibatches over its 2048 steps);
  real  - the script's own training run: its steady SPS in the learning phase (from the wall times
          of its charts/SPS events past learning_starts; for PPO after its first iteration).
The serial bound is 1 / (env + nn): what a loop that does nothing but step the environment and run
the network could reach. real / bound is the fraction of it the script reaches; the rest is the
script's own work (replay buffer, normalizers, logging). Every measurement runs in a fresh process,
in `--rounds` interleaved rounds; the table shows medians.

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

import numpy as np
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)

# script: (env id, arguments of the real run: a short learning phase reached early)
SCRIPTS = {
    "dqn": ("CartPole-v1", ["--learning-starts", "2000", "--total-timesteps", "30000"]),
    "dqn_atari": ("BreakoutNoFrameskip-v4", ["--learning-starts", "2000", "--buffer-size", "50000",
                                             "--total-timesteps", "8000"]),
    "ppo_continuous_action": ("HalfCheetah-v5", ["--total-timesteps", str(6 * 2048)]),
    "sac_continuous_action": ("HalfCheetah-v5", ["--learning-starts", "1000", "--total-timesteps", "4000"]),
}
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
# env: the script's environment under random actions
# ---------------------------------------------------------------------------------------------
def measure_env(script: str, env_id: str, steps: int = 2000) -> float:
    module = importlib.import_module(f"cleanrl.{script}")
    if script == "sac_continuous_action":
        env = module.make_env(env_id)
        env.reset(seed=0)
        env.action_space.seed(0)

        def step():
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()

        return timed(step, steps, 100)
    if script == "dqn":
        envs = module.make_envs(env_id, 1, False, "serial-bound")
    elif script == "dqn_atari":
        envs = module.make_envs(env_id, 1, 0.0)
    else:
        envs = module.make_envs(env_id, 1)
    envs.reset(seed=0)
    envs.action_space.seed(0)
    seconds = timed(lambda: envs.step(envs.action_space.sample()), steps, 100)
    envs.close()
    return seconds


# ---------------------------------------------------------------------------------------------
# nn: the network work of one environment step in the learning phase
# ---------------------------------------------------------------------------------------------
def measure_nn(script: str, env_id: str, scale: float = 1.0) -> float:
    torch.manual_seed(0)
    module = importlib.import_module(f"cleanrl.{script}")
    args = module.Args()
    return {"dqn": nn_dqn, "dqn_atari": nn_dqn, "ppo_continuous_action": nn_ppo,
            "sac_continuous_action": nn_sac}[script](module, args, scale)


def nn_dqn(module, args, scale: float) -> float:
    if hasattr(module, "FrameReplayBuffer"):  # dqn_atari
        q_network = module.QNetwork(4).to(memory_format=torch.channels_last)
        target_network = module.QNetwork(4).to(memory_format=torch.channels_last)
        obs = torch.randint(0, 256, (args.batch_size, 4, 84, 84), dtype=torch.uint8)
    else:
        q_network, target_network = module.QNetwork(4, 2), module.QNetwork(4, 2)
        obs = torch.randn(args.batch_size, 4)
    fused = hasattr(module, "FrameReplayBuffer")  # dqn_atari's Adam is fused, dqn's is not
    optimizer = torch.optim.Adam(q_network.parameters(), lr=args.learning_rate, fused=fused)
    actions = torch.randint(0, 2, (args.batch_size,))
    rewards, dones = torch.randn(args.batch_size), torch.zeros(args.batch_size)

    def act():
        with torch.inference_mode():
            q_network(obs[:1]).argmax(dim=1).numpy()

    def update():
        with torch.no_grad():
            target = module.td_target(rewards, dones, target_network(obs), args.gamma)
        q_taken = q_network(obs).gather(1, actions[:, None]).squeeze(1)
        loss = (F.smooth_l1_loss if fused else F.mse_loss)(q_taken, target)  # the scripts' losses
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss.item()

    return timed(act, 500, 50, scale) + timed(update, 200, 20, scale) / args.train_frequency


def nn_sac(module, args, scale: float) -> float:
    obs_dim, action_dim, batch = 17, 6, args.batch_size  # HalfCheetah
    actor = module.Actor(obs_dim, -np.ones(action_dim, np.float32), np.ones(action_dim, np.float32))
    qf1, qf2, qf1_target, qf2_target = (module.SoftQNetwork(obs_dim, action_dim) for _ in range(4))
    q_optimizer = torch.optim.Adam(list(qf1.parameters()) + list(qf2.parameters()), lr=args.q_lr, fused=True)
    actor_optimizer = torch.optim.Adam(actor.parameters(), lr=args.policy_lr, fused=True)
    log_alpha = torch.zeros(1, requires_grad=True)
    a_optimizer = torch.optim.Adam([log_alpha], lr=args.q_lr, fused=True)
    obs, next_obs, actions = torch.randn(batch, obs_dim), torch.randn(batch, obs_dim), torch.rand(batch, action_dim)
    rewards, terminations = torch.randn(batch), torch.zeros(batch)
    step = [0]

    def one_step():  # the script's learning step: act, critic update, actor (and alpha) updates, targets
        step[0] += 1
        with torch.no_grad():
            actor.get_action(obs[:1])[0].numpy()
            next_actions, next_log_pi, _ = actor.get_action(next_obs)
            target = module.soft_td_target(rewards, terminations, qf1_target(next_obs, next_actions),
                                           qf2_target(next_obs, next_actions), next_log_pi, 0.2, args.gamma)
        qf_loss = F.mse_loss(qf1(obs, actions), target) + F.mse_loss(qf2(obs, actions), target)
        q_optimizer.zero_grad(set_to_none=True)
        qf_loss.backward()
        q_optimizer.step()
        if step[0] % args.policy_frequency == 0:
            qf1.requires_grad_(False)
            qf2.requires_grad_(False)
            for _ in range(args.policy_frequency):
                actions_pi, log_pi, _ = actor.get_action(obs)
                actor_loss = (0.2 * log_pi - torch.min(qf1(obs, actions_pi), qf2(obs, actions_pi))).mean()
                actor_optimizer.zero_grad(set_to_none=True)
                actor_loss.backward()
                actor_optimizer.step()
                alpha_loss = (-log_alpha.exp() * (log_pi.detach() - action_dim)).mean()
                a_optimizer.zero_grad(set_to_none=True)
                alpha_loss.backward()
                a_optimizer.step()
                log_alpha.exp().item()
            qf1.requires_grad_(True)
            qf2.requires_grad_(True)
        module.soft_update(qf1_target, qf1, args.tau)
        module.soft_update(qf2_target, qf2, args.tau)

    return timed(one_step, 200, 20, scale)


def nn_ppo(module, args, scale: float) -> float:
    obs_dim, action_dim = 17, 6  # HalfCheetah
    batch_size = args.num_envs * args.num_steps
    minibatch_size = batch_size // args.num_minibatches
    agent = module.Agent(obs_dim, action_dim)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5, fused=True)
    obs, actions = torch.randn(batch_size, obs_dim), torch.randn(batch_size, action_dim)
    logprobs, advantages, returns, values = torch.randn(4, batch_size)

    def iteration():
        for step in range(args.num_steps):
            with torch.no_grad():
                action, _, _, _ = agent.get_action_and_value(obs[step : step + 1])
            action.numpy()
        for _ in range(args.update_epochs):
            inds = torch.randperm(batch_size)
            for start in range(0, batch_size, minibatch_size):
                mb = inds[start : start + minibatch_size]
                _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs[mb], actions[mb])
                loss, _ = module.ppo_loss(newlogprob, entropy, newvalue, logprobs[mb], advantages[mb], returns[mb],
                                          values[mb], args)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

    return timed(iteration, 2, 1, scale) / batch_size


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
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    accumulator.Reload()
    events = [event for event in accumulator.Scalars("charts/SPS") if event.step >= REAL_FROM_STEP[script]]
    first, last = events[0], events[-1]
    return (last.step - first.step) / (last.wall_time - first.wall_time)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", choices=list(SCRIPTS), default=list(SCRIPTS))
    parser.add_argument("--rounds", type=int, default=2)
    options = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"  # one thread in every measurement: the fresh processes and the runs
    torch.set_num_threads(1)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} on {os.cpu_count()} cores", flush=True)

    samples = {script: {"env": [], "nn": [], "real": []} for script in options.scripts}
    for round_number in range(1, options.rounds + 1):
        for script in options.scripts:
            env_id, run_arguments = SCRIPTS[script]
            samples[script]["env"].append(in_fresh_process(measure_env, script, env_id))
            samples[script]["nn"].append(in_fresh_process(measure_nn, script, env_id))
            samples[script]["real"].append(measure_real(script, run_arguments))
            env, nn, real = (samples[script][k][-1] for k in ("env", "nn", "real"))
            print(f"  round {round_number}, {script}: env {env * 1e3:.3f} ms, nn {nn * 1e3:.3f} ms per step, "
                  f"real {real:.0f} SPS, bound {1 / (env + nn):.0f} SPS", file=sys.stderr, flush=True)

    print("\n| script | env ms/step | nn ms/step | bound SPS | steady SPS | fraction |\n|-|-|-|-|-|-|")
    for script in options.scripts:
        env, nn, real = (statistics.median(samples[script][k]) for k in ("env", "nn", "real"))
        bound = 1 / (env + nn)
        print(f"| `{script}.py` | {env * 1e3:.3f} | {nn * 1e3:.3f} | {bound:.0f} | {real:.0f} | **{real / bound:.2f}** |")
    print(f"\nload average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
