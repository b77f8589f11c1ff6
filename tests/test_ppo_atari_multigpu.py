"""Specification of cleanrl/ppo_atari_multigpu.py: the PPO of ppo_atari.py over several processes.

Every multi-process run here is a real `torchrun` launch on CPU (gloo), one thread per process, with a
timeout: a hang fails the test instead of stalling CI.
"""

import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch
from checkpoints import assert_run_resumes_where_its_checkpoint_left_it
from evaluation import assert_evaluation_warns_when_emulator_settings_differ, saved_model_path
from fake_envs import assert_rollout_dones_and_rewards
from references import assert_ppo_loss_matches_reference
from run_outputs import (
    PPO_TAGS,
    assert_freed_memory_is_kept,
    assert_losses_are_finite,
    assert_rollout_acts_with_the_updated_weights,
    assert_warns_when_bf16_is_slow,
    capped_cubic_games,
    mp4_frames,
)
from running import (
    REPO_ROOT,
    Output,
    assert_atari_ranges_are_checked,
    assert_main_fails_with,
    assert_ppo_ranges_are_checked,
    assert_user_error,
    free_port,
    rank_lines,
    read_scalars,
    run_dirs,
    run_script,
    stop,
    wait_all,
    wait_for,
)

import cleanrl.ppo_atari as ppo_atari
import cleanrl.ppo_atari_multigpu as multigpu

SCRIPT = "ppo_atari_multigpu.py"
TORCHRUN = os.path.join(os.path.dirname(sys.executable), "torchrun")
TWO_PROCESSES = ["--standalone", "--nproc-per-node", "2"]
ONE_THREAD = {"OMP_NUM_THREADS": "1"}
# Small enough for 2 busy cores: each process plays 2 envs x 32 steps per iteration and learns in one
# epoch of two minibatches. With 2 processes an iteration is 128 steps.
SMALL = ["--local-num-envs", "2", "--num-steps", "32", "--num-minibatches", "2", "--update-epochs", "1"]
ITERATION = 128


def test_ppo_loss_of_one_process_matches_the_clipped_objective_of_the_paper():
    # without a process group the job's minibatch is this process's: the single-process objective
    assert_ppo_loss_matches_reference(multigpu.ppo_loss, multigpu.Args())


def start(command: list[str], cwd, env: dict | None = None, **popen) -> subprocess.Popen:
    # Not unbuffered: the script flushes its messages, which then reach the shared pipe whole, one write each.
    full_env = {**os.environ, "WANDB_MODE": "offline", **ONE_THREAD, **(env or {})}
    full_env.pop("PYTHONUNBUFFERED", None)
    return subprocess.Popen(command, cwd=cwd, env=full_env, text=True, **popen)


