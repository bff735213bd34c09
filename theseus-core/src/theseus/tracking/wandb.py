"""Weights & Biases: one W&B run per theseus run, continued when the run resumes.

The W&B run id is kept in ``wandb.json`` in the run directory, so running the same command
again logs into the same W&B run. The resolved configuration (selections included) and the
provenance record are the W&B run config. Files W&B writes locally go under ``<run>/wandb``.
"""

from __future__ import annotations

import json
import os
import secrets
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.files import replace_file

ID_FILE = "wandb.json"
MODES = ("online", "offline", "disabled")


def _stored_id(run_dir: Path) -> str | None:
    try:
        record = jsonfile.read_object(run_dir / ID_FILE)
    except jsonfile.UnreadableJSON:  # missing, damaged or hostile: a new W&B run
        return None
    value = record.get("id")
    return str(value) if value else None


def new_id() -> str:
    """A fresh W&B run id: eight lowercase letters and digits."""
    alphabet = string.ascii_lowercase + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(8))


def _tags(raw: Any) -> list[str] | None:
    items = raw if isinstance(raw, (list, tuple)) else str(raw or "").split(",")
    tags = [str(t).strip() for t in items if str(t).strip()]
    return tags or None


class WandbSink:
    """Logs every scalar with ``wandb.log(..., step=step)`` into the run's W&B run, and tables as W&B Tables."""

    name = "wandb"

    def __init__(self, run_dir: Path, config: Mapping[str, Any], *, run_name: str, record: Mapping[str, Any]) -> None:
        import wandb

        from theseus.errors import ConfigError

        mode = str(config.get("metrics/wandb/mode") or os.environ.get("WANDB_MODE") or "online")
        if mode not in MODES:
            raise ConfigError(f"metrics/wandb/mode must be one of {', '.join(MODES)}, got {mode!r}")
        run_dir = Path(run_dir)
        run_id = _stored_id(run_dir) or new_id()
        replace_file(run_dir / ID_FILE, json.dumps({"id": run_id}) + "\n")
        self.run = wandb.init(
            project=str(config.get("metrics/wandb/project") or "theseus"),
            entity=str(config.get("metrics/wandb/entity") or "") or None,
            name=str(config.get("metrics/wandb/name") or "") or run_name,
            tags=_tags(config.get("metrics/wandb/tags")),
            group=str(config.get("metrics/wandb/group") or "") or None,
            mode=mode,  # type: ignore[arg-type]
            id=run_id,
            resume="allow",
            dir=str(run_dir),
            config=dict(record),
            settings=wandb.Settings(console="off", silent=True, x_disable_stats=True),
        )
        self.id = run_id

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self.run.log(dict(metrics), step=step)

    def write_table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """The table as a ``wandb.Table`` logged under ``name`` at ``step``."""
        import wandb

        self.run.log({name: wandb.Table(columns=list(columns), data=[list(row) for row in rows])}, step=step)

    def close(self) -> None:
        self.run.finish()
