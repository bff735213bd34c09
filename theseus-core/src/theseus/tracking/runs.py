"""The rows, series and comparisons ``theseus runs`` shows, from what ``theseus.runs`` reads.

Listing hundreds of runs reads one small ``status.json`` per run, asks each run's lock whether a
process writes it (without waiting), and never imports jax.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from theseus.base.read_numbers import finite
from theseus.runs.layout import (
    CHECKPOINTS,
    CONFIG_FILE,
    METRICS_FILE,
    PROVENANCE_FILE,
    STATUS_FILE,
    checkpoint_steps,
    runs_dir,
)
from theseus.runs.lock import LOCK_FILE, holder
from theseus.runs.records import read_config, read_json, read_metrics
from theseus.tracking.status import read_status, state_of

STATUSES = ("completed", "stopped", "failed", "running", "crashed")
#: Keys every listing row has, in ``--json`` order.
ROW_KEYS = (
    "name",
    "job",
    "status",
    "step",
    "total_steps",
    "best_val_loss",
    "tokens",
    "wall_time",
    "updated",
    "checkpoint",
    "error",
)


@dataclass
class RunRow:
    """One run as ``theseus runs`` lists it."""

    name: str
    job: str | None
    status: str
    step: int
    total_steps: int | None
    best_val_loss: float | None
    tokens: int | None
    wall_time: float | None
    updated: float | None
    checkpoint: int | None
    error: str | None

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        """``completed``, ``stopped at step k``, ``failed: <its line>``, ``running`` or ``crashed``."""
        if self.status == "stopped":
            return f"stopped at step {self.step}"
        if self.status == "failed":
            return f"failed: {self.error}" if self.error else "failed"
        return self.status


def _row_without_status(run_dir: Path) -> RunRow:
    """A run written before ``status.json`` existed: its state from config, checkpoints and metrics."""
    config = read_config(run_dir)
    provenance = read_json(run_dir / PROVENANCE_FILE)
    steps = checkpoint_steps(run_dir)
    metrics = read_metrics(run_dir)
    step = max([*steps, *(int(r["step"]) for r in metrics)], default=0)
    total = config.get("training/steps")
    total = int(total) if isinstance(total, int) else None
    vals = [v for r in metrics if r.get("split") == "val" and (v := finite(r.get("loss"))) is not None]
    tokens = [int(r["tokens"]) for r in metrics if r.get("split") == "train" and isinstance(r.get("tokens"), int)]
    updated = max((p.stat().st_mtime for p in (run_dir, run_dir / METRICS_FILE) if p.exists()), default=None)
    complete = total is not None and bool(steps) and steps[-1] >= total
    return RunRow(
        name=run_dir.name,
        job=provenance.get("job"),
        status="completed" if complete else "stopped",
        step=steps[-1] if steps else step,
        total_steps=total,
        best_val_loss=min(vals) if vals else None,
        tokens=max(tokens) if tokens else None,
        wall_time=None,
        updated=updated,
        checkpoint=steps[-1] if steps else None,
        error=None,
    )


def run_row(run_dir: Path, now: float | None = None) -> RunRow:
    """The listing row of one run directory: ``running`` while a process holds its lock, whatever
    its status record says (a run being resumed, or one whose record is not written yet)."""
    record = read_status(run_dir)
    active = holder(run_dir) is not None
    if record is None:
        row = _row_without_status(run_dir)
        return replace(row, status="running") if active else row
    status = "running" if active else state_of(record, now)
    return RunRow(
        name=run_dir.name,
        job=record.get("job"),
        status=status,
        step=int(record.get("step") or 0),
        total_steps=record.get("total_steps"),
        best_val_loss=finite(record.get("best_val_loss")),
        tokens=record.get("tokens"),
        wall_time=finite(record.get("wall_time")),
        updated=finite(record.get("updated")),
        checkpoint=record.get("checkpoint"),
        error=record.get("error") if status in ("failed", "crashed") else None,
    )


def run_dirs(root: Path) -> list[Path]:
    """The run directories under ``<root>/runs`` (those with a status, config or metrics file, or
    whose lock a process holds)."""
    try:
        entries = os.scandir(runs_dir(root))
    except OSError:
        return []
    found = []
    with entries:
        for entry in entries:
            if not entry.is_dir() or entry.name.startswith("."):
                continue
            path = Path(entry.path)
            if _is_run(path):
                found.append(path)
    return found


def _is_run(path: Path) -> bool:
    """A run directory has a status, config or metrics file, or a process holds its lock (it is starting)."""
    if any((path / f).exists() for f in (STATUS_FILE, CONFIG_FILE, METRICS_FILE)):
        return True
    return (path / LOCK_FILE).exists() and holder(path) is not None


#: ``--sort`` keys: how to order rows, and whether larger comes first.
SORTS: dict[str, tuple[Any, bool]] = {
    "name": (lambda r: r.name, False),
    "job": (lambda r: (r.job or "", r.name), False),
    "status": (lambda r: (STATUSES.index(r.status) if r.status in STATUSES else 99, r.name), False),
    "updated": (lambda r: (r.updated or 0.0, r.name), True),
    "step": (lambda r: (r.step, r.name), True),
    "val": (lambda r: (r.best_val_loss if r.best_val_loss is not None else math.inf, r.name), False),
    "tokens": (lambda r: (r.tokens or 0, r.name), True),
    "wall": (lambda r: (r.wall_time or 0.0, r.name), True),
}


def list_runs(root: Path, *, sort: str = "name", job: str | None = None, status: str | None = None) -> list[RunRow]:
    """Every run under ``root``, filtered by job (a glob) and status, in ``sort`` order."""
    from fnmatch import fnmatchcase

    now = time.time()
    rows = [run_row(path, now) for path in run_dirs(root)]
    if job is not None:
        rows = [r for r in rows if r.job is not None and fnmatchcase(r.job, job)]
    if status is not None:
        rows = [r for r in rows if r.status == status]
    key, descending = SORTS[sort]
    return sorted(rows, key=key, reverse=descending)


def checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """Each committed checkpoint: step, size in bytes, validation loss (if recorded), best flag."""
    out: list[dict[str, Any]] = []
    for step in checkpoint_steps(run_dir):
        path = Path(run_dir) / CHECKPOINTS / str(step)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        val = finite(read_json(path / "metrics" / "metrics").get("val_loss"))
        out.append({"step": step, "bytes": size, "val_loss": val, "best": False})
    scored = [c for c in out if c["val_loss"] is not None]
    if scored:
        min(scored, key=lambda c: c["val_loss"])["best"] = True
    return out


def last_records(records: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The last record of each split."""
    last: dict[str, dict[str, Any]] = {}
    for record in records:
        last[str(record.get("split"))] = dict(record)
    return last