def torchrun(launch: list[str], *args: str, cwd, timeout: int) -> subprocess.CompletedProcess:
    """Runs `torchrun LAUNCH cleanrl/ppo_atari_multigpu.py ARGS`, one thread per process; a hang fails the test."""
    command = [TORCHRUN, *launch, os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *args]
    process = start(command, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(process)
        raise AssertionError(f"torchrun did not finish in {timeout} s: {' '.join(command)}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def steps(scalars, tag) -> list[int]:
    return [step for step, _ in scalars[tag]]


def annealed_lr(num_iterations: int, learning_rate: float = 2.5e-4) -> list[float]:
    return [learning_rate * (1.0 - i / num_iterations) for i in range(num_iterations)]


def progress_steps(output: str) -> list[str]:
    """The `STEP/TOTAL` of each plain progress line in an output."""
    return re.findall(
        r"^([\d,]+/[\d,]+) steps \| [\d,]+ SPS \| return \(last \d+\) \S+ \| ETA \d+:\d\d:\d\d$", output, re.M
    )


@pytest.fixture
def one_process(tmp_path, monkeypatch):
    """The script's public seams, its main run in this process as a job of one process in tmp_path: each call
    ends its process group, as the script's entry point does, so that main can run again."""
    monkeypatch.chdir(tmp_path)
    for variable in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(variable, raising=False)

    def main(args):
        try:
            multigpu.main(args)
        finally:
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()

    return types.SimpleNamespace(main=main, Args=multigpu.Args, lock_run=multigpu.lock_run)


def short_run(one_process, iterations: int, **args) -> str:
    """A run of one process, 1 env x 32 steps an iteration, with a checkpoint after each; returns its folder."""
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=32 * iterations)
    one_process.main(multigpu.Args(**sizes, checkpoint_every=1, **args))
    return max(run_dirs(os.getcwd()), key=os.path.getmtime)


# ---------------------------------------------------------------------------------------------
# The single-process math is ppo_atari.py's
# ---------------------------------------------------------------------------------------------
def test_ppo_loss_of_one_process_is_the_ppo_atari_loss_bit_for_bit():
    rng = np.random.default_rng(0)
    newlogprob, logprobs, advantages, returns, values, entropy = torch.from_numpy(rng.normal(size=(6, 64))).float()
    newvalue = torch.tensor(rng.normal(size=(64, 1)), dtype=torch.float32)
    inputs = (newlogprob, entropy, newvalue, logprobs, advantages, returns, values)
    loss, stats = multigpu.ppo_loss(*inputs, multigpu.Args())
    expected_loss, expected_stats = ppo_atari.ppo_loss(*inputs, ppo_atari.Args())
    assert torch.equal(loss, expected_loss)
    for key in expected_stats:
        assert torch.equal(stats[key], expected_stats[key]), key


# ---------------------------------------------------------------------------------------------
# Gradient sync: the averaged gradient of the shares is the gradient of the whole minibatch
# ---------------------------------------------------------------------------------------------
def fixed_minibatch(size: int = 32) -> dict:
    """A minibatch whose two halves have different advantage statistics, so that normalizing each
    process's share alone would give a different gradient than normalizing the whole minibatch."""
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    agent = multigpu.Agent(4).to(memory_format=torch.channels_last)
    obs = torch.randint(0, 256, (size, 4, 84, 84), dtype=torch.uint8, generator=generator)
    actions = torch.randint(0, 4, (size,), generator=generator)
    with torch.no_grad():
        _, logprobs, _, values = agent.get_action_and_value(obs, actions)
    advantages = torch.randn(size, generator=generator)
    advantages[size // 2 :] = 3.0 + 2.0 * advantages[size // 2 :]
    return {
        "agent": agent.state_dict(),
        "obs": obs,
        "actions": actions,
        "logprobs": logprobs + 0.2 * torch.randn(size, generator=generator),  # ratios away from 1, some clipped
        "advantages": advantages,
        "returns": values.flatten() + torch.randn(size, generator=generator),
        "values": values.flatten(),
    }


def minibatch_gradients(minibatch: dict, share: slice, mixed_precision: str = "none") -> multigpu.Agent:
    """The agent after backward() of the PPO loss on `share` of the minibatch (gradients not yet averaged)."""
    agent = multigpu.Agent(4).to(memory_format=torch.channels_last)
    agent.load_state_dict(minibatch["agent"])
    with torch.autocast("cpu", torch.bfloat16, enabled=mixed_precision == "bf16"):
        _, newlogprob, entropy, newvalue = agent.get_action_and_value(
            minibatch["obs"][share], minibatch["actions"][share]
        )
    loss, _ = multigpu.ppo_loss(
        newlogprob,
        entropy,
        newvalue,
        *(minibatch[k][share] for k in ("logprobs", "advantages", "returns", "values")),
        multigpu.Args(),
    )
    loss.backward()
    return agent


GRADIENT_WORKER = """
import sys
import torch
import torch.distributed as dist
import cleanrl.ppo_atari_multigpu as multigpu
from test_ppo_atari_multigpu import minibatch_gradients

minibatch = torch.load(sys.argv[1], weights_only=True)
dist.init_process_group("gloo")
rank, world_size = dist.get_rank(), dist.get_world_size()
size = len(minibatch["obs"]) // world_size
results = {}
for precision in ("none", "bf16"):
    agent = minibatch_gradients(minibatch, slice(rank * size, (rank + 1) * size), precision)
    results[f"{precision}, this share alone"] = [p.grad.clone() for p in agent.parameters()]
    multigpu.average_gradients(agent, world_size, 1 / world_size)
    results[precision] = [p.grad.clone() for p in agent.parameters()]
# Unequal shares (--env-split measured): 24 and 8 samples, averaged with and without the weights.
sizes = [24, 8]
first = sum(sizes[:rank])
for weight, name in ((sizes[rank] / sum(sizes), "unequal"), (1 / world_size, "unequal, unweighted")):
    agent = minibatch_gradients(minibatch, slice(first, first + sizes[rank]))
    multigpu.average_gradients(agent, world_size, weight)
    results[name] = [p.grad.clone() for p in agent.parameters()]
torch.save(results, f"{sys.argv[2]}/rank{rank}.pt")
dist.destroy_process_group()
"""


def relative_difference(grads, reference) -> float:
    return max(((g - r).abs().max() / r.abs().max()).item() for g, r in zip(grads, reference))


@pytest.fixture(scope="module")
def averaged_gradients(tmp_path_factory):
    """Each of 2 processes takes half of a fixed minibatch, computes its gradient and averages it with
    the script's `average_gradients`; returns every rank's gradients and the minibatch."""
    folder = tmp_path_factory.mktemp("gradients")
    minibatch = fixed_minibatch()
    torch.save(minibatch, folder / "minibatch.pt")
    (folder / "worker.py").write_text(GRADIENT_WORKER)
    command = [TORCHRUN, *TWO_PROCESSES, str(folder / "worker.py"), str(folder / "minibatch.pt"), str(folder)]
    process = start(
        command,
        folder,
        {"PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        output, _ = process.communicate(timeout=180)
    finally:
        stop(process)
    assert process.returncode == 0, output
    ranks = [torch.load(folder / f"rank{rank}.pt", weights_only=True) for rank in range(2)]
    return ranks, minibatch


def test_averaged_gradient_equals_the_single_process_gradient_of_the_whole_minibatch(averaged_gradients):
    (rank0, rank1), minibatch = averaged_gradients
    whole = [p.grad for p in minibatch_gradients(minibatch, slice(None)).parameters()]
    assert relative_difference(rank0["none"], whole) < 1e-4
    # Every rank applies the same averaged gradient, bit for bit.
    assert all(torch.equal(g0, g1) for g0, g1 in zip(rank0["none"], rank1["none"]))
    # What the sync replaces is far from it: the test could fail.
    assert relative_difference(rank0["none, this share alone"], whole) > 1e-2


def test_weighted_gradient_of_unequal_shares_equals_the_single_process_gradient_of_the_whole_minibatch(
    averaged_gradients,
):
    (rank0, rank1), minibatch = averaged_gradients
    whole = [p.grad for p in minibatch_gradients(minibatch, slice(None)).parameters()]
    assert relative_difference(rank0["unequal"], whole) < 1e-4
    assert all(torch.equal(g0, g1) for g0, g1 in zip(rank0["unequal"], rank1["unequal"]))
    # A plain mean of the two shares' gradients would weigh the 8 samples as much as the 24.
    assert relative_difference(rank0["unequal, unweighted"], whole) > 1e-2


def test_bf16_gradients_are_averaged_in_fp32(averaged_gradients):
    (rank0, rank1), minibatch = averaged_gradients
    assert all(g.dtype == torch.float32 for g in rank0["bf16"])
    assert all(torch.equal(g0, g1) for g0, g1 in zip(rank0["bf16"], rank1["bf16"]))
    whole = [p.grad for p in minibatch_gradients(minibatch, slice(None), "bf16").parameters()]
    assert relative_difference(rank0["bf16"], whole) < 5e-2  # bf16 forward passes of different batch sizes


# ---------------------------------------------------------------------------------------------
# A 2-process training run
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    """torchrun, 2 processes, 12 iterations (2 x 2 envs x 32 steps each), checkpoints every 4, saved model,
    videos, a progress line every hour (so: the first and the last)."""
    cwd = tmp_path_factory.mktemp("two_processes")
    result = torchrun(
        TWO_PROCESSES,
        *SMALL,
        "--total-timesteps",
        str(12 * ITERATION),
        "--checkpoint-every",
        "4",
        "--save-model",
        "--eval-episodes",
        "1",
        "--progress-interval",
        "3600",
        "--capture-video",
        cwd=cwd,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result, cwd


def test_two_processes_run_every_iteration_and_log_every_tag_once_per_iteration(two_process_run):
    result, cwd = two_process_run
    assert (
        "world size 2: 4 envs (2 per process), batch 128 (64 per process), minibatch 64 (32 per process), "
        "12 iterations" in result.stdout
    )
    assert "finished 12 iterations, 1536 steps" in result.stdout
    (run_dir,) = run_dirs(cwd)
    scalars = read_scalars(run_dir)
    for tag in PPO_TAGS + ["charts/world_size"]:
        assert tag in scalars, tag
    iteration_steps = [ITERATION * i for i in range(1, 13)]
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == iteration_steps, tag
    assert {value for _, value in scalars["charts/world_size"]} == {2}
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], annealed_lr(12), rtol=1e-6)
    assert all(np.isfinite(value) for _, value in scalars["losses/value_loss"])


def test_every_rank_ends_with_bit_identical_parameters(two_process_run):
    result, cwd = two_process_run
    digests = {
        rank: m["digest"]
        for rank, m in rank_lines(
            result.stdout,
            r"rank (?P<rank>\d+): played \d+ games, "
            r"parameters sha256 (?P<digest>[0-9a-f]+)",
        ).items()
    }
    assert sorted(digests) == [0, 1]
    assert digests[0] == digests[1]
    # The ranks print these lines at the same moment to one output: each must stay a line of its own.
    played_lines = [line for line in result.stdout.splitlines() if " played " in line]
    assert all(re.fullmatch(r"rank \d+: played \d+ games, parameters sha256 [0-9a-f]+", x) for x in played_lines)
    # ... and they are the weights rank 0 saved.
    saved_agent, _ = multigpu.load_model(saved_model_path(SCRIPT, cwd), torch.device("cpu"))
    assert multigpu.parameter_digest(saved_agent) == digests[0]


def test_every_environment_of_the_job_has_its_own_seed(two_process_run):
    result, _ = two_process_run
    pattern = r"rank (?P<rank>\d+)/2: .*?env seeds (?P<first>\d+)\.\.(?P<last>\d+)"
    seeds = {rank: range(int(m["first"]), int(m["last"]) + 1) for rank, m in rank_lines(result.stdout, pattern).items()}
    assert sorted(seeds) == [0, 1]
    assert sorted(list(seeds[0]) + list(seeds[1])) == [1, 2, 3, 4]  # seed 1: global env index i gets 1 + i


def test_logged_games_are_the_games_of_every_rank(two_process_run):
    result, cwd = two_process_run
    pattern = r"rank (?P<rank>\d+): played (?P<games>\d+) games"
    games = {rank: int(m["games"]) for rank, m in rank_lines(result.stdout, pattern).items()}
    assert sorted(games) == [0, 1] and games[0] > 0 and games[1] > 0
    scalars = read_scalars(run_dirs(cwd)[0])
    returns = [value for _, value in scalars["charts/episodic_return"]]
    assert len(returns) == games[0] + games[1]
    assert len(scalars["charts/episodic_length"]) == len(returns)
    assert all(r >= 0 and r == int(r) for r in returns)
    game_steps = steps(scalars, "charts/episodic_return")
    assert all(0 < step <= 12 * ITERATION for step in game_steps)
    assert len(set(game_steps)) == len(game_steps), "every game is logged at a global step of its own"


def test_a_world_size_that_cannot_split_the_environments_names_the_ones_that_can(one_process, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")  # checked before any process group exists
    args = multigpu.Args(num_envs=3, num_steps=32, num_minibatches=2)
    assert_main_fails_with(
        one_process.main, args, "3 envs x 32 steps cannot be split over 2 processes", "run on 1 or 3"
    )


def test_resumable_world_sizes_split_the_environments_and_the_minibatches():
    assert multigpu.resumable_world_sizes(8, 128, 4) == [1, 2, 4, 8]
    assert multigpu.resumable_world_sizes(12, 128, 4) == [1, 2, 3, 4, 6, 12]
    # 8 envs x 1 step on 4 processes: rollouts of 2 samples, not divisible into 4 minibatches.
    assert multigpu.resumable_world_sizes(8, 1, 4) == [1, 2]
    assert multigpu.in_words([1, 2, 4, 8]) == "1, 2, 4 or 8 processes" and multigpu.in_words([1]) == "1 process"
    # --env-split measured splits into any multiples of the granularity: 8 x 1 step into 4 minibatches needs 4.
    assert multigpu.resumable_world_sizes(8, 128, 4, "measured") == list(range(1, 9))
    assert multigpu.resumable_world_sizes(8, 1, 4, "measured") == [1, 2]
    assert multigpu.in_words(list(range(1, 9))) == "1 to 8 processes"


# ---------------------------------------------------------------------------------------------
# --env-split measured: shares in proportion to measured speed
# ---------------------------------------------------------------------------------------------
def test_split_granularity_makes_every_share_divide_into_the_minibatches():
    assert multigpu.split_granularity(128, 4) == 1
    assert multigpu.split_granularity(5, 4) == 4  # 4 envs x 5 steps = 20 samples: 4 minibatches of 5
    assert multigpu.split_granularity(6, 4) == 2
    # At the start, processes of equal speed: as even a split as the granularity allows.
    assert multigpu.balanced_split(10, [1.0] * 3, 1) == [4, 3, 3]
    assert multigpu.balanced_split(12, [1.0] * 2, 4) == [8, 4]


def test_balanced_split_gives_a_twice_faster_process_twice_the_environments():
    assert multigpu.balanced_split(12, [0.1, 0.2], 1) == [8, 4]
    assert multigpu.balanced_split(8, [0.1, 0.1], 1) == [4, 4]
    assert multigpu.balanced_split(16, [0.1, 0.2, 0.4], 2) == [10, 4, 2]
    # No process is left without environments, however slow it is.
    assert multigpu.balanced_split(4, [0.01, 10.0], 1) == [3, 1]
    # The split minimizes the slowest process's time: no other split of 12 does better.
    seconds = [0.13, 0.29]
    best = min(([n, 12 - n] for n in range(1, 12)), key=lambda split: multigpu.iteration_seconds(split, seconds))
    assert multigpu.iteration_seconds(multigpu.balanced_split(12, seconds, 1), seconds) == multigpu.iteration_seconds(
        best, seconds
    )


def test_a_resumed_measured_run_keeps_its_split_on_the_same_world_size_only():
    checkpoint = {"env_split": [3, 1]}
    for world_size, env_split, expected in [
        (2, "measured", [3, 1]),
        (1, "measured", [4]),
        (2, "even", [2, 2]),
        (3, "measured", [2, 1, 1]),
    ]:
        args = multigpu.Args(num_envs=4, num_steps=32, num_minibatches=2, env_split=env_split)
        args.world_size = world_size
        assert multigpu.first_split(args, checkpoint, rank=1) == expected, (world_size, env_split)


def test_off_a_terminal_rank_0_alone_prints_the_first_and_the_last_progress_line(two_process_run):
    result, _ = two_process_run  # torchrun's output is a pipe; --progress-interval 3600
    assert progress_steps(result.stderr) == ["128/1,536", "1,536/1,536"], result.stderr


def test_only_rank_0_writes_logs_and_evaluates(two_process_run):
    result, cwd = two_process_run
    assert result.stdout.count("finished 12 iterations") == 1
    assert result.stdout.count("eval_episode=") == 1
    (run_dir,) = run_dirs(cwd)
    assert len(list((cwd / "runs").glob("*/events.out.tfevents.*"))) == 1
    checkpoints = sorted(p.name for p in (cwd / "runs").glob("*/checkpoints/*.pt"))
    assert checkpoints == ["iteration-0000008.pt", "iteration-0000012.pt"]  # the newest two


def test_resume_with_another_world_size_resplits_the_batch_and_continues_the_steps(two_process_run, tmp_path):
    _, finished = two_process_run
    shutil.copytree(finished / "runs", tmp_path / "runs")
    (checkpoint,) = (tmp_path / "runs").glob("*/checkpoints/iteration-0000008.pt")
    # One process resumes the 2-process run from iteration 8: the same 4 envs (the job's number, which the
    # run learns with), all in one process (--local-num-envs says where they run: it may change).
    same_run = [*SMALL, "--total-timesteps", str(12 * ITERATION), "--checkpoint-every", "4", "--save-model"]
    result = run_script(
        SCRIPT,
        *same_run,
        "--eval-episodes",
        "1",
        "--num-envs",
        "4",
        "--resume",
        str(checkpoint),
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(rf"resuming \S+ at step 1,024 from {re.escape(str(checkpoint))}", result.stdout)
    # The resumed run went on from the checkpoint's optimizer: Adam counted every update of the whole run.
    (last,) = (tmp_path / "runs").glob("*/checkpoints/iteration-0000012.pt")
    assert all(
        int(state["step"]) == 12 * 2 for state in torch.load(last, weights_only=True)["optimizer"]["state"].values()
    )
    assert (
        "the run's 4 environments (2 per process on 2 processes) are split over 1 process: 4 per process"
        in result.stdout
    )
    assert "world size 1: 4 envs (4 per process), batch 128" in result.stdout
    assert "finished 12 iterations, 1536 steps" in result.stdout
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    # No step twice, none missing: what the first run logged after iteration 8 is replaced.
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == [ITERATION * i for i in range(1, 13)], tag
    assert [value for _, value in scalars["charts/world_size"]] == [2] * 8 + [1] * 4
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], annealed_lr(12), rtol=1e-6)
    # The games logged up to the checkpoint are all still there.
    up_to_checkpoint = lambda events: [event for event in events if event[0] <= 8 * ITERATION]
    before = read_scalars(run_dirs(finished)[0])["charts/episodic_return"]
    assert up_to_checkpoint(scalars["charts/episodic_return"]) == up_to_checkpoint(before)


# ---------------------------------------------------------------------------------------------
# Two nodes on one machine
# ---------------------------------------------------------------------------------------------
def two_nodes(tmp_path_factory, args_of_node: list[list[str]], timeout: float = 180):
    """Two torchrun launches of one process each, --nnodes=2 with a static master on 127.0.0.1, each in a
    folder of its own as on separate machines, node i with the arguments args_of_node[i]; returns
    (merged output, exit code, folder) of each."""
    port = free_port()
    launches = []
    for node_rank, args in enumerate(args_of_node):
        cwd = tmp_path_factory.mktemp(f"node{node_rank}")
        command = [
            TORCHRUN,
            "--nnodes=2",
            "--nproc-per-node=1",
            f"--node-rank={node_rank}",
            "--master-addr=127.0.0.1",
            f"--master-port={port}",
            os.path.join(REPO_ROOT, "cleanrl", SCRIPT),
            *args,
        ]
        launches.append((start(command, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), cwd))
    return wait_all(launches, timeout=timeout)


@pytest.fixture(scope="module")
def two_node_bf16_run(tmp_path_factory):
    """Two nodes of one process each; bf16 autocast; --target-kl (an all-reduced KL) on."""
    args = [*SMALL, "--total-timesteps", str(3 * ITERATION), "--mixed-precision", "bf16", "--target-kl", "0.0"]
    return two_nodes(tmp_path_factory, [[*args, "--progress-interval", "0"]] * 2)


def test_two_nodes_of_one_process_train_as_one_job(two_node_bf16_run):
    (output0, rc0, cwd0), (output1, rc1, cwd1) = two_node_bf16_run
    assert rc0 == 0 and rc1 == 0, output0 + output1
    assert "world size 2: 4 envs" in output0 and "finished 3 iterations, 384 steps" in output0
    assert "rank 1/2" in output1 and "finished" not in output1
    digests = re.findall(r"parameters sha256 ([0-9a-f]+)", output0 + output1)
    assert len(digests) == 2 and digests[0] == digests[1]
    # Each node has a folder (a disk) of its own: each keeps the whole run, so either can resume it alone.
    assert [os.path.basename(d) for d in run_dirs(cwd1)] == [os.path.basename(d) for d in run_dirs(cwd0)]
    assert read_scalars(run_dirs(cwd1)[0]).keys() == read_scalars(run_dirs(cwd0)[0]).keys()
    scalars = read_scalars(run_dirs(cwd0)[0])
    assert steps(scalars, "charts/SPS") == [ITERATION, 2 * ITERATION, 3 * ITERATION]


def test_off_a_terminal_rank_0_alone_prints_a_progress_line_per_interval(two_node_bf16_run):
    (output0, _, _), (output1, _, _) = two_node_bf16_run  # --progress-interval 0: every iteration
    assert progress_steps(output0) == ["128/384", "256/384", "384/384"], output0
    assert progress_steps(output1) == [], output1


def test_bf16_run_gives_finite_losses(two_node_bf16_run):
    (_, rc0, cwd0), _ = two_node_bf16_run
    assert rc0 == 0
    assert_losses_are_finite(run_dirs(cwd0)[0])


@pytest.mark.parametrize(
    "node1_args, message",
    [
        (["--ent-coef", "0.5"], "rank 1 runs with --ent-coef 0.5, rank 0 with 0.01: run one command"),
        # another number of collective calls: without the check, both nodes wait at the first checkpoint
        (["--checkpoint-every", "1"], "rank 1 runs with --checkpoint-every 1, rank 0 with 0: run one command"),
    ],
    ids=["a learning argument", "the checkpoints"],
)
def test_nodes_started_with_other_arguments_stop_with_one_error_line(tmp_path_factory, node1_args, message):
    args = [*SMALL, "--total-timesteps", str(3 * ITERATION)]
    (output0, rc0, cwd0), (output1, rc1, _) = two_nodes(tmp_path_factory, [args, [*args, *node1_args]], timeout=120)
    assert rc0 != 0 and rc1 != 0, output0 + output1
    assert f"error: {message}" in output0, output0
    assert len(re.findall(r"^error: ", output0 + output1, re.MULTILINE)) == 1, output0 + output1
    assert not (cwd0 / "runs").exists()  # stopped before anything was logged


# ---------------------------------------------------------------------------------------------
# A worker killed under torchrun --max-restarts
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "rendezvous",
    ["c10d, store shared with the workers", "c10d, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", "static, --master-addr"],
)
def test_killed_worker_is_restarted_and_the_run_resumes_to_its_full_budget(tmp_path, rendezvous):
    launch, env = TWO_PROCESSES, {}
    if rendezvous.startswith("static"):
        launch = ["--nnodes=1", "--nproc-per-node=2", "--master-addr=127.0.0.1", f"--master-port={free_port()}"]
    elif rendezvous.endswith("=1"):
        env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    # 30 iterations: the kill after the first checkpoint (iteration 2) must land before the run ends,
    # also when a loaded machine makes this test's process late to see the checkpoint line.
    iterations = 30
    command = [
        TORCHRUN,
        *launch,
        "--max-restarts",
        "1",
        "--monitor-interval",
        "0.5",
        os.path.join(REPO_ROOT, "cleanrl", SCRIPT),
        *SMALL,
        "--total-timesteps",
        str(iterations * ITERATION),
        "--checkpoint-every",
        "2",
        "--resume",
        "auto",
    ]
    process = start(command, tmp_path, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = Output(process)
    try:
        # Once the first checkpoint is written, kill -9 rank 1, whose pid the run printed.
        wait_for(lambda: "checkpoint runs/" in output.text, [process], [output])
        victim = int(re.search(r"rank 1/2: pid (\d+)", output.text)[1])
        os.kill(victim, signal.SIGKILL)
        process.wait(timeout=180)
    finally:
        stop(process)
        output.reader.join(timeout=10)
    text = output.text
    assert process.returncode == 0, text
    # torchrun saw a worker of the first attempt fail: the killed one, or rank 0 when its collective call
    # failed on the dead peer before torchrun polled the victim (a race) ...
    first_pids = {int(re.search(rf"rank {r}/2: pid (\d+)", text)[1]) for r in (0, 1)}
    failed = re.search(r"failed \(exitcode: -?\d+\) local_rank: \d \(pid: (\d+)\)", text)
    assert failed and int(failed[1]) in first_pids and victim in first_pids, text
    assert re.search(
        r"resuming \S+ at step [\d,]+ from \S+iteration-\d+\.pt", text
    )  # ... and the restarted workers resumed
    pids = re.findall(r"rank 1/2: pid (\d+)", text)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in text
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == [ITERATION * i for i in range(1, iterations + 1)], tag
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], annealed_lr(iterations), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Processes of unequal speed (--env-split measured) and nodes that join and leave (torchrun elastic)
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def measured_split_run(tmp_path_factory):
    """2 processes, each pinned to its own core, with two busy loops on rank 1's core: rank 1 runs at about
    a third of rank 0's speed, and still at half of it if other jobs load both cores alike. Each loop
    is a session of its own: Linux's autogroup scheduler shares a core between sessions first, and the
    two loops of one session would take only half of the core together. 16 iterations of 8 envs x 32 steps,
    --env-split measured every 2 iterations, videos. Games end within 48 steps (--max-episode-steps): a new
    split starts new environments, and under load the split may change at every measurement, 64 steps
    apart, too soon for a whole game of Breakout at random play."""
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2 or shutil.which("taskset") is None:
        pytest.skip("needs 2 cores and taskset")
    cwd = tmp_path_factory.mktemp("measured_split")
    pin = f'exec taskset -c "$(echo {cores[0]} {cores[1]} | cut -d" " -f$((LOCAL_RANK + 1)))" "$@"'
    command = [
        TORCHRUN,
        *TWO_PROCESSES,
        "--no-python",
        "sh",
        "-c",
        pin,
        "sh",
        sys.executable,
        os.path.join(REPO_ROOT, "cleanrl", SCRIPT),
        "--num-envs",
        "8",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        str(16 * 256),
        "--env-split",
        "measured",
        "--split-every",
        "2",
        "--checkpoint-every",
        "8",
        "--max-episode-steps",
        "48",
        "--capture-video",
    ]
    competitors = [
        subprocess.Popen(
            ["taskset", "-c", str(cores[1]), sys.executable, "-c", "while True: pass"], start_new_session=True
        )
        for _ in range(2)
    ]
    process = start(command, cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        stdout, stderr = process.communicate(timeout=300)
    finally:
        stop(process)
        for competitor in competitors:
            competitor.kill()
            competitor.wait()
    assert process.returncode == 0, stdout + stderr
    return stdout, cwd


@pytest.mark.alone  # its fixture's run compares the speed of two processes
def test_measured_split_moves_environments_to_the_faster_process(measured_split_run):
    stdout, cwd = measured_split_run
    assert "world size 2: 8 envs (4 per process)" in stdout
    change = re.search(r"iteration (\d+): env split 4 -> (\d+) \+ (\d+) per process: measured (\d+) / (\d+) ms", stdout)
    assert change, stdout
    assert int(change[2]) > int(change[3]) and int(change[2]) + int(change[3]) == 8
    assert int(change[4]) < int(change[5])  # rank 0, alone on its core, measured faster
    scalars = read_scalars(run_dirs(cwd)[0])
    shares = list(zip(*(scalars[f"charts/local_num_envs/rank_{r}"] for r in range(2))))
    assert [step for (step, _), _ in shares] == [256 * i for i in range(1, 17)]
    assert all(n0 + n1 == 8 for (_, n0), (_, n1) in shares)
    changed_at = int(change[1])
    assert [n0 for (_, n0), _ in shares[:changed_at]] == [4] * changed_at
    assert shares[changed_at][0][1] == int(change[2])


@pytest.mark.alone
def test_measured_split_keeps_every_step_game_and_weight_right(measured_split_run):
    stdout, cwd = measured_split_run
    scalars = read_scalars(run_dirs(cwd)[0])
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == [256 * i for i in range(1, 17)], tag
    played = {
        rank: int(m["games"])
        for rank, m in rank_lines(stdout, r"rank (?P<rank>\d+): played (?P<games>\d+) games").items()
    }
    game_steps = steps(scalars, "charts/episodic_return")
    assert played[0] > 0 and played[1] > 0
    assert len(game_steps) == played[0] + played[1] and len(set(game_steps)) == len(game_steps)
    digests = set(re.findall(r"parameters sha256 ([0-9a-f]+)", stdout))
    assert len(digests) == 1
    # The checkpoint keeps the split, and rank 0's videos go on after its environments were replaced.
    (checkpoint,) = (cwd / "runs").glob("*/checkpoints/iteration-0000016.pt")
    assert torch.load(checkpoint, weights_only=True)["env_split"] == [
        n for _, n in (scalars["charts/local_num_envs/rank_0"][-1], scalars["charts/local_num_envs/rank_1"][-1])
    ]
    videos = sorted((cwd / "videos").glob("*/game-*.mp4"))
    assert videos and all(mp4_frames(str(video)).shape[1:] == (210, 160, 3) for video in videos)


def test_nodes_that_join_and_leave_an_elastic_job(tmp_path):
    """Two single-process torchrun "nodes" of one elastic job on loopback: node A trains alone, node B joins
    (world size 2, resumed from A's checkpoint), B is killed (agent and worker, as a lost machine), and A
    goes on alone to the end of the run's budget."""
    iterations = 200
    launch = [
        TORCHRUN,
        "--nnodes=1:2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}",
        "--rdzv-id=elastic-test",
        "--rdzv-conf=last_call_timeout=1",
        "--max-restarts=3",
        "--monitor-interval=0.5",
        os.path.join(REPO_ROOT, "cleanrl", SCRIPT),
        "--num-envs",
        "4",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        str(iterations * ITERATION),
        "--checkpoint-every",
        "5",
        "--resume",
        "auto",
        "--env-split",
        "measured",
    ]
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}  # torch 2.13's shared store cannot grow a job: docs
    popen = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    node_a = start(launch, tmp_path, env, **popen)
    a, node_b, b = Output(node_a), None, None
    try:
        wait_for(lambda: "checkpoint runs/" in a.text, [node_a], [a])
        node_b = start(launch, tmp_path, env, **popen)
        b = Output(node_b)
        # World size 2, and a checkpoint of it written by its rank 0 (on either node).
        after_world_2 = lambda output: output.text.partition("world size 2:")[2]
        wait_for(lambda: any("checkpoint runs/" in after_world_2(o) for o in (a, b)), [node_a, node_b], [a, b])
        worker_b = int(re.search(r"rank \d/2: pid (\d+)", b.text)[1])
        os.killpg(node_b.pid, signal.SIGKILL)
        os.kill(worker_b, signal.SIGKILL)
        node_a.wait(timeout=240)
    finally:
        for node in (node_a, node_b):
            if node is not None and node.poll() is None:
                os.killpg(node.pid, signal.SIGKILL)
    a.reader.join(timeout=10)
    assert node_a.returncode == 0, a.text
    assert f"finished {iterations} iterations, {iterations * ITERATION} steps" in a.text
    assert "are split over 1 process: 4 per process" in a.text  # the last resume, at world size 1
    scalars = read_scalars(run_dirs(tmp_path)[0])
    world_sizes = [int(value) for _, value in scalars["charts/world_size"]]
    assert [size for i, size in enumerate(world_sizes) if i == 0 or size != world_sizes[i - 1]] == [1, 2, 1]
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == [ITERATION * i for i in range(1, iterations + 1)], tag
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], annealed_lr(iterations), rtol=1e-6)
    game_steps = steps(scalars, "charts/episodic_return")
    assert len(set(game_steps)) == len(game_steps)


