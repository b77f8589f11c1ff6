"""A stand-in for a training script in the runner's and the tuner's tests: prints the scripts' progress and
summary lines (the format of the scripts' Progress block) for a few fake iterations of 1,000 steps, then
exits. It never trains. With --score it writes TensorBoard events as the scripts do, in
runs/{env_id}__{exp_name}__{seed}__{time}: a game ends every --game-steps steps, the k-th with the return
score x seed + k (charts/episodic_return), and each iteration logs charts/SPS at its last step. Its --help
lists the types as tyro's does (INT, FLOAT, --flag/--no-flag), so benchmark/tune.py reads them."""

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
    help="make the run's directory as the scripts do, runs/{env_id}__{exp_name}__{seed}__{time}",
)
parser.add_argument("--resume", help="accepted as the scripts accept it; a fake run has nothing to resume")
parser.add_argument(
    "--exp-name", default="fake_train", help="the run directory's experiment name (default: fake_train)"
)
parser.add_argument(
    "--total-timesteps", type=int, metavar="INT", help="the run's steps, in place of --iterations (default: None)"
)
parser.add_argument("--score", type=float, metavar="FLOAT", help="write the games' returns, see above (default: None)")
parser.add_argument("--game-steps", type=int, metavar="INT", default=250, help="steps of a game (default: 250)")
parser.add_argument("--eval-sleep", type=float, metavar="FLOAT", default=0.0, help="seconds after the last step")
parser.add_argument("--kill-self", action="store_true", help="SIGKILL itself at the end, as the OOM killer would")
# Flags that change nothing, for the tuner's tests to tune: an int, a float, a boolean, as the scripts have.
parser.add_argument("--num-minibatches", type=int, metavar="INT", default=4, help="ignored (default: 4)")
parser.add_argument("--learning-rate", type=float, metavar="FLOAT", default=0.001, help="ignored (default: 0.001)")
parser.add_argument("--norm-adv", action=argparse.BooleanOptionalAction, default=True, help="ignored (default: True)")
args = parser.parse_args()
if args.total_timesteps is not None:
    args.iterations = args.total_timesteps // 1000

if args.ignore_sigint:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
print(f"env {args.env_id} seed {args.seed} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}", flush=True)
if args.tensorboard or args.score is not None:
    run_dir = f"runs/{args.env_id.replace('/', '_')}__{args.exp_name}__{args.seed}__{time.time_ns()}"
    os.makedirs(run_dir)
if args.score is not None:
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(run_dir)

    def scalar(tag: str, value: float, step: int):
        summary = Summary(value=[Summary.Value(tag=tag, simple_value=value)])
        writer.add_event(Event(wall_time=time.time(), step=step, summary=summary))


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
    if args.score is not None:
        first = (steps - 1000) // args.game_steps * args.game_steps + args.game_steps  # the first game it ends
        for end in range(first, steps + 1, args.game_steps):
            scalar("charts/episodic_return", args.score * args.seed + end // args.game_steps, end)
        scalar("charts/SPS", sps, steps)
        writer.flush()
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
if args.score is not None:
    writer.close()
time.sleep(args.eval_sleep)
if args.kill_self:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(1 if args.seed in args.fail_seeds else 0)
