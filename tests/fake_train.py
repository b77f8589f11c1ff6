"""A stand-in for a training script in the runner's tests: prints the scripts' progress and summary
lines (the format of the scripts' Progress block) for a few fake iterations, then exits. It never trains."""

import argparse
import os
import subprocess
import sys
import time

parser = argparse.ArgumentParser()
parser.add_argument("--env-id", required=True)
parser.add_argument("--seed", type=int, required=True)
parser.add_argument("--iterations", type=int, default=3)
parser.add_argument("--sleep", type=float, default=0.0, help="seconds per iteration")
parser.add_argument("--fail-seeds", type=int, nargs="*", default=[], help="exit 1 after training with these seeds")
parser.add_argument("--pid-dir", help="write this process's pid (and its helper's) to files there")
parser.add_argument(
    "--spawn-helper",
    action="store_true",
    help="start a sleeping child in a session of its own, as torchrun starts its workers",
)
parser.add_argument("--ignore-sigint", action="store_true", help="a run stuck in native code")
parser.add_argument(
    "--tensorboard",
    action="store_true",
    help="make the run's directory as the scripts do, runs/{env_id}__fake_train__{seed}__{time}",
)
parser.add_argument("--resume", help="accepted as the scripts accept it; a fake run has nothing to resume")
args = parser.parse_args()

if args.ignore_sigint:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
print(f"env {args.env_id} seed {args.seed} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
if args.tensorboard:
    os.makedirs(f"runs/{args.env_id.replace('/', '_')}__fake_train__{args.seed}__{time.time_ns()}")
if args.pid_dir:
    with open(os.path.join(args.pid_dir, f"{os.getpid()}.pid"), "w") as f:
        f.write("run")
    if args.spawn_helper:
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        with open(os.path.join(args.pid_dir, f"{helper.pid}.pid"), "w") as f:
            f.write("helper")

total = 1000 * args.iterations
for iteration in range(1, args.iterations + 1):
    time.sleep(args.sleep)
    steps, sps, recent = 1000 * iteration, 100 * args.seed + iteration, f"{args.seed + iteration / 10:.2f}"
    print(
        f"{steps:,}/{total:,} steps | {sps:,} SPS | return (last {iteration}) {recent} | ETA 0:00:01",
        file=sys.stderr,
        flush=True,
    )
print(
    f"finished {args.iterations} iterations, {total} steps, {sps} SPS, mean return of the last "
    f"{args.iterations} games {recent}",
    flush=True,
)
sys.exit(1 if args.seed in args.fail_seeds else 0)
