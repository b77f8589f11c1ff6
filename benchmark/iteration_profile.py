"""Where the time of a PPO Atari iteration goes: the phases of the script's own run, fp32 and bf16 side by side.

The script runs as it is: imported from its file, its `main(Args)` called with its defaults and the
arguments given here, in a fresh process for each precision. This tool only times calls from outside,
with wrappers around public functions and methods (none of the script's lines changes):
  env step          - `step` of the environments `make_envs` returns (the C++ emulators and preprocessing)
  rollout forwards  - `Agent.get_action_and_value` / `get_value` under inference mode (the actions, the
                      truncation bootstraps and the last value of the rollout)
  GAE               - `compute_gae`
  update forwards   - `Agent.get_action_and_value` with gradients (the update's minibatches)
  loss              - `ppo_loss`
  backward          - `Tensor.backward`
  gradient clip     - `torch.nn.utils.clip_grad_norm_`
  optimizer         - `Optimizer.step` (torch's global step hooks)
  logging           - `SummaryWriter.add_scalar`
  other             - the rest of the iteration's wall time: the Python loop, storage copies, numpy work.
An iteration ends at the script's per-iteration `Progress.show` call; the first iteration (warm-up:
oneDNN picks and compiles its kernels there) is left out, the table shows the mean of the others.
`--ops` adds torch.profiler's table of the operators by self time over the measured iterations (casts,
layout reorders, each convolution's forward and backward); `--onednn` runs the script with
ONEDNN_VERBOSE=1 and sums oneDNN's primitives by implementation and problem (each layer at each batch
size): on a CPU with AMX, `brg_conv_*:..._amx` shows a convolution on AMX tiles, anything else one that
is not. `--ceiling` sets the network phases
against this CPU's peak: their FLOPs per iteration (torch's FlopCounterMode on the script's own Agent, times
the samples each phase ran), the rate each ran at, and the rate of a 2048 x 2048 matmul in the same precision
and thread count; then the fastest iteration that peak allows, the rest of the iteration as measured. CPU
only (GPU work is asynchronous).

    python benchmark/iteration_profile.py                                   # ppo_atari.py, fp32 and bf16
    python benchmark/iteration_profile.py --precisions bf16 --ops --script cleanrl/ppo_atari_envpool.py
    python benchmark/iteration_profile.py --onednn --iterations 2 -- --num-envs 8
    python benchmark/iteration_profile.py --ceiling                         # how far bf16 can go on this CPU
"""

import argparse
import collections
import copy
import functools
import importlib.util
import inspect
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO_ROOT)
from benchmark.run import cpu_model  # noqa: E402  (the runner's logs name the CPU alike)

SCRIPTS = ("ppo_atari.py", "ppo_atari_envpool.py", "ppo_atari_multigpu.py")  # the multigpu one as a job of one process
PHASES = (
    "env step",
    "rollout forwards",
    "GAE",
    "update forwards",
    "loss",
    "backward",
    "gradient clip",
    "optimizer",
    "logging",
)
NETWORK_PHASES = ("rollout forwards", "update forwards", "backward")  # the ones --ceiling sets against the peak
PEAK_SIZE = 2048  # the square matmul that stands for this CPU's peak rate


def precision_name(precision: str) -> str:
    return "fp32" if precision == "none" else precision


