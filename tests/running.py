"""How the tests run scripts and tools, stop them, and read what they wrote: processes, ports, run folders,
TensorBoard scalars, and the one-line user errors."""

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# A stand-in training script that prints the scripts' progress lines (for the benchmark tools' tests).
FAKE_TRAIN = os.path.join(REPO_ROOT, "tests", "fake_train.py")


def subprocess_environment(env: dict | None = None) -> dict:
    return {**os.environ, "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1", **(env or {})}


def run_script(script: str, *args: str, cwd, env: dict | None = None, timeout: int = 600, launcher=None):
    """Runs `cleanrl/{script}` with args in `cwd`; returns the CompletedProcess (text output)."""
    command = (launcher or [sys.executable]) + [os.path.join(REPO_ROOT, "cleanrl", script), *args]
    return subprocess.run(
        command, cwd=cwd, env=subprocess_environment(env), capture_output=True, text=True, timeout=timeout
    )


def run_tracked(script: str, *args: str, cwd, env: dict | None = None, timeout: int = 600):
    """A run of `cleanrl/{script}` with args and --track in `cwd`, its offline wandb run there too
    (WANDB_DIR): it exits 0. Returns the CompletedProcess."""
    result = run_script(script, *args, "--track", cwd=cwd, env={**(env or {}), "WANDB_DIR": str(cwd)}, timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result


def run_tool(tool: str, *args: str, cwd, env: dict | None = None, timeout: int = 120):
    """Runs `benchmark/{tool}` with args in `cwd`; returns the CompletedProcess (text output)."""
    command = [sys.executable, os.path.join(REPO_ROOT, "benchmark", tool), *args]
    return subprocess.run(
        command, cwd=cwd, env=subprocess_environment(env), capture_output=True, text=True, timeout=timeout
    )


def is_alive(pid: int) -> bool:
    """Whether a process exists and is not a zombie (a zombie has exited and only waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen):
    """Ends a torchrun launch. torchrun starts its workers in sessions of their own, out of reach of a
    kill of torchrun alone; on SIGTERM it stops them itself. SIGKILL if that does not do it."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_all(launches: list[tuple[subprocess.Popen, object]], timeout: int) -> list[tuple[str, int, object]]:
    """Waits for processes started together (each with its folder); returns (output, exit code,
    folder) of each. Whatever happens, none is left running."""
    outputs = []
    try:
        for process, cwd in launches:
            outputs.append((process.communicate(timeout=timeout)[0], process.returncode, cwd))
    finally:
        for process, _ in launches:
            stop(process)
    return outputs


def rank_lines(output: str, pattern: str) -> dict[int, re.Match]:
    """The matches of a per-rank message `rank R...` in a run's output, by rank."""
    return {int(m["rank"]): m for m in re.finditer(pattern, output)}


def run_dirs(cwd) -> list[str]:
    return sorted(glob.glob(os.path.join(str(cwd), "runs", "*")))


def read_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """All scalars of a TensorBoard run directory: {tag: [(step, value), ...]}."""
    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0, "tensors": 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)] for tag in accumulator.Tags()["scalars"]}


