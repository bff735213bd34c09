"""Hook implementations, registered by the ``plugin/example-csv`` entry point.

This module is imported whenever theseus discovers plugins (also by ``theseus jobs``), so it stays
light: the standard library and ``theseus.config`` only, never jax.

* ``theseus_gather`` adds a ``metrics/csv/*`` section to the configuration of every trainer that
  opts in with the class attribute ``CSV_METRICS = True`` (the example's trainers do; so does any
  subclass of them, or your own trainer that sets it).
* ``theseus_metrics_sinks`` gives such a run a sink that writes every metric to a CSV file in the
  run directory, next to ``metrics.jsonl``.
* ``theseus_callbacks`` adds a loop callback, ``callbacks.EarlyStop`` (imported in the hook, as it
  needs the trainer's modules), to the runs of trainers that set
  ``EARLY_STOP = True`` (their schema gains ``early_stop/*`` through ``theseus_gather``): with
  ``early_stop/metric=loss early_stop/below=2.5`` a run ends, with a checkpoint, at the first
  validation whose loss is at most 2.5.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.config import field
from theseus.errors import ConfigError
from theseus.plugins import hookimpl


@dataclass
class CsvMetricsConfig:
    """The configuration section this plugin contributes to opted-in trainers."""

    enabled: bool = field("metrics/csv/enabled", default=True, help="write metrics to a CSV file in the run directory")
    file: str = field("metrics/csv/file", default="metrics.csv", help="CSV file, relative to the run directory")


class CsvMetricsSink:
    """Writes ``step,name,value`` rows (``name`` such as ``train/loss``) to a CSV file.

    A resumed run continues the file: rows at or after the first step written by the new
    invocation are dropped first, so the file matches an uninterrupted run.
    """

    HEADER = ("step", "name", "value")

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._handle: Any = None
        self._writer: Any = None

    def _open(self, first_step: int) -> None:
        kept: list[list[str]] = []
        if self.path.is_file():
            with self.path.open(newline="", encoding="utf-8") as handle:
                rows = list(csv.reader(handle))
            kept = [row for row in rows[1:] if len(row) == 3 and row[0].isdigit() and int(row[0]) < first_step]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = self.path.open("w", newline="", encoding="utf-8")
        self._writer = csv.writer(self._handle)
        self._writer.writerow(self.HEADER)
        self._writer.writerows(kept)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if self._writer is None:
            self._open(step)
        for name, value in metrics.items():
            self._writer.writerow([step, name, value])
        self._handle.flush()

    def close(self) -> None:
        if self._handle is not None and not self._handle.closed:
            self._handle.close()


@dataclass
class EarlyStopConfig:
    """The ``early_stop/*`` section of trainers that set ``EARLY_STOP = True``."""

    metric: str = field(
        "early_stop/metric",
        default="",
        help="end the run once this metric of early_stop/split (e.g. loss) is at or below early_stop/below; "
        "empty = off",
    )
    split: str = field(
        "early_stop/split",
        default="val",
        choices=("val", "train"),
        help="val: checked after each validation, the run ends there; train: checked as each update's metrics "
        "arrive (usually one update late), the run ends at the crossing update or the one after",
    )
    below: float = field("early_stop/below", default=0.0, help="the value early_stop/metric has to reach")


def opted_in(owner: type) -> bool:
    """Whether a trainer class asks for the CSV section (``CSV_METRICS = True``)."""
    return bool(getattr(owner, "CSV_METRICS", False))


def early_stop_opted_in(owner: type) -> bool:
    """Whether a trainer class asks for the early-stop section (``EARLY_STOP = True``)."""
    return bool(getattr(owner, "EARLY_STOP", False))


@hookimpl
def theseus_gather(owner: type) -> list[type] | None:
    sections: list[type] = [CsvMetricsConfig] if opted_in(owner) else []
    if early_stop_opted_in(owner):
        sections.append(EarlyStopConfig)
    return sections or None


@hookimpl
def theseus_metrics_sinks(run_dir: Path, job: Any) -> list[Any] | None:
    config = job.context.config
    if not opted_in(type(job)) or not config.get("metrics/csv/enabled", False):
        return None
    name = str(config.get("metrics/csv/file") or "")
    if not name:
        raise ConfigError(
            "metrics/csv/file is empty; name a file such as metrics.csv (or set metrics/csv/enabled=false)"
        )
    return [CsvMetricsSink(Path(run_dir) / name)]


@hookimpl
def theseus_callbacks(trainer: Any) -> list[Any] | None:
    config = trainer.context.config
    metric = str(config.get("early_stop/metric") or "")
    if not early_stop_opted_in(type(trainer)) or not metric:
        return None
    from theseus_plugins_example.callbacks import EarlyStop

    return [EarlyStop(metric, float(config.get("early_stop/below", 0.0)), str(config.get("early_stop/split", "val")))]
