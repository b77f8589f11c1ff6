"""What a run shows its user, checked the same way for every script: the logged tags, the progress lines,
the videos."""

import functools
import glob
import io
import os
import re
import subprocess
import sys

import numpy as np
from running import read_scalars, run_dirs, run_script, run_tracked

# Every tag the PPO scripts promise to log.
PPO_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/learning_rate",
    "charts/SPS",
    "losses/value_loss",
    "losses/policy_loss",
    "losses/entropy",
    "losses/old_approx_kl",
    "losses/approx_kl",
    "losses/clipfrac",
    "losses/explained_variance",
]


# Every tag the DQN scripts promise to log.
DQN_TAGS = [
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/epsilon",
    "losses/td_loss",
    "losses/q_values",
]


def assert_warns_when_bf16_is_slow(module, monkeypatch, capsys):
    """A torch Atari script asked for bf16 on a CPU without oneDNN's bf16 kernels warns once on
    stderr (it would run several times slower than fp32); with the kernels, or in fp32, it says nothing."""
    import torch

    cpu = torch.device("cpu")
    for has_bf16_kernels in (False, True):
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: has_bf16_kernels)
        module.warn_if_bf16_is_slow("bf16", cpu)
        assert capsys.readouterr().err.count("warning: this CPU has no fast bf16") == (not has_bf16_kernels)
        module.warn_if_bf16_is_slow("none", cpu)
        assert capsys.readouterr().err == ""


def assert_losses_are_finite(run_dir: str):
    """A PPO run logged finite value, policy and approx-KL losses at every iteration (what bf16 would
    break first: an overflow or a NaN)."""
    scalars = read_scalars(run_dir)
    for tag in ["losses/value_loss", "losses/policy_loss", "losses/approx_kl"]:
        assert all(np.isfinite(value) for _, value in scalars[tag]), tag