# ---------------------------------------------------------------------------------------------
# The child: one run of the script, timed from outside
# ---------------------------------------------------------------------------------------------
def profile_run(
    script: str, precision: str, iterations: int, extra: list[str], with_ops: bool, with_flops: bool
) -> dict:
    import torch
    import tyro
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
    from torch.utils.tensorboard import SummaryWriter

    spec = importlib.util.spec_from_file_location("profiled_script", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = tyro.cli(module.Args, args=["--mixed-precision", precision, *extra])
    batch = args.num_envs * args.num_steps if hasattr(args, "num_envs") and args.num_envs else None
    if batch is None:  # the torchrun script, run as a job of one process
        batch = args.local_num_envs * args.num_steps
    args.total_timesteps = (iterations + 1) * batch

    seconds = collections.Counter()

    def timed(phase_of_call, function):
        @functools.wraps(function)
        def wrapper(*a, **kw):
            start = time.perf_counter()
            try:
                return function(*a, **kw)
            finally:
                seconds[phase_of_call() if callable(phase_of_call) else phase_of_call] += time.perf_counter() - start

        return wrapper

    def forward_phase():
        return "rollout forwards" if torch.is_inference_mode_enabled() else "update forwards"

    make_envs = module.make_envs

    def make_timed_envs(*a, **kw):
        envs = make_envs(*a, **kw)
        envs.step = timed("env step", envs.step)
        return envs

    # The forwards also count their samples, by phase and method, and keep the agent and an observation's
    # shape: --ceiling's FLOP count is FLOPs per sample (counted after the run) times samples.
    samples = collections.Counter()
    seen = {}

    def counted(method):
        @functools.wraps(method)
        def wrapper(agent, obs, *a, **kw):
            samples[f"{forward_phase()}/{method.__name__}"] += len(obs)
            if forward_phase() == "update forwards":  # the trained agent, not the rollout's bf16 copy
                seen.update(agent=agent, obs_shape=tuple(obs.shape[1:]), obs_dtype=obs.dtype)
            return method(agent, obs, *a, **kw)

        return wrapper

    module.make_envs = make_timed_envs
    module.Agent.get_action_and_value = counted(timed(forward_phase, module.Agent.get_action_and_value))
    module.Agent.get_value = counted(timed(forward_phase, module.Agent.get_value))
    module.compute_gae = timed("GAE", module.compute_gae)
    module.ppo_loss = timed("loss", module.ppo_loss)
    torch.Tensor.backward = timed("backward", torch.Tensor.backward)
    torch.nn.utils.clip_grad_norm_ = timed("gradient clip", torch.nn.utils.clip_grad_norm_)
    SummaryWriter.add_scalar = timed("logging", SummaryWriter.add_scalar)
    optimizer_start = []
    register_optimizer_step_pre_hook(lambda *_: optimizer_start.append(time.perf_counter()))
    register_optimizer_step_post_hook(
        lambda *_: seconds.update({"optimizer": time.perf_counter() - optimizer_start.pop()})
    )

    # The iteration boundaries: the script calls Progress.show once at the end of every iteration.
    boundaries = []  # (wall time, phase seconds so far, forward samples so far)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) if with_ops else None
    show = module.Progress.show

    def show_and_mark(self, *a, **kw):
        show(self, *a, **kw)
        boundaries.append((time.perf_counter(), dict(seconds), dict(samples)))
        if profiler is not None and len(boundaries) == 1:
            profiler.start()  # from the end of the warm-up iteration on

    module.Progress.show = show_and_mark
    workdir = tempfile.mkdtemp(prefix="iteration-profile-")
    os.chdir(workdir)  # the run's runs/ folder goes there
    module.main(args)
    if profiler is not None:
        profiler.stop()

    (first_wall, first, first_samples), (last_wall, last, last_samples) = boundaries[0], boundaries[-1]
    measured = len(boundaries) - 1
    phases = {phase: (last.get(phase, 0.0) - first.get(phase, 0.0)) / measured for phase in PHASES}
    result = dict(
        precision=precision,
        iterations=measured,
        batch=batch,
        wall=(last_wall - first_wall) / measured,
        phases=phases,
        threads=torch.get_num_threads(),
        torch=torch.__version__,
    )
    if profiler is not None:
        events = sorted(profiler.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        result["ops"] = [(e.key, e.count / measured, e.self_cpu_time_total / 1e3 / measured) for e in events[:25]]
    if with_flops:
        per_sample = flops_per_sample(seen["agent"], seen["obs_shape"], seen["obs_dtype"])
        flops = collections.Counter()
        for key, count in last_samples.items():
            phase, method = key.split("/")
            flops[phase] += (count - first_samples.get(key, 0)) / measured * per_sample[method]
            if phase == "update forwards":  # every update forward has its backward
                flops["backward"] += (count - first_samples.get(key, 0)) / measured * per_sample["backward"]
        result["flops"] = {phase: flops[phase] for phase in NETWORK_PHASES}
    return result


def flops_per_sample(agent, obs_shape: tuple, obs_dtype) -> dict[str, float]:
    """FLOPs of one sample through each forward method of the agent, and through the update's backward
    (a loss of all three outputs, as the PPO loss has), counted by torch's FlopCounterMode in fp32 outside
    autocast: precision does not change the count. On a copy of the agent: its gradients stay as they were."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    agent = copy.deepcopy(agent)
    batch = 8
    obs = torch.zeros((batch, *obs_shape), dtype=obs_dtype)
    method = {name: inspect.unwrap(getattr(type(agent), name)) for name in ("get_action_and_value", "get_value")}
    counts = {}
    for name, forward in method.items():
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            forward(agent, obs)
        counts[name] = counter.get_total_flops() / batch
    with FlopCounterMode(display=False) as counter:
        _, logprob, entropy, value = method["get_action_and_value"](agent, obs)
        (logprob.sum() + entropy.sum() + value.sum()).backward()
    counts["backward"] = counter.get_total_flops() / batch - counts["get_action_and_value"]
    return counts


# ---------------------------------------------------------------------------------------------
# oneDNN's own account: which implementation ran each primitive, and for how long
# ---------------------------------------------------------------------------------------------
def onednn_summary(log: str, iterations: int) -> list[tuple[str, str, str, str, float, float]]:
    """(primitive, implementation, propagation, problem, calls, ms) per iteration of the whole run (warm-up
    included: the verbose log has no iteration marks), from ONEDNN_VERBOSE=1 lines
    `onednn_verbose,[...,]primitive,exec,cpu,KIND,IMPLEMENTATION,PROPAGATION,...,PROBLEM,MS`. The problem
    tells the layers apart (a convolution's `mb256_ic4oc32_ih84oh20kh8sh4...`, cut before its widths, which
    repeat its heights here): each layer's forward, data and weight gradients, at the rollout's batch and
    the update's."""
    totals = collections.defaultdict(lambda: [0, 0.0])
    for line in log.splitlines():
        fields = line.split(",")
        if not line.startswith("onednn_verbose") or "exec" not in fields:
            continue
        at = fields.index("exec")
        try:
            kind, implementation, propagation, ms = fields[at + 2], fields[at + 3], fields[at + 4], float(fields[-1])
        except (IndexError, ValueError):
            continue
        entry = totals[(kind, implementation, propagation, fields[-2].split("_iw")[0])]
        entry[0] += 1
        entry[1] += ms
    rows = [(*key, calls / iterations, ms / iterations) for key, (calls, ms) in totals.items()]
    return sorted(rows, key=lambda row: row[5], reverse=True)


# ---------------------------------------------------------------------------------------------
# The parent: one fresh process per precision, then the table
# ---------------------------------------------------------------------------------------------
def run_child(options, precision: str) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        out_path = out.name
    command = [sys.executable, os.path.abspath(__file__), "--child-out", out_path, "--precisions", precision]
    command += ["--script", options.script, "--iterations", str(options.iterations)]
    command += ["--ops"] if options.ops else []
    command += ["--ceiling"] if options.ceiling else []
    command += ["--", *options.script_args]
    env = dict(os.environ, ONEDNN_VERBOSE="1") if options.onednn else None
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        last_line = (result.stderr.strip().splitlines() or [""])[-1]
        if last_line.startswith("error:"):  # the script's own one-line user error
            sys.exit(f"{last_line} (in the {precision_name(precision)} run)")
        sys.exit(f"error: the {precision_name(precision)} run failed:\n{result.stderr[-3000:]}")
    with open(out_path) as f:
        profile = json.load(f)
    os.remove(out_path)
    if options.onednn:
        profile["onednn"] = onednn_summary(result.stdout, profile["iterations"] + 1)
    return profile


def print_tables(profiles: list[dict]):
    names = [precision_name(p["precision"]) for p in profiles]
    header = " | ".join(f"{name} ms | {name} share" for name in names)
    ratio = len(profiles) == 2
    print(f"\n| phase | {header} |" + (f" {names[1]} / {names[0]} |" if ratio else ""))
    print("|-" * (1 + 2 * len(profiles) + ratio) + "|")
    rows = [*PHASES, "other"]
    for phase in rows:
        cells, values = [], []
        for p in profiles:
            value = p["phases"][phase] if phase != "other" else p["wall"] - sum(p["phases"].values())
            values.append(value)
            cells.append(f"{value * 1e3:.1f} | {100 * value / p['wall']:.0f}%")
        line = f"| {phase} | {' | '.join(cells)} |"
        print(line + (f" {values[1] / values[0]:.2f} |" if ratio and values[0] > 0 else (" - |" if ratio else "")))
    walls = " | ".join(f"**{p['wall'] * 1e3:.0f}** | 100%" for p in profiles)
    print(f"| iteration | {walls} |" + (f" **{profiles[1]['wall'] / profiles[0]['wall']:.2f}** |" if ratio else ""))
    sps = " | ".join(f"{p['batch'] / p['wall']:.0f} SPS | " for p in profiles)
    print(f"| steps per second | {sps} |" + (f" {profiles[0]['wall'] / profiles[1]['wall']:.2f}x |" if ratio else ""))
    for name, p in zip(names, profiles):
        if "ops" in p:
            print(f"\n{name}: operators by self time, per iteration\n\n| operator | calls | ms |\n|-|-|-|")
            for key, calls, ms in p["ops"]:
                print(f"| `{key}` | {calls:.0f} | {ms:.1f} |")
        if "onednn" in p:
            print(f"\n{name}: oneDNN primitives per iteration (warm-up included)\n")
            print("| primitive | implementation | propagation | problem | calls | ms |\n|-|-|-|-|-|-|")
            for kind, implementation, propagation, problem, calls, ms in p["onednn"][:30]:
                print(f"| {kind} | `{implementation}` | {propagation} | `{problem}` | {calls:.0f} | {ms:.1f} |")


# ---------------------------------------------------------------------------------------------
# The ceiling: the network phases against this CPU's peak rate
# ---------------------------------------------------------------------------------------------
def peak_rate(precision: str, threads: int) -> float:
    """FLOP/s of a PEAK_SIZE x PEAK_SIZE matmul in the precision (bf16 tensors for bf16: what autocast
    runs), the best of 5 after 2 of warm-up, with the thread count the runs had."""
    import torch

    torch.set_num_threads(threads)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    a, b = torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype), torch.randn(PEAK_SIZE, PEAK_SIZE, dtype=dtype)
    times = []
    for _ in range(7):
        start = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - start)
    return 2 * PEAK_SIZE**3 / min(times[2:])


