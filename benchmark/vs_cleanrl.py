"""Side by side with CleanRL: each script of cleanrl/ against CleanRL's own, same task, same
hyperparameters, runs interleaved on one machine, steady SPS from each run's TensorBoard events.

CleanRL is not vendored here: point --cleanrl-dir at a checkout of it
(`git clone https://github.com/vwxyzjn/cleanrl`). Its scripts run unchanged but for what this stack
needs, done from outside the file by `run-cleanrl` (below):
  - gymnasium 1.x's vector envs get gymnasium 0.29's autoreset and info layout (`final_observation`,
    `final_info` as a list), which CleanRL's loops read, unless the script names an autoreset mode
    (then it was written for 1.x);
  - 0.29's wrapper names (`GrayScaleObservation`, `FrameStack`, `TransformObservation` without a space)
    stand for 1.x's wrappers, and ale-py registers the Atari ids;
  - the envpool script gets the old gym API it was written for (a stand-in `gym` module, envpool's envs
    with 4-value steps).
Their replay buffer and Atari wrappers come from the checkout's `cleanrl_utils/` or Stable-Baselines3
(`pip install stable-baselines3`), as each script imports them.

Pairs: dqn (CartPole), dqn_atari (Breakout), sac, td3, ddpg (HalfCheetah), ppo_atari (Breakout, fp32; ppo_atari_bf16
runs ours in bf16 against CleanRL's fp32), ppo_atari_envpool (Breakout-v5), ppo_atari_multigpu (Breakout,
2 processes x 4 envs, each side's job under torchrun), ppo_continuous_action (HalfCheetah),
c51_atari (Breakout; c51_atari_bf16 runs ours in bf16), ppo_atari_lstm (Breakout, the LSTM agent), pqn_atari
(Breakout-v5, against CleanRL's pqn_atari_envpool.py; pqn_atari_bf16 runs ours in bf16).

    python benchmark/vs_cleanrl.py --cleanrl-dir ~/cleanrl                 # every pair, 2 rounds
    python benchmark/vs_cleanrl.py --cleanrl-dir ~/cleanrl --pairs sac --parallel
    python benchmark/vs_cleanrl.py --cleanrl-dir ~/cleanrl --pairs ppo_atari ppo_atari_bf16 ppo_continuous_action
    python benchmark/vs_cleanrl.py run-cleanrl ~/cleanrl/cleanrl/dqn.py --total-timesteps 1000

Steady SPS: env steps per second between the run's first `charts/SPS` event past `measure_from` and
its last (wall times of the events), so start-up and, for the off-policy scripts, the random-action
phase before learning starts are left out: that is the "learning phase". A single run gets the
machine's default threads (torch: one per core), as a user's first run does. --parallel also times
two seeds at once: ours as benchmark/run.py starts them (OMP_NUM_THREADS=1 each), CleanRL's as two
plain processes; the figure is the sum of their steady SPS.
"""

import argparse
import json
import os
import runpy
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.events import scalars, steady_sps  # noqa: E402
from benchmark.run import cpu_model  # noqa: E402  (the runner's logs name the CPU alike)

TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")


@dataclass
class Pair:
    script: str  # the same file name in cleanrl/ here and in CleanRL's checkout
    args: list[str]  # the task and a budget, the same for both
    measure_from: int  # steady SPS from the first SPS event at or after this step
    ours_only: tuple[str, ...] = ()  # arguments for our script alone (a precision CleanRL's has not)
    torchrun: int = 0  # the processes of one run under torchrun (each side's own data-parallel job); 0: plain python
    cleanrl_script: str = ""  # CleanRL's file name where it is not `script`

    @property
    def cleanrl_file(self) -> str:
        return f"{self.cleanrl_script or self.script}.py"