# ---------------------------------------------------------------------------------------------
# Bad input: a one-line error, every process exits non-zero, nothing hangs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--local-num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "3 envs x 5 steps cannot be split"),
        (["--backend", "mpi"], "unknown backend 'mpi'"),
        (["--resume", "missing.pt"], "no such checkpoint file"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--local-num-envs", "1", "--num-steps", "4", "--num-minibatches", "4"], "cannot normalize advantages"),
        (["--update-epochs", "0"], "must be positive"),
        (["--max-episode-steps", "0"], "must be positive"),
        (["--num-envs", "0"], "must be positive"),
        (
            ["--env-split", "measured", "--num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"],
            "change --num-envs, --num-steps or --num-minibatches",
        ),
        (["--split-threshold", "1.5"], "must be at least 0 and below 1"),
        (["--split-every", "0"], "must be positive"),
        (["--clip-coef", "-0.1"], "--clip-coef must not be negative, got -0.1"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script(SCRIPT, *args, cwd=tmp_path, timeout=120), message)


def test_values_out_of_range_are_one_line_errors_naming_the_flag():
    assert_atari_ranges_are_checked(
        multigpu.check_args,
        lambda **o: multigpu.Args(
            num_envs=8, world_size=1, batch_size=1024, minibatch_size=256, num_iterations=9765, **o
        ),
    )
    assert_ppo_ranges_are_checked(multigpu.check_args, multigpu.Args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpu_is_a_one_line_error(tmp_path):
    assert_user_error(run_script(SCRIPT, "--backend", "nccl", cwd=tmp_path, timeout=120), "needs a GPU")


def test_bf16_rollout_acts_with_the_weights_of_the_last_update(one_process):
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=1, update_epochs=1, total_timesteps=4 * 32)
    one_process.main(multigpu.Args(**sizes, mixed_precision="bf16"))
    assert_rollout_acts_with_the_updated_weights(run_dirs(os.getcwd())[0])


def test_bf16_on_a_cpu_without_bf16_kernels_warns(monkeypatch, capsys):
    assert_warns_when_bf16_is_slow(multigpu, monkeypatch, capsys)


def test_freed_memory_is_kept_for_reuse():
    assert_freed_memory_is_kept(multigpu)


def test_evaluation_warns_when_emulator_settings_differ_from_training(tmp_path):
    assert_evaluation_warns_when_emulator_settings_differ(multigpu, tmp_path)


def test_resuming_from_a_saved_model_instead_of_a_checkpoint_is_a_one_line_error(tmp_path):
    path = str(tmp_path / "agent.cleanrl_model")
    multigpu.save_model(path, multigpu.Agent(4), multigpu.Args())
    assert_user_error(run_script(SCRIPT, "--resume", path, cwd=tmp_path, timeout=120), "not a readable")


def test_a_resumed_run_restores_its_state_and_goes_on_in_its_directory(one_process, tmp_path, monkeypatch, capsys):
    # A job of one process: the resume rule, the lock, the checkpoint's contents, as every PPO script's.
    args = dict(num_envs=2, num_steps=128, num_minibatches=2, update_epochs=1, cuda=False)  # games end
    assert_run_resumes_where_its_checkpoint_left_it(one_process, tmp_path, monkeypatch, capsys, args)


@pytest.mark.parametrize("changed", [dict(num_envs=2), dict(seed=2), dict(learning_rate=1e-3), dict(num_steps=64)])
def test_a_resumed_run_must_learn_with_the_checkpoints_arguments(one_process, changed):
    checkpoint = os.path.join(short_run(one_process, 2), "checkpoints", "iteration-0000002.pt")
    name, value = next(iter(changed.items()))
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=64)
    args = multigpu.Args(**dict(sizes, **changed), resume=checkpoint)
    assert_main_fails_with(one_process.main, args, f"the checkpoint's run has {name}=", f"this command {value!r}")


