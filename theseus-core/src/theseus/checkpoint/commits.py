"""Which checkpoint step folders hold a finished save (no orbax import: listing runs reads this)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from theseus.checkpoint.integrity import declares_checksums, has_manifest

#: Files orbax writes into a step's folder when it finalises the step (either one marks a finished save).
COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")


def is_committed(step_dir: str | Path, item: str) -> bool:
    """Whether a step folder holds a finished save: its ``item`` folder (the state), orbax's commit
    marker, and the state's checksum manifest (which checkpoints saved before manifests existed lack,
    and say so in their meta). A bare folder named like a step (made by hand, or left by a copy) is not
    a checkpoint, nor is a save whose manifest is gone."""
    folder = Path(step_dir)
    state = folder / item
    if not state.is_dir() or not any((folder / marker).is_file() for marker in COMMIT_MARKERS):
        return False
    return has_manifest(state) or not declares_checksums(folder)


def committed_steps(checkpoints: str | Path, steps: Iterable[int], item: str) -> list[int]:
    """The ``steps`` whose folders under ``checkpoints`` are committed, ascending."""
    return sorted(step for step in steps if is_committed(Path(checkpoints) / str(step), item))


__all__ = ["COMMIT_MARKERS", "committed_steps", "is_committed"]
