"""Learning benchmark: train a script for real on several seeds, one run after the other, and
report the mean return of the last 100 (`--last`) finished episodes of each run (read from
TensorBoard). MuJoCo episodes are long (1000 steps), so their convention is the last 10.

    python benchmark/learning.py --script ppo --seeds 1 2 3 -- --env-id CartPole-v1 --total-timesteps 500000
    python benchmark/learning.py --script ppo_atari --seeds 1 -- --total-timesteps 1000000
    python benchmark/learning.py --script sac_continuous_action --seeds 1 2 --last 10 -- --total-timesteps 300000

Runs are written under `--workdir` (default benchmark/results/), so their TensorBoard logs can be
plotted later (`tensorboard --logdir benchmark/results/runs`).
"""

import argparse
import glob
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.events import scalars  # noqa: E402


def episodic_returns(run_dir: str) -> list[float]:
    return [event.value for event in scalars(run_dir, "charts/episodic_return")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", required=True, help="a script of cleanrl/, without .py")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--last", type=int, default=100, help="how many of the last episodes the mean is over")
    parser.add_argument("--workdir", default=os.path.join(REPO_ROOT, "benchmark", "results"))
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="after --: arguments for the script")
    cli = parser.parse_args()
    script = os.path.join(REPO_ROOT, "cleanrl", f"{cli.script}.py")
    if not os.path.isfile(script):
        sys.exit(f"error: --script {cli.script}: there is no {os.path.relpath(script, REPO_ROOT)}")
    if cli.last < 1:
        sys.exit(f"error: --last must be at least 1, got {cli.last}")
    script_args = [a for a in cli.script_args if a != "--"]
    os.makedirs(cli.workdir, exist_ok=True)

    results = []
    for seed in cli.seeds:
        exp_name = f"{cli.script}_bench_{int(time.time())}"
        command = [
            sys.executable,
            script,
            "--seed",
            str(seed),
            "--exp-name",
            exp_name,
            *script_args,
        ]
        print("$", " ".join(command), flush=True)
        start = time.time()
        if subprocess.run(command, cwd=cli.workdir).returncode != 0:
            sys.exit(f"error: seed {seed}'s run failed (its output is above)")
        (run_dir,) = glob.glob(os.path.join(cli.workdir, "runs", f"*__{exp_name}__{seed}__*"))
        returns = episodic_returns(run_dir)[-cli.last :]
        mean = sum(returns) / len(returns) if returns else float("nan")
        results.append((seed, mean, len(returns), time.time() - start))
        print(
            f"seed {seed}: mean return of the last {len(returns)} episodes {mean:.2f} ({time.time() - start:.0f} s)",
            flush=True,
        )

    print(f"\n{cli.script} {' '.join(script_args)}")
    for seed, mean, count, seconds in results:
        print(f"  seed {seed}: {mean:.2f} (last {count} episodes, {seconds:.0f} s)")


if __name__ == "__main__":
    main()
