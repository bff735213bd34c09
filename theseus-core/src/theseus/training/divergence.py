"""Telling a diverging run from a healthy one: which updates' losses are sound, which checkpoints a sound
loss vouched for, and the one-line stops of a run that went non-finite.

A loss is *exploded* when it is more than :data:`EXPLODED_FACTOR` times the median of the run's recent
sound losses. An update's loss is computed with the parameters before it, so the loss of update ``s``
vouches for the checkpoint of step ``s - 1``: that is the *last good checkpoint* a stop names.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from theseus.errors import TrainingError

#: A loss this many times above the recent median is exploded: its step is not checkpointed.
EXPLODED_FACTOR = 100.0
#: How many recent sound losses the median is taken over.
WINDOW = 32


class LossWatch:
    """The recent sound losses of a run, and the checkpoints they vouched for."""

    def __init__(self, window: int = WINDOW, *, resume_step: int = 0) -> None:
        #: The run's ``training/resume_step`` (a value already recorded is not applied again).
        self.resume_step = resume_step
        self.recent: deque[float] = deque(maxlen=window)
        self.last: tuple[int, float] | None = None  # the newest update and its loss
        self.checkpoints: list[int] = []  # checkpoints of this invocation (and the one it resumed from)
        self.good: int | None = None

    def problem(self, loss: float) -> str | None:
        """Why ``loss`` is not sound (non-finite, or exploded), or None."""
        if not math.isfinite(loss):
            return f"loss {loss}"
        if self.recent:
            median = statistics.median(self.recent)
            if median > 0 and loss > EXPLODED_FACTOR * median:
                return f"loss {loss:.4g}, over {EXPLODED_FACTOR:g}x the recent median {median:.4g}"
        return None

    def observe(self, step: int, loss: float) -> None:
        """Record update ``step``'s loss."""
        self.last = (step, loss)
        if self.problem(loss) is None:
            self.recent.append(loss)
            vouched = [c for c in self.checkpoints if c < step]
            if vouched:
                self.good = max(vouched[-1], self.good or 0)

    def unsound(self, step: int) -> str | None:
        """Why checkpoint ``step`` must not be written (its update's loss is not sound), or None."""
        if self.last is None or self.last[0] != step:
            return None
        return self.problem(self.last[1])

    def saved(self, step: int) -> None:
        """A checkpoint of ``step`` exists (written now, or resumed from)."""
        self.checkpoints.append(step)

    def restart_hint(self) -> str:
        """What to run to restart from the last good checkpoint."""
        if self.good is None:
            if not self.checkpoints:
                return "no checkpoint was written; lower training/lr and run again"
            newest = self.checkpoints[-1]
            return (
                f"no checkpoint is known to be good (no sound loss followed step {newest}); lower training/lr and "
                f"run again to resume from step {newest}, or start over with a new run/name"
            )
        newer = [c for c in self.checkpoints if c > self.good]
        if newer and self.resume_step == self.good:  # the key would not be applied again
            return (
                f"the last good checkpoint is step {self.good}: move the checkpoints after it "
                f"({', '.join(map(str, newer))}) out of the run's checkpoints folder, lower training/lr and run again"
            )
        return (
            f"the last good checkpoint is step {self.good}: lower training/lr and run again with "
            f"training/resume_step={self.good}"
        )


def non_finite(quantity: str, value: float, step: int, watch: LossWatch) -> TrainingError:
    """The stop of a run whose ``quantity`` went non-finite at ``step``."""
    return TrainingError(
        f"non-finite {quantity} ({value}) at step {step}; {watch.restart_hint()}, or set "
        "training/skip_nonfinite=true to skip such updates"
    )


def too_many_skipped(count: int, step: int, watch: LossWatch) -> TrainingError:
    """The stop of a run whose last ``count`` updates were all skipped as non-finite."""
    return TrainingError(
        f"training/skip_nonfinite skipped {count} updates in a row (steps {step - count + 1}-{step}), so the run "
        f"is diverging; {watch.restart_hint()} (training/skip_nonfinite_limit sets how many are tolerated)"
    )


__all__ = ["EXPLODED_FACTOR", "LossWatch", "non_finite", "too_many_skipped"]
