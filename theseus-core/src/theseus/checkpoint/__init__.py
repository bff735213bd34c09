"""Checkpoints: orbax-backed save/restore of train state with keep-N, best and final policies."""

from theseus.checkpoint.store import CheckpointStore

__all__ = ["CheckpointStore"]