def test_a_resumed_run_may_change_where_it_runs_and_how_it_is_watched(one_process, capsys):
    run_dir = short_run(one_process, 1, local_num_envs=3, env_split="even")
    capsys.readouterr()
    where = dict(local_num_envs=5, env_split="measured", split_every=3, split_threshold=0.5, backend="gloo", cuda=False)
    watched = dict(progress_interval=0.0, eval_episodes=1, checkpoint_every=2)
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=32)
    one_process.main(multigpu.Args(**sizes, **where, **watched, resume="auto"))
    assert f"resuming {os.path.basename(run_dir)} at step 32 from " in capsys.readouterr().out
    assert set(where) | set(watched) <= multigpu.RESUMABLE_CHANGES


@pytest.fixture(scope="module")
def bad_input_under_torchrun(tmp_path_factory):
    return torchrun(
        TWO_PROCESSES,
        "--local-num-envs",
        "3",
        "--num-steps",
        "5",
        "--num-minibatches",
        "4",
        cwd=tmp_path_factory.mktemp("bad_input"),
        timeout=120,
    )


def test_bad_input_under_torchrun_stops_every_process_with_one_error_line(bad_input_under_torchrun):
    result = bad_input_under_torchrun
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert len(re.findall(r"^error: ", output, re.MULTILINE)) == 1, output
    assert "cannot be split over 2 processes" in output
    assert f'{SCRIPT}", line' not in output, "a traceback through the script"