def print_ceiling(profiles: list[dict], peaks: dict[str, float]):
    names = [precision_name(p["precision"]) for p in profiles]
    print(
        f"\nThe network phases against this CPU's peak: GFLOP per iteration (FlopCounterMode), the rate each "
        f"phase ran at, and its share of the peak ({PEAK_SIZE} x {PEAK_SIZE} matmul, same precision and threads)\n"
    )
    print("| phase | GFLOP | " + " | ".join(f"{name} GFLOP/s | {name} of peak" for name in names) + " |")
    print("|-|-|" + "-|-|" * len(profiles))
    for phase in NETWORK_PHASES:
        cells = []
        for p in profiles:
            rate = p["flops"][phase] / p["phases"][phase]
            cells.append(f"{rate / 1e9:.0f} | {100 * rate / peaks[p['precision']]:.0f}%")
        print(f"| {phase} | {profiles[0]['flops'][phase] / 1e9:.1f} | {' | '.join(cells)} |")
    print("| matmul peak | | " + " | ".join(f"{peaks[p['precision']] / 1e9:.0f} | 100%" for p in profiles) + " |")

    # The fastest iteration the peak allows: the network phases at the peak, everything else as measured.
    floors = {}
    for name, p in zip(names, profiles):
        network = sum(p["phases"][phase] for phase in NETWORK_PHASES)
        at_peak = sum(p["flops"].values()) / peaks[p["precision"]]
        rest = p["wall"] - network
        floors[name] = rest + at_peak
        print(
            f"\n{name}: the network phases take {network * 1e3:.0f} ms an iteration, {at_peak * 1e3:.0f} ms at the "
            f"peak; the rest {rest * 1e3:.0f} ms: at least {floors[name] * 1e3:.0f} ms an iteration "
            f"({p['batch'] / floors[name]:.0f} SPS at most)"
        )
    if names == ["fp32", "bf16"]:
        print(
            f"bf16 at the peak: at most {profiles[0]['wall'] / floors['bf16']:.2f}x the measured fp32 iteration "
            f"(now {profiles[0]['wall'] / profiles[1]['wall']:.2f}x); both at the peak: "
            f"{floors['fp32'] / floors['bf16']:.2f}x"
        )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--script", default=os.path.join(REPO_ROOT, "cleanrl", "ppo_atari.py"))
    parser.add_argument("--precisions", nargs="+", choices=["none", "bf16"], default=["none", "bf16"])
    parser.add_argument("--iterations", type=int, default=4, help="measured iterations (after one of warm-up)")
    parser.add_argument("--ops", action="store_true", help="also torch.profiler's operators by self time")
    parser.add_argument("--onednn", action="store_true", help="also oneDNN's primitives by implementation")
    parser.add_argument("--ceiling", action="store_true", help="also the network phases against this CPU's peak")
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("script_args", nargs="*", help="arguments for the script, after --")
    options = parser.parse_args()
    if not os.path.isfile(options.script):
        sys.exit(f"error: no script {options.script!r}")
    if os.path.basename(options.script) not in SCRIPTS:
        sys.exit(f"error: {options.script!r} is not one of the torch PPO Atari scripts: {', '.join(SCRIPTS)}")
    if options.iterations < 1:
        sys.exit("error: --iterations must be positive")
    options.script = os.path.abspath(options.script)

    if options.child_out:  # a fresh process: one precision
        profile = profile_run(
            options.script, options.precisions[0], options.iterations, options.script_args, options.ops, options.ceiling
        )
        with open(options.child_out, "w") as f:
            json.dump(profile, f)
        return

    script = os.path.relpath(options.script, REPO_ROOT)
    print(f"{script} on {cpu_model()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    profiles = []
    for precision in options.precisions:
        profiles.append(run_child(options, precision))
        p = profiles[-1]
        print(
            f"  {precision_name(precision)}: {p['iterations']} iterations of {p['batch']} steps, "
            f"{p['wall'] * 1e3:.0f} ms each, torch {p['torch']}, {p['threads']} threads",
            flush=True,
        )
    print_tables(profiles)
    if options.ceiling:
        print_ceiling(profiles, {p["precision"]: peak_rate(p["precision"], p["threads"]) for p in profiles})


if __name__ == "__main__":
    main()
