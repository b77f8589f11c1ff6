"""benchmark/vs_cleanrl.py, the side-by-side speed check against CleanRL's own scripts: its stand-in for
gymnasium 0.29's vector-env layout and wrapper names (what CleanRL's scripts use), left alone for a script
already ported to 1.x, and its bad input.
The timings themselves are a benchmark (docs/benchmarks.md), not a test."""

import json
import os
import textwrap

import pytest
from running import assert_user_error, copy_of_tool, fake_sps_scripts, run_tool

from benchmark.run import cpu_model
from benchmark.vs_cleanrl import PAIRS

# A script in CleanRL's manner: a SyncVectorEnv, episodes logged from infos["final_info"], the real last
# observation from infos["final_observation"]. CartPole with action 1 only falls within a few steps
# (termination); with a 3-step limit, env 1 is cut off first (truncation).
CLEANRL_STYLE = """
import sys

import gymnasium as gym
import numpy as np

envs = gym.vector.SyncVectorEnv(
    [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1")),
     lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=3))]
)
obs, _ = envs.reset(seed=int(sys.argv[1]))
for step in range(1, 4):
    next_obs, rewards, terminations, truncations, infos = envs.step(np.array([1, 1]))
    if "final_info" in infos:
        for i, info in enumerate(infos["final_info"]):
            if info is not None:
                real = infos["final_observation"][i]
                print(f"step {step} env {i} return {info['episode']['r']} length {info['episode']['l']} "
                      f"truncated {truncations[i]} reset {not np.allclose(next_obs[i], real)}")
"""


