"""A stand-in for a training script in the speed tools' tests (benchmark/vs_cleanrl.py, benchmark/throughput.py):
it trains nothing and writes charts/SPS events as the scripts do, in runs/fake__{seed}__{call} of its working
folder. Its settings are in sps.json next to it (a test copies it where a tool looks for a script):
  "rates": the steady steps per second of its 1st, 2nd, ... call (past the list: the last one), times --seed;
  "first", "start", "end": its first event's step (wall time 100 s), the step where the steady rate starts
      (reached at a tenth of the rate: start-up) and its last step (three events from "start" on);
  each event's value is half the steady rate, the last one's 0.9 of it (the SPS the scripts log last).
Each call leaves calls/{number} next to it: its arguments and OMP_NUM_THREADS, as JSON."""

import json
import os
import sys

from torch.utils.tensorboard import SummaryWriter

here = os.path.dirname(os.path.realpath(__file__))  # a link to it stands for a script: its own folder
with open(os.path.join(here, "sps.json")) as f:
    settings = json.load(f)
os.makedirs(os.path.join(here, "calls"), exist_ok=True)
call = 0
while True:  # the call's number, claimed atomically: runs of one measurement start at once
    try:
        record = os.open(os.path.join(here, "calls", str(call)), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        break
    except FileExistsError:
        call += 1
os.write(record, json.dumps({"argv": sys.argv[1:], "omp": os.environ.get("OMP_NUM_THREADS")}).encode())
os.close(record)

seed = int(sys.argv[sys.argv.index("--seed") + 1]) if "--seed" in sys.argv else 1
rate = settings["rates"][min(call, len(settings["rates"]) - 1)] * seed
first, start, end = settings["first"], settings["start"], settings["end"]
events = [(first, 100.0)]
if start > first:
    events.append((start, 100.0 + (start - first) / (rate / 10)))
events += [(start + k * (end - start) // 3, events[-1][1] + k * (end - start) / 3 / rate) for k in (1, 2, 3)]
writer = SummaryWriter(os.path.join("runs", f"fake__{seed}__{call}"))
for i, (step, wall_time) in enumerate(events):
    writer.add_scalar("charts/SPS", rate * (0.9 if i == len(events) - 1 else 0.5), step, walltime=wall_time)
writer.close()
