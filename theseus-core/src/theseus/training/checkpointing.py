"""The training loop's checkpoint store, opened only when it is needed.

Opening a ``CheckpointStore`` imports orbax (about a second of start-up). A fresh run needs it
only for its first save, after the first update; a plain listing of the checkpoint directory
tells that there is nothing to resume. Anything that may be a checkpoint (an entry named by a
step number), or a directory that cannot be listed, opens the store at once, so resuming and
its error messages are those of ``CheckpointStore``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from theseus.checkpoint.store import CheckpointStore


def may_hold_checkpoints(directory: Path) -> bool:
    """False only when ``directory`` certainly holds no committed checkpoint: it is missing, or it is
    a directory without an entry named by a step number (orbax commits a step by renaming its
    temporary directory to the step's number)."""
    try:
        if not directory.exists():
            return False
        if not directory.is_dir():
            return True  # not a directory: the store reports it
        return any(entry.name.isdigit() for entry in directory.iterdir())
    except OSError:
        return True  # unreadable: the store reports it


class LazyCheckpointStore:
    """The ``CheckpointStore`` methods the loop uses; the store is opened on first real use."""

    def __init__(self, directory: Path, **options: Any) -> None:
        self.directory = Path(directory)
        self._options = options
        self._store: CheckpointStore | None = None

    @property
    def store(self) -> CheckpointStore:
        """The opened store (imports orbax the first time)."""
        if self._store is None:
            from theseus.checkpoint.store import CheckpointStore

            self._store = CheckpointStore(self.directory, **self._options)
        return self._store

    @property
    def opened(self) -> bool:
        return self._store is not None

    def latest_step(self) -> int | None:
        """The newest committed step; None without opening the store when a listing shows none (the
        directory is then created, as opening the store would)."""
        if self._store is None and not may_hold_checkpoints(self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            return None
        return self.store.latest_step()

    def steps(self) -> list[int]:
        return self.store.steps()

    def roll_back(self, step: int) -> list[Path]:
        return self.store.roll_back(step)

    def best_step(self) -> int | None:
        return self._store.best_step() if self._store is not None else None

    def restore_latest(
        self, abstract_state: Mapping[str, Any], warn: Callable[[str], None] | None = None
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        return self.store.restore_latest(abstract_state, warn=warn)

    def save(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], val_loss: float | None = None) -> None:
        self.store.save(step, state, meta, val_loss=val_loss)

    def wait(self) -> None:
        if self._store is not None:
            self._store.wait()

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