def test_torchrun_failure_report_names_the_error_as_root_cause(bad_input_under_torchrun):
    report = bad_input_under_torchrun.stderr
    assert "Root Cause (first observed failure):" in report, report
    root_cause = report.split("Root Cause (first observed failure):")[1]
    message = "error: 6 envs x 5 steps cannot be split over 2 processes into rollouts of 4 whole minibatches"
    assert f"traceback : {message}" in root_cause, root_cause
    assert "To enable traceback" not in report, report


def test_resume_auto_help_says_it_picks_the_newest_checkpoint_of_the_runs_name(tmp_path):
    result = run_script(SCRIPT, "--help", cwd=tmp_path, timeout=120)
    assert result.returncode == 0
    help_text = " ".join(result.stdout.replace("│", " ").split())
    assert "the newest of this env_id, exp_name and seed" in help_text, help_text


def test_resume_auto_resumes_the_newest_checkpoint_by_modification_time_and_names_it(one_process, capsys):
    # Two runs of the same env id, exp name and seed; the one whose name sorts last holds the older checkpoint.
    newer = os.path.join(short_run(one_process, 1), "checkpoints", "iteration-0000001.pt")
    older_run = newer.split(os.sep)[-3] + "9"
    shutil.copytree(os.path.dirname(os.path.dirname(newer)), os.path.join("runs", older_run))
    older = os.path.join("runs", older_run, "checkpoints", "iteration-0000001.pt")
    os.utime(older, (time.time() - 60, time.time() - 60))
    capsys.readouterr()
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=32)
    one_process.main(multigpu.Args(**sizes, resume="auto"))
    assert f"at step 32 from {os.path.relpath(newer)}" in capsys.readouterr().out


