"""What the benchmark tools read from a run's TensorBoard events, with TensorBoard's own reader.

    from benchmark.events import scalars, steady_sps
    sps = steady_sps(scalars("runs/NAME", "charts/SPS"), from_step=5500)

The scripts log `charts/SPS` as steps over the time since their training loop began: the first
iterations' warm-up (oneDNN's first calls, JAX's compilation) and, for the off-policy scripts, a phase of
random actions are in it. The steady rate is taken between two of those events instead: the first one
kept and the last, so that warm-up falls outside it.
"""


def scalars(run_dir: str, tag: str) -> list:
    """Every event of a scalar tag (step, wall_time, value), in the order logged; [] if the run has none."""
    # imported here: TensorBoard takes a second to import, and torchrun workers import the tools that use this
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every event
    accumulator.Reload()
    return accumulator.Scalars(tag) if tag in accumulator.Tags()["scalars"] else []


def steady_sps(events: list, from_step: int = 0, skip: float = 0.0) -> float:
    """Steps per second between the first SPS event at or past `from_step` (and past the `skip` fraction of
    those) and the last one. ValueError if fewer than two events are left."""
    events = [event for event in events if event.step >= from_step]
    if len(events) < 2:
        raise ValueError(f"{len(events)} SPS events at or past step {from_step}, two needed")
    first, last = events[int(skip * (len(events) - 1))], events[-1]
    return (last.step - first.step) / (last.wall_time - first.wall_time)
