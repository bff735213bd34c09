"""Which checkpoint step folders hold a finished save (no orbax import: listing runs reads this)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

#: Files orbax writes into a step's folder when it finalises the step (either one marks a finished save).
COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")


def is_committed(step_dir: str | Path, item: str) -> bool:
    """Whether a step folder holds a finished save: its ``item`` folder (the state) and orbax's commit
    marker. A bare folder named like a step (made by hand, or left by a copy) is not a checkpoint."""
    folder = Path(step_dir)
    return (folder / item).is_dir() and any((folder / marker).is_file() for marker in COMMIT_MARKERS)


def committed_steps(checkpoints: str | Path, steps: Iterable[int], item: str) -> list[int]:
    """The ``steps`` whose folders under ``checkpoints`` are committed, ascending."""
    return sorted(step for step in steps if is_committed(Path(checkpoints) / str(step), item))


__all__ = ["COMMIT_MARKERS", "committed_steps", "is_committed"]