def test_resume_auto_takes_an_exp_name_literally_not_as_a_pattern(one_process, capsys):
    run_dir = short_run(one_process, 1, exp_name="ppo[1]")  # as a glob pattern, [1] would match "1", not "[1]"
    capsys.readouterr()
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=32)
    one_process.main(multigpu.Args(**sizes, exp_name="ppo[1]", resume="auto"))
    assert f"resuming {os.path.basename(run_dir)} at step 32 from " in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# The rollout: life losses end episodes, time limits are bootstrapped
# ---------------------------------------------------------------------------------------------
def test_rollout_ends_episodes_at_life_losses_and_bootstraps_only_time_limits(one_process, monkeypatch):
    # One iteration of 2 envs x 128 steps with a 60-step time limit: random play loses lives and
    # hits the limit.
    args = multigpu.Args(local_num_envs=2, num_steps=128, total_timesteps=256, max_episode_steps=60)
    assert_rollout_dones_and_rewards(multigpu, monkeypatch, one_process.main, args)


def test_time_limit_counts_agent_steps():
    envs = multigpu.make_envs("BreakoutNoFrameskip-v4", 2, 0.0, max_episode_steps=20)
    envs.reset(seed=1)
    ends = []
    for step in range(1, 61):  # NOOPs: Breakout waits for FIRE, no life is lost
        _, _, terminated, truncated, _ = envs.step(np.zeros(2, dtype=np.int64))
        assert not terminated.any()
        ends += [step] * int(truncated.sum())
    envs.close()
    assert ends == [20, 20, 40, 40, 60, 60]