PAIRS = {
    # 10,000 random steps, then learning; epsilon reaches its floor at step 30,000 (half the budget), and the
    # window from step 25,000 holds its last 5,000 steps of decay (0.06 on average instead of 0.05), both sides alike
    "dqn": Pair("dqn", ["--env-id", "CartPole-v1", "--total-timesteps", "60000"], 25_000),
    "sac": Pair("sac_continuous_action", ["--env-id", "HalfCheetah-v5", "--total-timesteps", "9000"], 5_500),
    # CleanRL's 25,000 random steps brought down to SAC's 5,000 on both sides: then learning, the same window
    "td3": Pair(
        "td3_continuous_action",
        ["--env-id", "HalfCheetah-v5", "--total-timesteps", "9000", "--learning-starts", "5000"],
        5_500,
    ),
    "ddpg": Pair(
        "ddpg_continuous_action",
        ["--env-id", "HalfCheetah-v5", "--total-timesteps", "9000", "--learning-starts", "5000"],
        5_500,
    ),
    # 2,000 random steps, then learning every 4th step; measured over its last 4,000 steps
    "dqn_atari": Pair(
        "dqn_atari",
        ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "8000", "--learning-starts", "2000"]
        + ["--buffer-size", "10000"],
        4_000,
    ),
    # the same for C51: 2,000 random steps, then learning every 4th step; measured over its last 4,000 steps
    "c51_atari": Pair(
        "c51_atari",
        ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "8000", "--learning-starts", "2000"]
        + ["--buffer-size", "10000"],
        4_000,
    ),
    "c51_atari_bf16": Pair(
        "c51_atari",
        ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "8000", "--learning-starts", "2000"]
        + ["--buffer-size", "10000"],
        4_000,
        ("--mixed-precision", "bf16"),
    ),
    # 12 iterations of 8 envs x 128 steps; the first three (start-up, oneDNN's first calls) left out: the first
    # SPS event at or past step 3,072 ends iteration 3, and the steady rate runs from there
    "ppo_atari": Pair("ppo_atari", ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "12288"], 3_072),
    "ppo_atari_bf16": Pair(
        "ppo_atari",
        ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "12288"],
        3_072,
        ("--mixed-precision", "bf16"),
    ),
    "ppo_atari_envpool": Pair("ppo_atari_envpool", ["--env-id", "Breakout-v5", "--total-timesteps", "12288"], 3_072),
    # the LSTM agent, one frame a step: 12 iterations of 8 envs x 128 steps, the first three left out as above
    "ppo_atari_lstm": Pair(
        "ppo_atari_lstm", ["--env-id", "BreakoutNoFrameskip-v4", "--total-timesteps", "12288"], 3_072
    ),
    # 2 processes of 4 envs under torchrun (gloo on CPU, one thread each), 12 iterations of 2 x 4 x 128 steps
    "ppo_atari_multigpu": Pair(
        "ppo_atari_multigpu",
        ["--env-id", "BreakoutNoFrameskip-v4", "--local-num-envs", "4", "--total-timesteps", "12288"],
        3_072,
        torchrun=2,
    ),
    # 10 iterations of 2048 steps, the first two left out (the window starts at the end of iteration 2)
    "ppo_continuous_action": Pair(
        "ppo_continuous_action", ["--env-id", "HalfCheetah-v5", "--total-timesteps", "20480"], 4_096
    ),
    # CleanRL's PQN runs on envpool (Breakout-v5, the name both take); 12 iterations of 8 envs x 128 steps as
    # ppo_atari's pair, the first three left out
    "pqn_atari": Pair(
        "pqn_atari",
        ["--env-id", "Breakout-v5", "--total-timesteps", "12288"],
        3_072,
        cleanrl_script="pqn_atari_envpool",
    ),
    "pqn_atari_bf16": Pair(
        "pqn_atari",
        ["--env-id", "Breakout-v5", "--total-timesteps", "12288"],
        3_072,
        ("--mixed-precision", "bf16"),
        cleanrl_script="pqn_atari_envpool",
    ),
}