def series(
    records: Sequence[Mapping[str, Any]], metric: str, x: str, tokens_per_step: int | None
) -> list[tuple[float, float]]:
    """``(x, value)`` points of ``metric`` (``split/name``) against ``step`` or ``tokens``."""
    split, _, name = metric.partition("/")
    points = []
    for record in records:
        if record.get("split") != split or name not in record:
            continue
        value = finite(record[name])
        if value is None:
            continue
        step = int(record["step"])
        if x == "tokens":  # tokens seen by training, which only train records carry
            tokens = step * tokens_per_step if tokens_per_step else record.get("tokens") if split == "train" else None
            if not isinstance(tokens, int):
                continue
            points.append((float(tokens), value))
        else:
            points.append((float(step), value))
    return points


def metric_names(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """Every ``split/name`` that has a number in ``records``."""
    names = set()
    for record in records:
        for key, value in record.items():
            if key not in ("step", "split") and isinstance(value, (int, float)):
                names.add(f"{record.get('split')}/{key}")
    return sorted(names)


def config_differences(configs: Sequence[Mapping[str, Any]], ignore: Iterable[str] = ("run/name",)) -> list[str]:
    """The configuration keys whose values are not the same in every one of ``configs``."""
    skipped = set(ignore)
    keys = sorted({k for c in configs for k in c} - skipped)
    missing = object()
    return [k for k in keys if len({json.dumps(c.get(k, missing), default=str) for c in configs}) > 1]