# ---------------------------------------------------------------------------------------------
# Videos
# ---------------------------------------------------------------------------------------------
def test_videos_are_rgb_whole_games_of_env_0_of_rank_0(two_process_run):
    _, cwd = two_process_run  # --capture-video
    # Env 0 of rank 0 is the job's env 0: its games are logged at the global steps 1, 5, 9, ... (4 envs).
    lengths = read_scalars(run_dirs(cwd)[0])["charts/episodic_length"]
    env0_lengths = [int(length) for step, length in lengths if (step - 1) % 4 == 0]
    videos = sorted(glob.glob(str(cwd / "videos" / "*[0-9]" / "game-*.mp4")), key=lambda v: int(v[:-4].split("-")[-1]))
    finished = capped_cubic_games(len(env0_lengths))  # the scheduled games among the finished ones
    names = [os.path.basename(v) for v in videos]
    assert finished and names[: len(finished)] == [f"game-{k}.mp4" for k in finished], names
    assert names[len(finished) :] in ([], [f"game-{len(env0_lengths)}.mp4"])  # the game in progress at the end
    for k, video in zip(finished, videos):
        frames = mp4_frames(video)
        assert frames.shape[1:] == (210, 160, 3) and frames.std(axis=-1).mean() > 1, "the real game in colour"
        assert len(frames) == env0_lengths[k] + 1, video  # its first screen and one per agent step