# ---------------------------------------------------------------------------------------------
# CleanRL's scripts on gymnasium 1.x
# ---------------------------------------------------------------------------------------------
def run_cleanrl(script: str, argv: list[str]):
    """Runs CleanRL's `script` as `python script argv` would, its vector envs speaking gymnasium 0.29."""
    import gymnasium as gym

    class SyncVectorEnv029(gym.vector.SyncVectorEnv):
        """gymnasium 1.x's SyncVectorEnv with 0.29's behaviour: an ended episode resets in the same step,
        its last observation in infos["final_observation"], its info (RecordEpisodeStatistics' "episode"
        included) in infos["final_info"], an array holding one dict per env (None where it goes on).
        A script already ported to 1.x names its autoreset mode and reads 1.x's layout: it gets 1.x's."""

        def __init__(self, env_fns, **kwargs):
            self.layout_029 = "autoreset_mode" not in kwargs
            kwargs.setdefault("autoreset_mode", gym.vector.AutoresetMode.SAME_STEP)
            super().__init__(env_fns, **kwargs)

        def step(self, actions):
            obs, rewards, terminations, truncations, infos = super().step(actions)
            if self.layout_029 and "final_obs" in infos:
                ended = infos.pop("_final_obs")
                infos["final_observation"], infos["_final_observation"] = infos.pop("final_obs"), ended
                batched, _ = infos.pop("final_info"), infos.pop("_final_info", None)
                per_env = [env_info(batched, i) if ended[i] else None for i in range(self.num_envs)]
                infos["final_info"], infos["_final_info"] = np.array(per_env, dtype=object), ended
            return obs, rewards, terminations, truncations, infos

    class TransformObservation029(gym.wrappers.TransformObservation):
        """0.29's TransformObservation: the observation space may be left out (1.x asks for it)."""

        def __init__(self, env, func, observation_space=None):
            super().__init__(env, func, observation_space)

    gym.vector.SyncVectorEnv = SyncVectorEnv029
    gym.wrappers.GrayScaleObservation = gym.wrappers.GrayscaleObservation  # 0.29's names of 1.x's wrappers
    gym.wrappers.FrameStack = gym.wrappers.FrameStackObservation
    gym.wrappers.TransformObservation = TransformObservation029
    try:  # gymnasium 1.x finds the Atari ids only once ale-py registers them; 0.29 did it by entry point
        import ale_py

        gym.register_envs(ale_py)
    except ImportError:
        pass
    speak_gym_02x_to_envpool()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(script))))  # its cleanrl_utils
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")


def speak_gym_02x_to_envpool():
    """CleanRL's envpool script speaks the old gym (0.2x) API: `import gym` for its `Wrapper` and `spaces`,
    and envpool's env_type="gym" envs with `reset()` returning the observations alone and `step` four values
    (done = terminated or truncated). Without gym installed, a stand-in module gives the first, and
    envpool.make wraps such envs for the second where they speak gymnasium's five values."""
    try:
        import envpool
    except ImportError:
        return
    import types

    import gymnasium

    class Wrapper:
        """gym's Wrapper as CleanRL's subclass uses it: what it does not define is the wrapped env's."""

        def __init__(self, env):
            self.env = env

        def __getattr__(self, name):
            return getattr(self.env, name)

        def reset(self, **kwargs):
            return self.env.reset(**kwargs)

        def step(self, action):
            return self.env.step(action)

    class OldGymAPI(Wrapper):
        def reset(self, **kwargs):
            result = self.env.reset(**kwargs)
            return result[0] if isinstance(result, tuple) else result

        def step(self, action):
            result = self.env.step(action)
            if len(result) == 5:
                obs, reward, terminated, truncated, info = result
                return obs, reward, terminated | truncated, info
            return result

    if "gym" not in sys.modules:
        try:
            import gym  # noqa: F401
        except ImportError:
            sys.modules["gym"] = stand_in = types.ModuleType("gym")
            stand_in.Wrapper, stand_in.spaces = Wrapper, gymnasium.spaces
    make = envpool.make

    def make_old_api(task_id, env_type="gymnasium", **kwargs):
        env = make(task_id, env_type=env_type, **kwargs)
        return OldGymAPI(env) if env_type == "gym" else env

    envpool.make = make_old_api


def env_info(batched: dict, i: int) -> dict:
    """Env i's info out of a vector env's batched one (dicts of arrays, "_key" masks left out)."""
    return {k: env_info(v, i) if isinstance(v, dict) else v[i] for k, v in batched.items() if not k.startswith("_")}


# ---------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------
def command(side: str, pair: Pair, cleanrl_dir: str, seed: int) -> list[str]:
    launcher = [TORCHRUN, "--standalone", f"--nproc-per-node={pair.torchrun}"] if pair.torchrun else [sys.executable]
    if side == "cleanrl":
        script = os.path.join(cleanrl_dir, "cleanrl", pair.cleanrl_file)
        return [*launcher, os.path.abspath(__file__), "run-cleanrl", script, *pair.args, "--seed", str(seed)]
    ours = os.path.join(REPO_ROOT, "cleanrl", f"{pair.script}.py")
    return [*launcher, ours, *pair.args, *pair.ours_only, "--seed", str(seed)]