def run_as_cleanrl_script(tmp_path, source: str, *args: str) -> str:
    """Runs `source` as a script of a CleanRL checkout under vs_cleanrl.py's run-cleanrl; returns its output."""
    script = tmp_path / "cleanrl" / "script.py"
    script.parent.mkdir()
    script.write_text(textwrap.dedent(source))
    result = run_tool("vs_cleanrl.py", "run-cleanrl", str(script), *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_cleanrl_style_scripts_see_gymnasium_029s_final_info_and_final_observation(tmp_path):
    output = run_as_cleanrl_script(tmp_path, CLEANRL_STYLE, "1")
    # env 1 ends at its 3-step limit: one episode, in the same step's final_info (0.29's autoreset), and
    # the observation returned is already the next episode's first
    assert "step 3 env 1 return 3.0 length 3 truncated True reset True" in output, output
    assert " env 0 " not in output  # env 0 goes on: None in final_info


# A script in CleanRL's manner already ported to gymnasium 1.x: it names its autoreset mode and reads
# 1.x's final_info, a dict of arrays with "_episode" marking the envs whose episode ended.
CLEANRL_PORTED = """
import gymnasium as gym
import numpy as np

envs = gym.vector.SyncVectorEnv(
    [lambda: gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=3))] * 2,
    autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
)
envs.reset(seed=1)
for step in range(1, 4):
    _, _, _, _, infos = envs.step(np.array([0, 0]))
    if "final_info" in infos:
        ended = np.nonzero(infos["final_info"]["_episode"])[0]
        print(f"step {step} ended {ended.tolist()} lengths {infos['final_info']['episode']['l'][ended].tolist()}")
"""

# CleanRL's Atari and MuJoCo wrappers as gymnasium 0.29 named them, on an Atari id that 1.x knows only
# once ale-py registers it.
CLEANRL_029_WRAPPERS = """
import gymnasium as gym
import numpy as np

env = gym.make("BreakoutNoFrameskip-v4")
env = gym.wrappers.ResizeObservation(env, (84, 84))
env = gym.wrappers.GrayScaleObservation(env)
env = gym.wrappers.FrameStack(env, 4)
env = gym.wrappers.TransformObservation(env, lambda obs: obs // 2)
obs, _ = env.reset(seed=1)
print("atari", np.asarray(obs).shape, np.asarray(obs).max() <= 127)
"""


# CleanRL's envpool script's manner: the old gym API (`import gym`, a gym.Wrapper subclass, reset giving
# the observations alone, step four values with done = terminated or truncated) on envpool's gym envs.
CLEANRL_OLD_GYM_ENVPOOL = """
import envpool
import gym
import numpy as np


class Counting(gym.Wrapper):
    def step(self, action):
        observations, rewards, dones, infos = super().step(action)
        return observations, rewards, dones, infos


envs = envpool.make("Breakout-v5", env_type="gym", num_envs=2, seed=1, max_episode_steps=3)
envs.num_envs = 2
envs.single_action_space = envs.action_space
envs = Counting(envs)
assert isinstance(envs.action_space, gym.spaces.Discrete)
obs = envs.reset()
print("reset", obs.shape)
for step in range(1, 4):
    obs, rewards, dones, infos = envs.step(np.zeros(2, dtype=int))
    print(f"step {step} dones {dones.tolist()} lives {infos['lives'].tolist()}")
"""


def test_a_script_ported_to_gymnasium_1_keeps_1s_layout(tmp_path):
    output = run_as_cleanrl_script(tmp_path, CLEANRL_PORTED)
    assert "step 3 ended [0, 1] lengths [3, 3]" in output, output


def test_gymnasium_029s_wrapper_names_and_the_atari_ids_work(tmp_path):
    output = run_as_cleanrl_script(tmp_path, CLEANRL_029_WRAPPERS)
    assert "atari (4, 84, 84) True" in output, output


def test_cleanrls_envpool_script_gets_the_old_gym_api_it_was_written_for(tmp_path):
    output = run_as_cleanrl_script(tmp_path, CLEANRL_OLD_GYM_ENVPOOL)
    assert "reset (2, 4, 84, 84)" in output, output
    # the 3-step limit ends both games at step 3: truncated, which the old API folds into done
    assert "step 2 dones [False, False]" in output and "step 3 dones [True, True]" in output, output


def test_bad_input_is_a_one_line_error(tmp_path):
    assert_user_error(run_tool("vs_cleanrl.py", "--cleanrl-dir", str(tmp_path), cwd=tmp_path), "checkout of CleanRL")
    os.makedirs(tmp_path / "cleanrl")
    for name in {pair.cleanrl_file[: -len(".py")] for pair in PAIRS.values()}:  # every pair's CleanRL script
        (tmp_path / "cleanrl" / f"{name}.py").write_text("")
    result = run_tool("vs_cleanrl.py", "--cleanrl-dir", str(tmp_path), "--rounds", "0", cwd=tmp_path)
    assert_user_error(result, "--rounds")
    # a --json that cannot be written is found before the half hour of runs, not after it
    result = run_tool("vs_cleanrl.py", "--cleanrl-dir", str(tmp_path), "--json", "no/such/folder/x.json", cwd=tmp_path)
    assert_user_error(result, "--json no/such/folder/x.json: its folder does not exist")


# dqn's pair measures from step 25,000 of 60,000: the stand-ins start at a tenth of their steady rate until then
DQN_WINDOW = {"first": 1000, "start": 25_000, "end": 60_000}


def test_the_speed_up_is_ours_over_cleanrls_median_steady_sps_of_the_interleaved_rounds(tmp_path):
    """Stand-ins for both sides' dqn.py (tests/fake_sps.py), with a steady rate per round (per call) each."""
    tool = copy_of_tool(tmp_path, "vs_cleanrl.py", {"dqn": {"rates": [100, 300, 110], **DQN_WINDOW}})
    fake_sps_scripts(tmp_path / "checkout", {"dqn": {"rates": [50, 40, 200], **DQN_WINDOW}})
    # run_tool joins benchmark/ and the tool's name: an absolute path runs the copy
    args = ("--cleanrl-dir", str(tmp_path / "checkout"), "--pairs", "dqn", "--rounds", "3", "--json", "out.json")
    result = run_tool(tool, *args, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    results = json.loads((tmp_path / "out.json").read_text())
    (row,) = results["rows"]
    assert row["rounds"]["cleanrl"] == pytest.approx([50, 40, 200]) and row["rounds"]["ours"] == pytest.approx(
        [100, 300, 110]
    ), "each round's steady SPS from step 25,000 on"
    assert (row["cleanrl_sps"], row["ours_sps"]) == pytest.approx((50, 110)), "medians, not means (96.7, 170)"
    assert row["speedup"] == pytest.approx(2.2) and row["processes"] == 1
    assert (results["cpu"], results["cpus"], results["rounds"]) == (cpu_model(), os.cpu_count(), 3)
    assert "| 1 | 50 | 110 | 2.20x |" in result.stdout, result.stdout


def test_two_runs_at_once_are_the_sum_of_their_steady_sps_ours_with_one_thread_each(tmp_path):
    tool = copy_of_tool(tmp_path, "vs_cleanrl.py", {"dqn": {"rates": [100], **DQN_WINDOW}})
    fake_sps_scripts(tmp_path / "checkout", {"dqn": {"rates": [50], **DQN_WINDOW}})  # each rate x --seed
    args = ("--cleanrl-dir", str(tmp_path / "checkout"), "--pairs", "dqn", "--rounds", "1", "--parallel")
    result = run_tool(tool, *args, "--json", "out.json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = {row["processes"]: row for row in json.loads((tmp_path / "out.json").read_text())["rows"]}
    assert (rows[1]["cleanrl_sps"], rows[1]["ours_sps"]) == pytest.approx((50, 100))
    assert (rows[2]["cleanrl_sps"], rows[2]["ours_sps"]) == pytest.approx((50 + 100, 100 + 200)), "seeds 1 and 2"
    for side, two_at_once in (("repo", "1"), ("checkout", "unset")):  # CleanRL's runs as a user starts them
        calls = [json.loads(path.read_text()) for path in (tmp_path / side / "fakes" / "dqn" / "calls").iterdir()]
        seeds_and_threads = sorted((call["argv"][-1], call["omp"] or "unset") for call in calls)
        assert seeds_and_threads == sorted([("1", "unset"), ("1", two_at_once), ("2", two_at_once)])
