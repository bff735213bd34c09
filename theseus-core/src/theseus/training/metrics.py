"""Metrics: ``metrics.jsonl`` in the run directory, plugin sinks, history and the progress bar."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from theseus.files import open_append, replace_file


def scalars(values: Mapping[str, Any]) -> dict[str, float | int]:
    """The entries of ``values`` that are single numbers, as Python numbers."""
    out: dict[str, float | int] = {}
    for name, value in values.items():
        if isinstance(value, Mapping):
            continue
        try:
            array = np.asarray(value)
        except Exception:
            continue
        if array.size != 1 or array.dtype.kind not in "biuf":
            continue
        item = array.reshape(()).item()
        out[name] = int(item) if array.dtype.kind in "biu" else float(item)
    return out


def _json_number(value: float | int) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)  # JSON has no NaN/inf
    return value


def cut_records(path: Path, resume_step: int) -> list[dict[str, Any]]:
    """Rewrite the JSON-lines file ``path`` without its records after ``resume_step`` (every record when it
    is 0: a run starting over logs its step-0 records again) and without a line cut short by a crash; a
    line that is not UTF-8, or whose step is not a count, is kept as it is, after a warning naming it.
    Returns the records kept."""
    from theseus.runs.records import NoValue, metric_lines, parse_line, record_step, warn_bad_steps

    if not path.exists():
        return []
    kept, records = [], []
    bad: list[tuple[int, Any]] = []
    for number, (raw, text) in enumerate(metric_lines(path), start=1):
        if text is None:
            kept.append(raw)
            continue
        record = parse_line(text)
        if record is NoValue.UNREADABLE:  # an integer past Python's 4,300 digits: no record, kept as it is
            kept.append(raw)
            continue
        if not isinstance(record, dict):  # cut short by a crash (or nested past the parser's depth)
            continue
        step = record_step(record) if "step" in record else 0
        if step is None:  # kept as it is, like a line that is not UTF-8
            bad.append((number, record["step"]))
            kept.append(raw)
            continue
        if step > resume_step or resume_step == 0:
            continue
        kept.append(raw)
        records.append({**record, "step": step})
    warn_bad_steps(path, bad)
    replace_file(path, b"".join(line + b"\n" for line in kept))
    return records


def json_line(record: Mapping[str, Any]) -> str:
    """``record`` as one line of JSON, a non-finite number as its text (JSON has no NaN or inf) and any other
    value JSON has no form for as its ``str``."""
    return json.dumps(_finite(record), default=str) + "\n"


class RecordLog:
    """A JSON-lines file of records keyed by ``step`` in the run directory, written as ``metrics.jsonl`` is:
    cut back to ``resume_step`` when opened (a resumed run matches an uninterrupted one), each write
    appended and flushed. Disabled (``enabled=False``: not process 0), it writes nothing."""

    def __init__(self, path: Path, *, resume_step: int = 0, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if enabled:
            cut_records(self.path, resume_step)

    def write(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Append ``records`` (each with its ``step``)."""
        if not self.enabled or not records:
            return
        with open_append(self.path) as handle:
            handle.write("".join(json_line(record) for record in records))
            handle.flush()


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float inside it as its text."""
    if isinstance(value, float):
        return _json_number(value)
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


class MetricsLogger:
    """Appends one JSON object per record to ``metrics.jsonl`` and forwards it to sinks.

    A record is ``{"step": N, "split": "train"|"val"|"eval"|"analysis", name: value, ...}``;
    sinks receive ``write(step, {"<split>/<name>": value})``. On resume, records after the
    resumed step are dropped so the file matches an uninterrupted run.
    """

    def __init__(
        self,
        path: Path,
        sinks: Sequence[Any] = (),
        *,
        resume_step: int = 0,
        enabled: bool = True,
        plotted: Sequence[str] = (),
    ) -> None:
        self.path = Path(path)
        self.sinks = list(sinks)
        self.enabled = enabled
        #: ``(step, value)`` per split of the loss and of each metric in ``plotted``, for the plots.
        self.curves: dict[str, dict[str, list[tuple[int, float]]]] = {
            name: {"train": [], "val": []} for name in ("loss", *plotted)
        }
        self.history = self.curves["loss"]
        self._file: Any = None
        if enabled:
            self._truncate(resume_step)
            self._file = open_append(self.path)

    def _truncate(self, resume_step: int) -> None:
        """Drop the records after ``resume_step`` (:func:`cut_records`), remembering the curves of the others."""
        for record in cut_records(self.path, resume_step):
            self._remember(record)

    def _remember(self, record: Mapping[str, Any]) -> None:
        split = record.get("split")
        if split not in ("train", "val"):
            return
        for name, curve in self.curves.items():
            value = record.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                curve[str(split)].append((int(record["step"]), float(value)))

    def log(self, step: int, split: str, values: Mapping[str, Any]) -> dict[str, float | int]:
        """Record the scalar entries of ``values`` for ``step``; returns what was written."""
        numbers = scalars(values)
        record = {"step": int(step), "split": split, **{k: _json_number(v) for k, v in numbers.items()}}
        self._remember(record)
        if not self.enabled:
            return numbers
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        prefixed = {f"{split}/{k}": v for k, v in numbers.items()}
        for sink in self.sinks:
            sink.write(int(step), prefixed)
        return numbers

    def table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Send the table ``name`` of ``step`` to the sinks that take tables (``write_table``)."""
        if not self.enabled:
            return
        for sink in self.sinks:
            write = getattr(sink, "write_table", None)
            if callable(write):
                write(int(step), name, list(columns), [list(row) for row in rows])

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        for sink in self.sinks:
            close = getattr(sink, "close", None)
            if callable(close):
                close()


class ProgressDisplay:
    """A rich progress bar on a terminal; plain log lines otherwise."""

    def __init__(
        self, total: int, start: int, *, enabled: bool = True, description: str = "train", quiet: bool = False
    ) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, soft_wrap=True, quiet=quiet)
        self.live = enabled and self.console.is_terminal
        self.progress: Any = None
        if self.live:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[stats]}"),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self.task = self.progress.add_task(description, total=total, completed=start, stats="")
            self.progress.start()

    def update(self, step: int, stats: str) -> None:
        if self.live:
            self.progress.update(self.task, completed=step, stats=stats)

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def close(self) -> None:
        if self.live and self.progress is not None:
            self.progress.stop()
            self.progress = None
