"""Throughput of a PPO Atari script against its serial bound, measured in one run.

For each script and precision it measures, on the same machine and one after the other:
  env   - seconds per vector step of the script's own vector env under random actions;
  nn    - seconds of one iteration's network work on random data of the real shapes
          (num_steps rollout forwards of num_envs observations, then the whole update);
  real  - the SPS the script itself reports for a short training run.
The serial bound is batch_size / (num_steps * env + nn): what a loop that does nothing but step
the envs and run the network could reach. The script's fraction of the bound is its overhead.

    python benchmark/throughput.py                              # ppo_atari.py, fp32 and bf16
    python benchmark/throughput.py --scripts ppo_atari --precisions none --iterations 5
"""

import argparse
import importlib
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)


def measure_env(module, env_id: str, num_envs: int, num_steps: int) -> float:
    """Seconds per vector step with random actions."""
    envs = module.make_envs(env_id, num_envs, 0.0)
    envs.reset(seed=0)
    num_actions = int(envs.single_action_space.n)
    rng = np.random.default_rng(0)
    for _ in range(20):  # warm up the threads
        envs.step(rng.integers(0, num_actions, num_envs))
    start = time.perf_counter()
    for _ in range(num_steps):
        envs.step(rng.integers(0, num_actions, num_envs))
    seconds = (time.perf_counter() - start) / num_steps
    envs.close()
    return seconds


def measure_nn_torch(module, num_envs: int, num_steps: int, precision: str, repeats: int = 2) -> float:
    """Seconds of one iteration's network work: the rollout forwards and the update."""
    args = module.Args(num_envs=num_envs, num_steps=num_steps)
    batch_size = num_envs * num_steps
    minibatch_size = batch_size // args.num_minibatches
    agent = module.Agent(4).to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(agent.parameters(), lr=args.learning_rate, eps=1e-5)
    autocast = lambda: torch.autocast("cpu", torch.bfloat16, enabled=precision == "bf16")
    obs = torch.randint(0, 256, (batch_size, 4, 84, 84), dtype=torch.uint8)
    actions = torch.randint(0, 4, (batch_size,))
    logprobs, advantages, returns, values = torch.randn(4, batch_size)

    def one_iteration():
        for step in range(num_steps):
            with torch.inference_mode(), autocast():
                agent.get_action_and_value(obs[step * num_envs : (step + 1) * num_envs])
        for _ in range(args.update_epochs):
            inds = torch.randperm(batch_size)
            for start in range(0, batch_size, minibatch_size):
                mb = inds[start : start + minibatch_size]
                with autocast():
                    _, newlogprob, entropy, newvalue = agent.get_action_and_value(obs[mb], actions[mb])
                loss, _ = module.ppo_loss(
                    newlogprob, entropy, newvalue, logprobs[mb], advantages[mb], returns[mb], values[mb], args
                )
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(agent.parameters(), args.max_grad_norm)
                optimizer.step()

    one_iteration()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        one_iteration()
    return (time.perf_counter() - start) / repeats


def measure_real(script: str, env_id: str, num_envs: int, num_steps: int, iterations: int, precision: str) -> int:
    """The SPS that the script reports at the end of a short training run."""
    command = [
        sys.executable, os.path.join(REPO_ROOT, "cleanrl", f"{script}.py"), "--env-id", env_id,
        "--num-envs", str(num_envs), "--num-steps", str(num_steps),
        "--total-timesteps", str(num_envs * num_steps * iterations), "--mixed-precision", precision,
    ]
    result = subprocess.run(command, capture_output=True, text=True, cwd="/tmp", check=True)
    return int(re.search(r"(\d+) SPS", result.stdout).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scripts", nargs="+", default=["ppo_atari"])
    parser.add_argument("--precisions", nargs="+", default=["none", "bf16"], choices=["none", "bf16"])
    parser.add_argument("--env-id", default="BreakoutNoFrameskip-v4")
    parser.add_argument("--num-envs", type=int, default=8)
    parser.add_argument("--num-steps", type=int, default=128)
    parser.add_argument("--iterations", type=int, default=10, help="iterations of the real run")
    cli = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} cpus")
    header = f"{'script':<28}{'precision':<10}{'env ms/step':>12}{'nn s/iter':>10}{'bound SPS':>10}{'real SPS':>9}{'fraction':>9}"
    rows = []
    for script in cli.scripts:
        module = importlib.import_module(f"cleanrl.{script}")
        env_seconds = measure_env(module, cli.env_id, cli.num_envs, cli.num_steps * 2)
        for precision in cli.precisions:
            nn_seconds = measure_nn_torch(module, cli.num_envs, cli.num_steps, precision)
            batch_size = cli.num_envs * cli.num_steps
            bound = batch_size / (cli.num_steps * env_seconds + nn_seconds)
            real = measure_real(script, cli.env_id, cli.num_envs, cli.num_steps, cli.iterations, precision)
            row = f"{script:<28}{precision:<10}{env_seconds * 1e3:>12.2f}{nn_seconds:>10.2f}{bound:>10.0f}{real:>9}{real / bound:>9.2f}"
            rows.append((script, precision, real))
            print(row if len(rows) > 1 else header + "\n" + row, flush=True)
    fp32 = {s: r for s, p, r in rows if p == "none"}
    for script, precision, real in rows:
        if precision == "bf16" and script in fp32:
            print(f"{script}: bf16 / fp32 real SPS = {real / fp32[script]:.2f}x")


if __name__ == "__main__":
    main()
