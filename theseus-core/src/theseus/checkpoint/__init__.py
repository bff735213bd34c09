"""Checkpoints: orbax-backed save/restore of train state with keep-N, best and final policies."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from theseus.checkpoint.store import CheckpointStore


def __getattr__(name: str) -> Any:
    """``CheckpointStore`` is imported on first use: ``theseus.checkpoint.shapes`` needs no orbax."""
    if name == "CheckpointStore":
        from theseus.checkpoint.store import CheckpointStore

        return CheckpointStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["CheckpointStore"]
