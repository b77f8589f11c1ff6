"""A run cut off mid-way, as when its machine goes away: for the resume tests."""


class CutOff(Exception):
    """The machine went away."""


def flushing_writer(module):
    """The script's SummaryWriter, with every event on disk at once: what a run logged after its
    checkpoint is there for the resumed run to hide."""

    class FlushingWriter(module.SummaryWriter):
        def add_scalar(self, *args, **kwargs):
            super().add_scalar(*args, **kwargs)
            self.flush()

    return FlushingWriter


def cut_off_at(module, monkeypatch, step: int):
    """The script's next run stops (raises CutOff) right after its progress line at `step`."""
    show = module.Progress.show

    def show_then_cut_off(self, global_step, sps, recent_returns):
        show(self, global_step, sps, recent_returns)
        if global_step == step:
            raise CutOff()

    monkeypatch.setattr(module.Progress, "show", show_then_cut_off)
    return lambda: monkeypatch.setattr(module.Progress, "show", show)