def assert_user_error(result, *fragments: str):
    """A user error: non-zero exit, a one-line `error:` message naming the problem, no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error:"), result.stderr
    for fragment in fragments:
        assert fragment in last_line, last_line


def assert_atari_ranges_are_checked(check_args, make_args):
    """An Atari script's check_args rejects, each with a one-line error naming the flag: a --seed whose env
    seeds leave [0, 2**31) (the emulators take 32-bit seeds, numpy no negative one); sticky actions with a
    probability outside [0, 1) (at 1 the agent's actions would never be played); a time limit beyond the
    emulator's 32-bit frame counter; a learning rate or (PPO) gradient norm that is not positive (a negative
    norm flips the gradients); an --exp-name with a '/'. make_args(**overrides): the script's Args as its
    main has them when it calls check_args."""
    assert_main_fails_with(check_args, make_args(seed=-1), "--seed -1: the run's env seeds", "[0, 2**31)")
    assert_main_fails_with(check_args, make_args(seed=2**31 - 4), "--seed 2147483644", "[0, 2**31)")
    for probability in (1.0, -0.25):
        message = f"--repeat-action-probability must lie in [0, 1), got {probability}"
        assert_main_fails_with(check_args, make_args(repeat_action_probability=probability), message)
    message = "--max-episode-steps 536,870,912 overflows the emulator's frame counter"
    assert_main_fails_with(check_args, make_args(max_episode_steps=2**29), message)
    assert_main_fails_with(check_args, make_args(learning_rate=-1e-3), "--learning-rate", "must not be negative")
    if "max_grad_norm" in vars(make_args()):
        assert_main_fails_with(check_args, make_args(max_grad_norm=-0.5), "--max-grad-norm must not be negative")
    assert_main_fails_with(check_args, make_args(exp_name="sweep/lr"), "--exp-name 'sweep/lr' must be a name")


def assert_ppo_ranges_are_checked(check_args, make_args):
    """A PPO script's check_args rejects, each with a one-line error naming the flag and its value: a negative
    --clip-coef (torch.clamp with min > max would clamp every ratio to one bound), --vf-coef (the critic would
    climb its loss) or --target-kl (the KL estimate is never negative: every update would stop after its first
    epoch); a --gamma or --gae-lambda outside [0, 1]. make_args(**overrides): the script's Args."""
    for overrides, message in [
        (dict(clip_coef=-0.1), "--clip-coef must not be negative, got -0.1"),
        (dict(vf_coef=-0.5), "--vf-coef must not be negative, got -0.5"),
        (dict(target_kl=-0.01), "--target-kl must not be negative, got -0.01"),
        (dict(gamma=1.01), "--gamma and --gae-lambda must lie in [0, 1], got 1.01, 0.95"),
        (dict(gae_lambda=-0.1), "--gamma and --gae-lambda must lie in [0, 1], got 0.99, -0.1"),
    ]:
        assert_main_fails_with(check_args, make_args(**overrides), message)


def assert_main_fails_with(main, args, *fragments: str):
    """main(args), called in this process, stops with a one-line `error: ...` message naming the
    problem (what `fail()` gives the shell as stderr and exit status 1). Cheaper than a subprocess
    per case; `assert_user_error` checks the whole path once per script."""
    import pytest

    with pytest.raises(SystemExit) as exit_info:
        main(args)
    message = exit_info.value.code
    assert isinstance(message, str) and message.startswith("error:") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message


def copy_of_tool(folder, tool: str, scripts: dict[str, dict]) -> str:
    """A copy of the repository's `benchmark/{tool}` (with the tools it imports) in `folder`/repo, whose
    cleanrl/ holds tests/fake_sps.py under each name of `scripts`, with its settings (see fake_sps.py). The
    tool finds its scripts next to itself, so it runs the stand-ins unchanged. Returns the copy's path."""
    repo = os.path.join(folder, "repo")
    os.makedirs(os.path.join(repo, "benchmark"))
    for name in (tool, "events.py", "run.py", "ppo_update.py"):
        shutil.copy(os.path.join(REPO_ROOT, "benchmark", name), os.path.join(repo, "benchmark", name))
    fake_sps_scripts(repo, scripts)
    return os.path.join(repo, "benchmark", tool)


def fake_sps_scripts(root, scripts: dict[str, dict]):
    """tests/fake_sps.py as root/cleanrl/{name}.py for each name of `scripts`, each in a folder of its own
    (root/cleanrl/{name}.py is a link to it) so that each keeps its own settings and calls."""
    os.makedirs(os.path.join(root, "cleanrl"), exist_ok=True)
    for name, settings in scripts.items():
        own = os.path.join(root, "fakes", name)
        os.makedirs(own)
        shutil.copy(os.path.join(REPO_ROOT, "tests", "fake_sps.py"), os.path.join(own, "fake_sps.py"))
        with open(os.path.join(own, "sps.json"), "w") as f:
            json.dump(settings, f)
        os.symlink(os.path.join(own, "fake_sps.py"), os.path.join(root, "cleanrl", f"{name}.py"))


class Output:
    """The merged stdout and stderr of a process, read by a thread as it comes."""

    def __init__(self, process: subprocess.Popen):
        self.lines = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(process.stdout), daemon=True)
        self.reader.start()

    @property
    def text(self) -> str:
        return "".join(self.lines)


def wait_for(condition, processes: list[subprocess.Popen], outputs: list[Output], timeout: float = 120):
    deadline = time.time() + timeout
    while not condition():
        alive = all(process.poll() is None for process in processes)
        assert time.time() < deadline and alive, "\n---\n".join(output.text for output in outputs)
        time.sleep(0.1)
