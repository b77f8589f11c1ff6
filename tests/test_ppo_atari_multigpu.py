"""Specification of cleanrl/ppo_atari_multigpu.py: the PPO of ppo_atari.py over several processes.

Every multi-process run here is a real `torchrun` launch on CPU (gloo), one thread per process, with a
timeout: a hang fails the test instead of stalling CI.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch
from common import (
    PPO_TAGS, REPO_ROOT, assert_user_error, free_port, rank_lines, read_scalars, run_dirs, run_script, stop,
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
        newlogprob, entropy, newvalue, *(minibatch[k][share] for k in ("logprobs", "advantages", "returns", "values")),
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
    multigpu.average_gradients(agent, world_size)
    results[precision] = [p.grad.clone() for p in agent.parameters()]
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
    process = start(command, folder, {"PYTHONPATH": os.pathsep.join([REPO_ROOT, os.path.join(REPO_ROOT, "tests")])},
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
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
    """torchrun, 2 processes, 12 iterations (2 x 2 envs x 32 steps each), checkpoints every 4, saved model."""
    cwd = tmp_path_factory.mktemp("two_processes")
    result = torchrun(
        TWO_PROCESSES, *SMALL, "--total-timesteps", str(12 * ITERATION), "--checkpoint-every", "4", "--save-model",
        "--eval-episodes", "1", cwd=cwd, timeout=240,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result, cwd


def test_two_processes_run_every_iteration_and_log_every_tag_once_per_iteration(two_process_run):
    result, cwd = two_process_run
    assert "world size 2: 4 envs (2 per process), batch 128 (64 per process), minibatch 64 (32 per process), " \
           "12 iterations" in result.stdout
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
    digests = {rank: m["digest"] for rank, m in rank_lines(result.stdout, r"rank (?P<rank>\d+): played \d+ games, "
                                                             r"parameters sha256 (?P<digest>[0-9a-f]+)").items()}
    assert sorted(digests) == [0, 1]
    assert digests[0] == digests[1]
    # ... and they are the weights rank 0 saved.
    (model_path,) = (cwd / "runs").glob("*/ppo_atari_multigpu.cleanrl_model")
    saved_agent, _ = multigpu.load_model(str(model_path), torch.device("cpu"))
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


def test_only_rank_0_writes_logs_and_evaluates(two_process_run):
    result, cwd = two_process_run
    assert result.stdout.count("finished 12 iterations") == 1
    assert result.stdout.count("eval_episode=") == 1
    (run_dir,) = run_dirs(cwd)
    assert len(list((cwd / "runs").glob("*/events.out.tfevents.*"))) == 1
    checkpoints = sorted(p.name for p in (cwd / "runs").glob("*/checkpoints/*"))
    assert checkpoints == ["iteration-0000008.pt", "iteration-0000012.pt"]  # the newest two


def test_resume_with_another_world_size_resplits_the_batch_and_continues_the_steps(two_process_run, tmp_path):
    _, finished = two_process_run
    shutil.copytree(finished / "runs", tmp_path / "runs")
    (checkpoint,) = (tmp_path / "runs").glob("*/checkpoints/iteration-0000008.pt")
    # One process resumes the 2-process run from iteration 8: the same 4 envs, all in one process.
    result = run_script(
        SCRIPT, *SMALL, "--total-timesteps", str(12 * ITERATION), "--resume", str(checkpoint),
        cwd=tmp_path, timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert "the run's 4 environments (on 2 processes before) are split over 1 processes: 4 per process" in result.stdout
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
@pytest.fixture(scope="module")
def two_node_bf16_run(tmp_path_factory):
    """Two torchrun launches of one process each, --nnodes=2 with a static master on 127.0.0.1, each in a
    folder of its own as on separate machines; bf16 autocast; --target-kl (an all-reduced KL) on."""
    port = free_port()
    launches = []
    for node_rank in (0, 1):
        cwd = tmp_path_factory.mktemp(f"node{node_rank}")
        command = [TORCHRUN, "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}", "--master-addr=127.0.0.1",
                   f"--master-port={port}", os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *SMALL,
                   "--total-timesteps", str(3 * ITERATION), "--mixed-precision", "bf16", "--target-kl", "0.0"]
        launches.append((start(command, cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT), cwd))
    outputs = []
    try:
        for process, cwd in launches:
            outputs.append((process.communicate(timeout=180)[0], process.returncode, cwd))
    finally:
        for process, _ in launches:
            stop(process)
    return outputs


def test_two_nodes_of_one_process_train_as_one_job(two_node_bf16_run):
    (output0, rc0, cwd0), (output1, rc1, cwd1) = two_node_bf16_run
    assert rc0 == 0 and rc1 == 0, output0 + output1
    assert "world size 2: 4 envs" in output0 and "finished 3 iterations, 384 steps" in output0
    assert "rank 1/2" in output1 and "finished" not in output1
    digests = re.findall(r"parameters sha256 ([0-9a-f]+)", output0 + output1)
    assert len(digests) == 2 and digests[0] == digests[1]
    assert not (cwd1 / "runs").exists()  # node 1 writes nothing: the logs are rank 0's
    scalars = read_scalars(run_dirs(cwd0)[0])
    assert steps(scalars, "charts/SPS") == [ITERATION, 2 * ITERATION, 3 * ITERATION]


def test_bf16_run_gives_finite_losses(two_node_bf16_run):
    (_, rc0, cwd0), _ = two_node_bf16_run
    assert rc0 == 0
    scalars = read_scalars(run_dirs(cwd0)[0])
    for tag in ["losses/value_loss", "losses/policy_loss", "losses/approx_kl"]:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag


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
    command = [
        TORCHRUN, *launch, "--max-restarts", "1", "--monitor-interval", "0.5",
        os.path.join(REPO_ROOT, "cleanrl", SCRIPT), *SMALL, "--total-timesteps", str(12 * ITERATION),
        "--checkpoint-every", "2", "--resume", "auto",
    ]
    process = start(command, tmp_path, env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = []
    reader = threading.Thread(target=lambda: output.extend(process.stdout), daemon=True)
    reader.start()
    try:
        # Once the first checkpoint is written, kill -9 rank 1, whose pid the run printed.
        deadline = time.time() + 120
        while "checkpoint runs/" not in "".join(output):
            assert time.time() < deadline and process.poll() is None, "".join(output)
            time.sleep(0.05)
        victim = int(re.search(r"rank 1/2: pid (\d+)", "".join(output))[1])
        os.kill(victim, signal.SIGKILL)
        process.wait(timeout=180)
    finally:
        stop(process)
        reader.join(timeout=10)
    text = "".join(output)
    assert process.returncode == 0, text
    assert f"(pid: {victim})" in text  # torchrun saw the killed worker ...
    assert re.search(r"resuming \S+ from \S+iteration-\d+\.pt", text)  # ... and the restarted workers resumed
    pids = re.findall(r"rank 1/2: pid (\d+)", text)
    assert len(pids) == 2 and pids[0] != pids[1]
    assert "finished 12 iterations, 1536 steps" in text
    (run_dir,) = run_dirs(tmp_path)
    scalars = read_scalars(run_dir)
    for tag in PPO_TAGS[2:] + ["charts/world_size"]:
        assert steps(scalars, tag) == [ITERATION * i for i in range(1, 13)], tag
    np.testing.assert_allclose([v for _, v in scalars["charts/learning_rate"]], annealed_lr(12), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# Bad input: a one-line error, every process exits non-zero, nothing hangs
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "args, message",
    [
        (["--local-num-envs", "3", "--num-steps", "5", "--num-minibatches", "4"], "not divisible"),
        (["--backend", "mpi"], "unknown backend 'mpi'"),
        (["--resume", "missing.pt"], "no such checkpoint file"),
        (["--total-timesteps", "100"], "smaller than one batch"),
        (["--local-num-envs", "1", "--num-steps", "4", "--num-minibatches", "4"], "cannot normalize advantages"),
        (["--update-epochs", "0"], "must be positive"),
    ],
)
def test_bad_input_is_a_one_line_error(tmp_path, args, message):
    assert_user_error(run_script(SCRIPT, *args, cwd=tmp_path, timeout=120), message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_nccl_without_gpu_is_a_one_line_error(tmp_path):
    assert_user_error(run_script(SCRIPT, "--backend", "nccl", cwd=tmp_path, timeout=120), "needs a GPU")


def test_resuming_from_a_saved_model_instead_of_a_checkpoint_is_a_one_line_error(tmp_path):
    path = str(tmp_path / "agent.cleanrl_model")
    multigpu.save_model(path, multigpu.Agent(4), multigpu.Args())
    assert_user_error(run_script(SCRIPT, "--resume", path, cwd=tmp_path, timeout=120), "not a readable")


def write_checkpoint(folder, **saved_args) -> str:
    """A checkpoint of a run of one process with the given arguments."""
    args = multigpu.Args(**saved_args)
    args.world_size = 1
    multigpu.derive_sizes(args)
    agent = multigpu.Agent(4)
    optimizer = torch.optim.Adam(agent.parameters())
    rng_states = [multigpu.rng_state(torch.device("cpu"))]
    return multigpu.save_checkpoint(str(folder), agent, optimizer, 1, args.batch_size, rng_states, args, "old_run")


def test_resuming_with_other_hyperparameters_is_a_one_line_error(tmp_path):
    path = write_checkpoint(tmp_path, local_num_envs=2, num_steps=32)
    result = run_script(
        SCRIPT, "--local-num-envs", "2", "--num-steps", "64", "--resume", path, cwd=tmp_path, timeout=120
    )
    assert_user_error(result, "num_steps=32", "resume with the run's arguments")


def test_bad_input_under_torchrun_stops_every_process_with_one_error_line(tmp_path):
    result = torchrun(
        TWO_PROCESSES, "--local-num-envs", "3", "--num-steps", "5", "--num-minibatches", "4", cwd=tmp_path, timeout=120
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert len(re.findall(r"^error: ", output, re.MULTILINE)) == 1, output
    assert "not divisible" in output
    assert f'{SCRIPT}", line' not in output, "a traceback through the script"


def test_a_world_size_that_cannot_split_the_run_stops_every_process_with_one_error_line(tmp_path):
    path = write_checkpoint(tmp_path, local_num_envs=3, num_steps=32, num_minibatches=2)
    result = torchrun(
        TWO_PROCESSES, "--local-num-envs", "3", "--num-steps", "32", "--num-minibatches", "2", "--resume", path,
        cwd=tmp_path, timeout=120,
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert len(re.findall(r"^error: ", output, re.MULTILINE)) == 1, output
    assert "3 environments cannot be split over 2 processes" in output