def measure(side: str, pair: Pair, cleanrl_dir: str, processes: int) -> float:
    """The summed steady SPS of `processes` runs started at once (seeds 1, 2, ...)."""
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if processes > 1 and side == "ours":
        env["OMP_NUM_THREADS"] = "1"  # benchmark/run.py's rule for runs that share the cores
    with tempfile.TemporaryDirectory() as workdir:
        runs = []
        for seed in range(1, processes + 1):
            log = open(os.path.join(workdir, f"{seed}.log"), "w")
            runs.append(
                (
                    subprocess.Popen(
                        command(side, pair, cleanrl_dir, seed),
                        cwd=workdir,
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )
            )
        for process, log in runs:
            process.wait()
            log.close()
            if process.returncode != 0:
                with open(log.name) as f:
                    sys.exit(f"error: {' '.join(process.args)} failed:\n{f.read()[-2000:]}")
        run_dirs = [os.path.join(workdir, "runs", name) for name in sorted(os.listdir(os.path.join(workdir, "runs")))]
        try:
            return sum(steady_sps(scalars(run_dir, "charts/SPS"), from_step=pair.measure_from) for run_dir in run_dirs)
        except ValueError as e:
            sys.exit(f"error: {' '.join(command(side, pair, cleanrl_dir, 1))}: {e}: raise its budget")


def main():
    if len(sys.argv) > 2 and sys.argv[1] == "run-cleanrl":
        return run_cleanrl(sys.argv[2], sys.argv[3:])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cleanrl-dir", required=True, help="a checkout of CleanRL (its cleanrl/ and cleanrl_utils/)")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--rounds", type=int, default=2, help="interleaved repetitions; the table gives medians")
    parser.add_argument("--parallel", action="store_true", help="also two seeds at once on the same cores")
    parser.add_argument("--json", help="also write the rows and every round's figures to this file")
    cli = parser.parse_args()
    for name in cli.pairs:
        path = os.path.join(cli.cleanrl_dir, "cleanrl", PAIRS[name].cleanrl_file)
        if not os.path.isfile(path):
            parser.exit(2, f"error: {path} does not exist: --cleanrl-dir must be a checkout of CleanRL\n")
    if cli.rounds < 1:
        parser.exit(2, "error: --rounds must be at least 1\n")
    if cli.json and not os.path.isdir(os.path.dirname(os.path.abspath(cli.json))):
        parser.exit(2, f"error: --json {cli.json}: its folder does not exist\n")  # found now, not after the runs

    setups = [(name, processes) for name in cli.pairs for processes in ((1, 2) if cli.parallel else (1,))]
    samples = {(name, processes, side): [] for name, processes in setups for side in ("cleanrl", "ours")}
    for round_index in range(cli.rounds):
        for name, processes in setups:
            for side in ("cleanrl", "ours"):  # interleaved: a drift of the machine's speed hits both
                sps = measure(side, PAIRS[name], cli.cleanrl_dir, processes)
                samples[name, processes, side].append(sps)
                print(f"round {round_index + 1}: {name} x{processes} {side}: {sps:,.0f} steady SPS", flush=True)

    rows = []
    for name, processes in setups:
        cleanrl, ours = (statistics.median(samples[name, processes, side]) for side in ("cleanrl", "ours"))
        rows.append(
            {
                "pair": name,
                "processes": processes,
                "args": PAIRS[name].args,
                "ours_only": list(PAIRS[name].ours_only),
                "cleanrl_sps": cleanrl,
                "ours_sps": ours,
                "speedup": ours / cleanrl,
                "rounds": {side: samples[name, processes, side] for side in ("cleanrl", "ours")},
            }
        )
    print(f"\nsteady SPS, medians of {cli.rounds} round(s), {cpu_model()}, {os.cpu_count()} cpus")
    print("| script | task | runs at once | CleanRL | ours | speed-up |\n|---|---|---|---|---|---|")
    for row in rows:
        task = row["args"][row["args"].index("--env-id") + 1]
        pair = PAIRS[row["pair"]]
        script = f"`{pair.script}.py`" + (f" (ours with `{' '.join(pair.ours_only)}`)" if pair.ours_only else "")
        script += f", {pair.torchrun} processes under torchrun" if pair.torchrun else ""
        script += f", against CleanRL's `{pair.cleanrl_file}`" if pair.cleanrl_script else ""
        figures = f"{row['cleanrl_sps']:,.0f} | {row['ours_sps']:,.0f} | {row['speedup']:.2f}x"
        print(f"| {script} | {task} | {row['processes']} | {figures} |")
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump({"cpu": cpu_model(), "cpus": os.cpu_count(), "rounds": cli.rounds, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