def assert_bf16_run_gives_finite_losses(script: str, *args: str, cwd):
    """A run of a PPO Atari script with `args` (2 iterations) under --mixed-precision bf16, in `cwd`: it
    finishes its 2 iterations with finite losses. Returns the CompletedProcess."""
    result = run_script(script, *args, "--mixed-precision", "bf16", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert "finished 2 iterations" in result.stdout
    assert_losses_are_finite(run_dirs(cwd)[0])
    return result


def assert_rollout_acts_with_the_updated_weights(run_dir: str):
    """A bf16 run of one epoch of one minibatch an iteration: the update's forward (autocast on the fp32
    weights) gives back the log-probabilities the rollout stored (a bf16 copy of those weights), so
    approx-KL is nil at every iteration. A copy not refreshed after each update acts with the weights
    of an update before: approx-KL of 1e-4 and more from the second iteration."""
    kls = [value for _, value in read_scalars(run_dir)["losses/approx_kl"]]
    assert len(kls) >= 3 and all(kl < 1e-6 for kl in kls), kls


def assert_freed_memory_is_kept(module):
    """After the script's keep_freed_memory(), a large block freed and allocated again reuses its pages:
    no page faults, where glibc's default maps a fresh block, or trims a freed one off the heap's top, and
    faults in each of its pages again. In a fresh process (the setting is the process's), with malloc
    itself, so that nothing else is allocated between; the last of four 64 MiB blocks, the heap warm."""
    code = f"""
import ctypes, importlib.util, resource, sys
spec = importlib.util.spec_from_file_location("script", {module.__file__!r})
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)
if sys.argv[1] == "kept":
    script.keep_freed_memory()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
size, faults = 64 * 2**20, []
for _ in range(4):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = ctypes.c_void_p(libc.malloc(size))
    ctypes.memset(block, 1, size)
    libc.free(block)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""
    faults = {}
    for setting in ("default", "kept"):
        result = subprocess.run([sys.executable, "-c", code, setting], capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        faults[setting] = int(result.stdout.split()[-1])
    assert faults["default"] > 0 and faults["kept"] <= faults["default"] / 100, faults


def assert_short_atari_run_logged(
    run_dir: str, batch_size: int, iterations: int = 4, tags=PPO_TAGS, loss_tag: str = "losses/value_loss"
):
    """A short Breakout run of an Atari script logged every tag at the end of every iteration,
    annealed the learning rate from 2.5e-4, and logged whole games, each at a step of its own.
    tags: those the script promises; loss_tag: a loss that must be finite at every iteration."""
    scalars = read_scalars(run_dir)
    for tag in tags:
        assert tag in scalars, tag
    assert [step for step, _ in scalars["charts/SPS"]] == [batch_size * (i + 1) for i in range(iterations)]
    assert all(np.isfinite(value) for _, value in scalars[loss_tag])
    np.testing.assert_allclose(
        [v for _, v in scalars["charts/learning_rate"]], [2.5e-4 * (1 - i / iterations) for i in range(iterations)]
    )
    # Whole games of Breakout under random play: a few points, never negative or fractional, and
    # longer than one life.
    returns = [value for _, value in scalars["charts/episodic_return"]]
    lengths = [value for _, value in scalars["charts/episodic_length"]]
    assert returns and all(r >= 0 and r == int(r) for r in returns)
    assert all(length > 50 for length in lengths), "a game spans all five lives"
    steps = [step for step, _ in scalars["charts/episodic_return"]]
    assert len(set(steps)) == len(steps), "every game is logged at a global step of its own"
    return scalars


def mp4_frames(path: str) -> np.ndarray:
    """The frames of an mp4 file: (frames, height, width, 3) uint8."""
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(path)
    width, height = next(reader)["size"]
    return np.stack([np.frombuffer(frame, np.uint8).reshape(height, width, 3) for frame in reader])


def capped_cubic_games(limit: int) -> list[int]:
    """The games that the capped cubic video schedule records, below `limit`."""
    return [k**3 for k in range(10) if k**3 < min(limit, 1000)] + list(range(1000, limit, 1000))


def assert_videos_show_whole_games_of_env_0(cwd, num_envs: int, extra_screens: int):
    """A --capture-video run wrote games 0 and 1 of env 0 (the schedule's first two) as 210x160 RGB
    mp4 files, each with one screen per step of its game plus `extra_screens` (the first screen,
    and whatever screens the env shows on steps that are not counted in the game's length)."""
    lengths = read_scalars(run_dirs(cwd)[0])["charts/episodic_length"]
    # Env 0's games are logged at the global steps 1, 1 + num_envs, ... of each vector step.
    env0_lengths = [int(length) for step, length in lengths if (step - 1) % num_envs == 0]
    videos = sorted(glob.glob(os.path.join(str(cwd), "videos", "*", "game-*.mp4")))
    assert [os.path.basename(v) for v in videos[:2]] == ["game-0.mp4", "game-1.mp4"], videos
    assert env0_lengths, "env 0 finished no game"
    for video, length in zip(videos, env0_lengths):
        frames = mp4_frames(video)
        assert frames.shape[1:] == (210, 160, 3)
        assert frames.std(axis=-1).mean() > 1, "colour frames"
        assert len(frames) == length + extra_screens, video


def assert_game_0_video_logged_as_wandb_media(cwd):
    """A --track --capture-video run of a torch Atari script in `cwd` logged the video of env 0's game 0
    as media of its one offline wandb run."""
    (wandb_run,) = glob.glob(os.path.join(str(cwd), "wandb", "offline-run-*"))
    assert glob.glob(os.path.join(wandb_run, "files", "media", "videos", "**", "game_0_*.mp4"), recursive=True)


def assert_progress_lines_printed(stderr: str, steps: list[str]):
    """Off a terminal a run with `--progress-interval 0` printed a plain progress line at every
    chance, at these `STEP/TOTAL`s (what a longer interval leaves out: assert_progress_follows_the_convention)."""
    lines = [line for line in stderr.splitlines() if " SPS | return (last " in line]
    assert [line.split(" steps")[0] for line in lines] == steps, stderr
    assert all(re.search(r"\| ETA \d+:\d\d:\d\d$", line) for line in lines), lines


def assert_progress_lines_off_a_terminal(script: str, short_run: list[str], steps: list[str], cwd):
    """A run of `script` with `--progress-interval 0` prints a progress line at each of `steps`."""
    result = run_script(script, *short_run, "--progress-interval", "0", cwd=cwd)
    assert result.returncode == 0, result.stderr
    assert_progress_lines_printed(result.stderr, steps)


# The plain progress line of the scripts' Progress block, printed on stderr.
PROGRESS_LINE = re.compile(
    r"^([\d,]+)/([\d,]+) steps \| ([\d,]+) SPS \| return \(last (\d+)\) (\S+) \| ETA \d+:\d\d:\d\d$"
)


def progress_steps(stderr: str) -> list[int]:
    """The global steps of the plain progress lines in a script's stderr. Every line that starts
    like one (`N/M steps | `) must have the whole format, and the recent return is `-` or a number
    with 2 decimals."""
    steps = []
    for line in stderr.splitlines():
        if not re.match(r"^[\d,]+/[\d,]+ steps \| ", line):
            continue
        match = PROGRESS_LINE.match(line)
        assert match, f"malformed progress line: {line!r}"
        assert "\r" not in line
        recent = match.group(5)
        assert recent == "-" or re.fullmatch(r"-?\d+\.\d\d", recent), line
        steps.append(int(match.group(1).replace(",", "")))
    return steps


@functools.cache
def mujoco_offscreen_rendering_error() -> str | None:
    """Why MuJoCo cannot render offscreen here (EGL, as the scripts choose without a display), or
    None when it can. Probed once, in a fresh process, as a script would do it."""
    probe = (
        "import os; os.environ.setdefault('MUJOCO_GL', 'egl'); import gymnasium as gym; "
        "env = gym.make('InvertedPendulum-v5', render_mode='rgb_array'); env.reset(seed=0); "
        "assert env.render().shape[-1] == 3"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    if result.returncode == 0:
        return None
    return (result.stderr.strip().splitlines() or ["unknown error"])[-1]


def assert_progress_follows_the_convention(progress_class, monkeypatch):
    """A script's Progress(total, interval) with show(global_step, sps, recent_returns): plain lines on
    stderr, the same on a terminal and in a log file, at most one per interval but always the first and
    the last (global_step == total)."""
    from collections import deque

    calls = [(1000, 1234, deque()), (2000, 1500, deque([1.0, 2.0])), (3000, 1500, deque([1.0, 2.0, 4.5]))]
    expected = [
        "1,000/3,000 steps | 1,234 SPS | return (last 0) - | ETA 0:00:01",
        "2,000/3,000 steps | 1,500 SPS | return (last 2) 1.50 | ETA 0:00:00",
        "3,000/3,000 steps | 1,500 SPS | return (last 3) 2.50 | ETA 0:00:00",
    ]
    for interval, lines in [(3600.0, [expected[0], expected[2]]), (0.0, expected)]:
        stderr = io.StringIO()
        monkeypatch.setattr(sys, "stderr", stderr)
        progress = progress_class(3000, interval)
        for step, sps, recent in calls:
            progress.show(step, sps, recent)
        monkeypatch.undo()
        assert stderr.getvalue().splitlines() == lines, repr(stderr.getvalue())
    hours = progress_class(10_000_000, 0.0)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    hours.show(1_000_000, 100, deque([-3.0]))
    monkeypatch.undo()
    assert stderr.getvalue() == "1,000,000/10,000,000 steps | 100 SPS | return (last 1) -3.00 | ETA 25:00:00\n"


def assert_progress_line_per_iteration(stderr: str, scalars: dict, batch_size: int, iterations: int):
    """A run with `--progress-interval 0` off a terminal printed one plain progress line per
    iteration, at the end of each, with the mean of the last (up to 20) returns logged by then."""
    lines = [line for line in stderr.splitlines() if " steps | " in line]
    assert len(lines) == iterations, stderr
    games = scalars.get("charts/episodic_return", [])
    for i, line in enumerate(lines):
        match = PROGRESS_LINE.match(line)
        assert match, line
        step, total, _, n, recent = match.groups()[:5]
        assert int(step.replace(",", "")) == batch_size * (i + 1)
        assert int(total.replace(",", "")) == batch_size * iterations
        returns = [value for game_step, value in games if game_step <= batch_size * (i + 1)][-20:]
        assert int(n) == len(returns)
        assert recent == (f"{np.mean(returns):.2f}" if returns else "-")


def run_tracked_on_inverted_pendulum(script: str, *args: str, cwd, env: dict | None = None):
    """A --track run of a MuJoCo script with `args` on InvertedPendulum-v5 (random play falls within a few
    steps: whole episodes are quick to render in software), with --capture-video where MuJoCo can render
    offscreen: the run whose videos assert_episodes_0_1_8_recorded_and_uploaded checks."""
    video = [] if mujoco_offscreen_rendering_error() else ["--capture-video"]
    return run_tracked(script, "--env-id", "InvertedPendulum-v5", *args, *video, cwd=cwd, env=env)


def assert_episodes_0_1_8_recorded_and_uploaded(run_folder):
    """A --capture-video --track run of a gymnasium-env script (RecordVideo's capped cubic
    schedule) recorded env 0's episodes 0, 1 and 8, not 2, and the same files reached the offline
    wandb run."""
    paths = glob.glob(os.path.join(str(run_folder), "videos", "*", "*.mp4"))
    videos = sorted((os.path.basename(v) for v in paths), key=lambda name: int(re.sub(r"\D", "", name)))  # 8 before 27
    assert videos[:3] == ["rl-video-episode-0.mp4", "rl-video-episode-1.mp4", "rl-video-episode-8.mp4"]
    assert "rl-video-episode-2.mp4" not in videos
    assert all(os.path.getsize(v) > 1000 for v in paths)
    uploaded = glob.glob(os.path.join(str(run_folder), "wandb", "offline-run-*", "files", "videos", "*", "*.mp4"))
    assert sorted(os.path.basename(v) for v in uploaded) == sorted(videos)