def test_checkpoint_counts_the_games_of_env_0_of_rank_0(two_process_run):
    _, cwd = two_process_run
    (checkpoint,) = (cwd / "runs").glob("*/checkpoints/iteration-0000008.pt")
    events = read_scalars(run_dirs(cwd)[0])["charts/episodic_return"]
    env0_games = [step for step, _ in events if (step - 1) % 4 == 0 and step <= 8 * ITERATION]
    assert torch.load(checkpoint, weights_only=True)["env0_games"] == len(env0_games)


def test_a_resumed_run_numbers_its_videos_after_the_checkpoints_games(one_process):
    # A run whose env 0 had finished 27 games at its checkpoint: the resumed run's first video is game 27's.
    run_dir = short_run(one_process, 2)
    checkpoints = os.path.join(run_dir, "checkpoints")
    os.remove(os.path.join(checkpoints, "iteration-0000002.pt"))
    path = os.path.join(checkpoints, "iteration-0000001.pt")
    torch.save(dict(torch.load(path, weights_only=True), env0_games=27), path)
    sizes = dict(num_envs=1, num_steps=32, num_minibatches=2, update_epochs=1, total_timesteps=64)
    one_process.main(multigpu.Args(**sizes, checkpoint_every=1, resume="auto", capture_video=True))
    videos = sorted(os.listdir(os.path.join("videos", os.path.basename(run_dir))))
    assert videos == ["game-27.mp4"]


# ---------------------------------------------------------------------------------------------
# Teardown: the process group ends in destroy_process_group, not at interpreter exit
# ---------------------------------------------------------------------------------------------
THREADS_AFTER_DESTROY = """
import os
import torch.distributed as dist
import cleanrl.ppo_atari_multigpu as multigpu
multigpu.main(multigpu.Args(local_num_envs=1, num_steps=2, num_minibatches=1, update_epochs=1, total_timesteps=2))
dist.destroy_process_group()
print("threads:", sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")))
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="thread names from Linux's /proc")
def test_destroy_process_group_stops_the_gloo_threads_before_the_interpreter_exits(tmp_path):
    # A gloo thread still running when the interpreter finalizes may drop a collective's tensors then,
    # take the GIL and abort the process (SIGABRT, seen under load at the end of a run).
    env = {key: value for key, value in os.environ.items() if key not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    result = subprocess.run(
        [sys.executable, "-c", THREADS_AFTER_DESTROY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, **ONE_THREAD, "PYTHONPATH": REPO_ROOT},
    )
    assert result.returncode == 0, result.stderr
    (threads,) = re.findall(r"^threads: (.*)$", result.stdout, re.M)
    assert "gloo" not in threads, threads


def test_short_two_process_runs_under_cpu_load_exit_cleanly(tmp_path):
    # The run of the SIGABRT, shortened, twice, with every core kept busy meanwhile (the
    # deterministic check of its cause is the test above; the busy loops slow every test beside this one).
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)]
    try:
        for attempt in range(2):
            (tmp_path / str(attempt)).mkdir()
            result = torchrun(
                TWO_PROCESSES,
                "--local-num-envs",
                "1",
                "--num-steps",
                "16",
                "--total-timesteps",
                "32",
                "--update-epochs",
                "1",
                cwd=tmp_path / str(attempt),
                timeout=100,
            )
            assert result.returncode == 0, result.stdout + result.stderr
            assert "finished 1 iterations, 32 steps" in result.stdout
    finally:
        for process in busy:
            process.kill()
            process.wait()


# ---------------------------------------------------------------------------------------------
# CleanRL's command lines
# ---------------------------------------------------------------------------------------------
# The flags of CleanRL's ppo_atari_multigpu.py with their defaults (its Args). `backend` (gloo
# there, auto here) and `device_ids` ([] there, unset here) differ: docs/ppo_atari_multigpu.md says why.
CLEANRL_DEFAULTS = {
    "exp_name": "ppo_atari_multigpu",
    "seed": 1,
    "torch_deterministic": True,
    "cuda": True,
    "track": False,
    "wandb_project_name": "cleanRL",
    "wandb_entity": None,
    "capture_video": False,
    "env_id": "BreakoutNoFrameskip-v4",
    "total_timesteps": 10_000_000,
    "learning_rate": 2.5e-4,
    "local_num_envs": 8,
    "num_steps": 128,
    "anneal_lr": True,
    "gamma": 0.99,
    "gae_lambda": 0.95,
    "num_minibatches": 4,
    "update_epochs": 4,
    "norm_adv": True,
    "clip_coef": 0.1,
    "clip_vloss": True,
    "ent_coef": 0.01,
    "vf_coef": 0.5,
    "max_grad_norm": 0.5,
    "target_kl": None,
}


def test_cleanrl_flags_have_cleanrl_defaults():
    args = multigpu.Args()
    assert {name: getattr(args, name) for name in CLEANRL_DEFAULTS} == CLEANRL_DEFAULTS


def test_help_lists_every_cleanrl_flag(tmp_path):
    result = run_script(SCRIPT, "--help", cwd=tmp_path, timeout=120)
    flags = set(re.findall(r"--[a-z][a-z-]*", result.stdout))
    expected = {"--" + name.replace("_", "-") for name in [*CLEANRL_DEFAULTS, "backend", "device_ids", "num_envs"]}
    assert expected - flags == set()


def test_flags_that_differ_from_cleanrl_are_documented():
    page = open(os.path.join(REPO_ROOT, "docs", "ppo_atari_multigpu.md")).read()
    section = page.split("## CleanRL's command lines")[1].split("\n## ")[0]
    for flag in ["--backend", "--device-ids", "--num-envs", "--capture-video", "--seed", "--target-kl"]:
        assert f"`{flag}" in section, flag


def test_cleanrl_invocation_runs(tmp_path):
    # CleanRL's benchmark command for this script, scaled down to one short iteration.
    result = torchrun(
        ["--standalone", "--nnodes=1", "--nproc_per_node=2"],
        "--local-num-envs",
        "2",
        "--track",
        "--capture_video",
        "--env-id",
        "BreakoutNoFrameskip-v4",
        "--backend",
        "gloo",
        "--num-steps",
        "32",
        "--num-minibatches",
        "2",
        "--update-epochs",
        "1",
        "--total-timesteps",
        "128",
        cwd=tmp_path,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (
        "world size 2: 4 envs (2 per process)" in result.stdout and "finished 1 iterations, 128 steps" in result.stdout
    )
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*")), os.listdir(tmp_path)
    assert glob.glob(str(tmp_path / "videos" / "*" / "game-0.mp4"))
