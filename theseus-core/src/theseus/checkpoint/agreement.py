"""One verdict on a saved state, verified by every process of a run: each checks its share, all agree.

Each process checks its share of the state's files (:func:`theseus.checkpoint.integrity.verify_share`),
then the processes gather their verdicts (one ``process_allgather`` of a small byte record) and every
process takes the same one: the problem that one process checking every file would have met first.
A damaged file found by any process therefore makes every process see the step as damaged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from theseus.checkpoint.integrity import Verification, verify_share

#: Bytes of one process's encoded verdict (the rank, then the problem's UTF-8 text, cut to fit).
RECORD = 1024
_NONE = -2  # the rank of "no problem" in the record


def encode(verdict: Verification) -> np.ndarray:
    """``verdict``'s problem and rank as ``RECORD`` bytes (the counts of what was read stay local)."""
    record = np.zeros(RECORD, np.uint8)
    rank = _NONE if verdict.problem is None else verdict.rank
    record[:4] = np.frombuffer(np.int32(rank).tobytes(), np.uint8)
    text = (verdict.problem or "").encode()[: RECORD - 8]
    record[8 : 8 + len(text)] = np.frombuffer(text, np.uint8)
    return record


def decode(record: np.ndarray) -> tuple[int, str | None]:
    """The ``(rank, problem)`` of an encoded verdict (problem None: no problem)."""
    data = np.asarray(record, np.uint8).tobytes()
    rank = int(np.frombuffer(data[:4], np.int32)[0])
    if rank == _NONE:
        return rank, None
    return rank, data[8:].rstrip(b"\0").decode(errors="replace")


def combine(local: Verification, gathered: Sequence[tuple[int, str | None]]) -> Verification:
    """The verdict every process takes: the problem of lowest rank among ``gathered`` (None if none), with
    ``local``'s counts of what this process read."""
    found = [(rank, problem) for rank, problem in gathered if problem is not None]
    if not found:
        return replace(local, problem=None)
    rank, problem = min(found, key=lambda item: item[0])
    return replace(local, problem=problem, rank=rank)


def _allgather(record: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(record))


def agreed_verification(
    folder: str | Path,
    *,
    process: int | None = None,
    count: int | None = None,
    gather: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Verification:
    """Verify the state ``folder`` across the run's processes: this process checks its share, and every
    process returns the same verdict. Every process must call it (a collective when there are several);
    one process checks every file alone."""
    if process is None or count is None:
        import jax

        process, count = jax.process_index(), jax.process_count()
    local = verify_share(folder, process, count)
    if count == 1:
        return local
    rows = (gather or _allgather)(encode(local))
    return combine(local, [decode(row) for row in rows])


__all__ = ["RECORD", "agreed_verification", "combine", "decode", "encode"]
