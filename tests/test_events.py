"""benchmark/events.py: the scalars of a run's events, and the steady SPS the benchmark tools report."""

import pytest
from torch.utils.tensorboard import SummaryWriter

from benchmark.events import scalars, steady_sps


def write_sps_events(run_dir, steps_and_times):
    writer = SummaryWriter(run_dir)
    for step, wall_time in steps_and_times:
        writer.add_scalar("charts/SPS", step / max(wall_time, 1.0), step, walltime=wall_time)
    writer.close()


def test_steady_sps_counts_steps_per_second_between_events_past_the_start(tmp_path):
    # 100 steps/s before step 1,000 (start-up, random actions), 50 steps/s after it
    write_sps_events(str(tmp_path), [(0, 0.0), (500, 5.0), (1000, 10.0), (1500, 20.0), (2000, 30.0)])
    events = scalars(str(tmp_path), "charts/SPS")
    assert [event.step for event in events] == [0, 500, 1000, 1500, 2000]
    assert steady_sps(events, from_step=1000) == 50.0
    assert steady_sps(events) == 2000 / 30
    assert steady_sps(events, skip=0.5) == 50.0  # from the event half-way through: the third of five


def test_fewer_than_two_events_is_no_measurement_and_a_missing_tag_no_events(tmp_path):
    write_sps_events(str(tmp_path), [(0, 0.0), (100, 1.0)])
    events = scalars(str(tmp_path), "charts/SPS")
    with pytest.raises(ValueError, match="1 SPS events at or past step 50"):
        steady_sps(events, from_step=50)
    assert scalars(str(tmp_path), "charts/episodic_return") == []


def test_the_steady_rate_starts_at_the_event_at_from_step_not_the_one_after_it(tmp_path):
    # 50 steps/s from step 1,000 to 1,500, then 25 steps/s: from the event at step 1,000 on, 1,000 steps in 30 s
    write_sps_events(str(tmp_path), [(0, 0.0), (1000, 10.0), (1500, 20.0), (2000, 40.0)])
    events = scalars(str(tmp_path), "charts/SPS")
    assert steady_sps(events, from_step=1000) == 1000 / 30
    assert steady_sps(events, from_step=1001) == 500 / 20
