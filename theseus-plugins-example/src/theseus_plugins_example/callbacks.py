"""The example's loop callback, :class:`EarlyStop`, added to runs by the ``theseus_callbacks`` hook in
``hooks.py`` (which imports this module only when a run asks for it, so discovery stays light)."""

from __future__ import annotations

from theseus.training.callbacks import Callback, StepInfo


class EarlyStop(Callback):
    """Stops the run once ``metric`` of ``split`` (``"val"`` or ``"train"``) is at or below ``below``.

    A validation metric is read on the ``validation`` event, so the run ends at that step; a
    training metric on the ``step`` event, as the loop fetches it: usually one update late, so the
    run ends one update after the crossing (at the crossing itself where the loop waited for that
    update, e.g. to validate). At the end, a metric never seen is reported.
    """

    on = ("step", "validation", "end")

    def __init__(self, metric: str, below: float, split: str = "val") -> None:
        if split not in ("val", "train"):
            raise ValueError(f"split must be 'val' or 'train', not {split!r}")
        self.metric, self.below, self.split = metric, below, split
        self.seen = False

    def __call__(self, info: StepInfo) -> None:
        if info.event == "end":
            if not self.seen:
                info.message(f"warning: early_stop/metric {self.metric!r} never appeared in the {self.split} metrics")
            return
        if self.split == "train" and info.event == "step":
            value, step = info.metrics.get(self.metric), info.metrics_step
        elif self.split == "val" and info.event == "validation":
            value, step = (info.validation or {}).get(self.metric), info.step
        else:
            return
        if not isinstance(value, (int, float)):
            return
        self.seen = True
        if value <= self.below:
            name = f"{self.split}/{self.metric}"
            info.stop(f"{name} {value:.4f} at step {step} is at or below early_stop/below={self.below:g}")
