"""Telling a diverging run from a healthy one: which updates' losses are sound, which checkpoints a sound
loss vouched for, and the one-line stops of a run that went non-finite.

A loss is *exploded* when it is more than :data:`EXPLODED_FACTOR` times the median of the run's recent
finite losses (a sustained rise becomes the new median within half a window; a spike does not). An
update's loss is computed with the parameters before it, so a sound loss of update ``s`` vouches for
the checkpoint of step ``s - 1``: that is the *last good checkpoint* a stop names.
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
    """The recent finite losses of a run, and the checkpoints that sound losses vouched for."""

    def __init__(self, window: int = WINDOW, *, resume_step: int = 0) -> None:
        #: The run's ``training/resume_step`` (a value already recorded is not applied again).
        self.resume_step = resume_step
        self.recent: deque[float] = deque(maxlen=window)
        #: The newest update, what is wrong with its loss (None: sound), and whether that loss was finite.
        self.last: tuple[int, str | None, bool] | None = None
        self.checkpoints: list[int] = []  # checkpoints of this invocation (and the one it resumed from)
        self.good: int | None = None

    def problem(self, loss: float) -> str | None:
        """Why ``loss`` is not sound (non-finite, or exploded against the losses before it), or None."""
        if not math.isfinite(loss):
            return f"loss {loss}"
        if self.recent:
            median = statistics.median(self.recent)
            if median > 0 and loss > EXPLODED_FACTOR * median:
                return f"loss {loss:.4g}, over {EXPLODED_FACTOR:g}x the recent median {median:.4g}"
        return None

    def observe(self, step: int, loss: float) -> None:
        """Record update ``step``'s loss."""
        problem = self.problem(loss)
        self.last = (step, problem, math.isfinite(loss))
        if math.isfinite(loss):
            self.recent.append(loss)
        if problem is None:
            vouched = [c for c in self.checkpoints if c < step]
            if vouched:
                self.good = max(vouched[-1], self.good or 0)

    def unsound(self, step: int) -> str | None:
        """Why checkpoint ``step`` must not be written (its update's loss is not sound), or None."""
        return self.last[1] if self.last is not None and self.last[0] == step else None

    def exploded(self, step: int) -> bool:
        """Whether update ``step``'s loss was finite but exploded (a non-finite one stopped the run, or was
        skipped under ``training/skip_nonfinite``)."""
        return self.last is not None and self.last[0] == step and self.last[1] is not None and self.last[2]

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


def unsound_end(step: int, unsound: str, watch: LossWatch) -> TrainingError:
    """The stop of a run whose last update's loss is not sound, so that its end is not checkpointed."""
    return TrainingError(
        f"the run ends at step {step} with its {unsound}, so that step is not checkpointed; {watch.restart_hint()}"
    )


def too_many_skipped(count: int, step: int, watch: LossWatch) -> TrainingError:
    """The stop of a run whose last ``count`` updates were all skipped as non-finite."""
    return TrainingError(
        f"training/skip_nonfinite skipped {count} updates in a row (steps {step - count + 1}-{step}), so the run "
        f"is diverging; {watch.restart_hint()} (training/skip_nonfinite_limit sets how many are tolerated)"
    )


__all__ = ["EXPLODED_FACTOR", "LossWatch", "non_finite", "too_many_skipped", "unsound_end"]
