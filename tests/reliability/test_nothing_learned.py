"""A run that learns from nothing is refused: updates whose batches hold no target (every ``y`` masked, as
chat rows cut before the assistant's turn give) end the run with one line naming the cause, instead of
logging a zero loss and calling the run trained."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.tiny import PaddedTinyTrainer
from theseus.errors import DataError
from theseus.tracking.status import read_status
from theseus.training.loop import EMPTY_STEPS_LIMIT


class MaskedFrom(PaddedTinyTrainer):
    """Every target masked from update ``EMPTY_FROM`` on (positions count from 0)."""

    EMPTY_FROM = 0

    def host_batch(self, slice: str = "train", position: int = 0) -> dict[str, np.ndarray]:
        batch = dict(super().host_batch(slice, position))
        if slice == "train" and position >= self.EMPTY_FROM:
            batch["y"] = np.full_like(batch["y"], -1)
        return batch


class MaskedLater(MaskedFrom):
    EMPTY_FROM = 3


def test_a_short_run_with_no_target_at_all_is_refused(tmp_path: Path) -> None:
    trainer = MaskedFrom.create(tmp_path, quick(run__name="empty"))
    with pytest.raises(DataError, match=r"^updates 1-6 learned from nothing: every target of their batches is masked"):
        trainer.run()
    record = read_status(tmp_path / "runs" / "empty")
    assert record is not None and record["state"] == "failed" and "learned from nothing" in record["error"]


def test_empty_updates_in_a_row_end_a_run_that_learned_before(tmp_path: Path) -> None:
    steps = 3 + EMPTY_STEPS_LIMIT + 4
    trainer = MaskedLater.create(tmp_path, quick(run__name="later", training__steps=steps))
    with pytest.raises(DataError, match=rf"^updates 4-{3 + EMPTY_STEPS_LIMIT} learned from nothing"):
        trainer.run()
    fine = PaddedTinyTrainer.create(tmp_path, quick(run__name="fine", training__steps=steps))
    fine.run()  # the same run with its targets trains to the end
    assert int(fine.state.step) == steps
