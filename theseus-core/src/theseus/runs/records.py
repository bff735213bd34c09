"""Reading what a run wrote: its configuration, metrics and provenance.

Standard library and PyYAML only, so listing hundreds of runs never imports jax or OmegaConf. The
lenient readers (``read_yaml``, ``read_json``, ``read_metrics``) give empty results for a missing or
damaged file, for listings that must go on; ``read_provenance`` refuses a damaged record, for loading.
"""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.base.read_numbers import count
from theseus.config.yaml_limits import bounded_yaml_text
from theseus.errors import ConfigError
from theseus.runs.layout import CONFIG_FILE, METRICS_FILE, PROVENANCE_FILE, ROLLOUTS_FILE

#: The largest step a record may name (steps are 64-bit counts).
MAX_STEP = 2**63 - 1


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping (the C loader when available); empty when missing, unreadable or past the bounds
    of :mod:`theseus.config.yaml_limits`."""
    import yaml

    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(bounded_yaml_text(path))
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except (OSError, yaml.YAMLError, ConfigError, RecursionError):
        return {}
    except (ValueError, LookupError, TypeError, AttributeError):  # bytes that are not UTF-8, bad tagged scalars
        return {}
    return data if isinstance(data, dict) else {}


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as slash keys: ``{"training": {"lr": 1}}`` -> ``{"training/lr": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def read_config(run_dir: Path) -> dict[str, Any]:
    """The resolved configuration of a run as slash keys (empty when missing)."""
    return flatten(read_yaml(Path(run_dir) / CONFIG_FILE))


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object (read through :mod:`theseus.base.jsonfile`); empty when missing or unreadable."""
    try:
        return jsonfile.read_object(Path(path), check_numbers=False)  # listings check each number they show
    except jsonfile.UnreadableJSON:  # too large or nested too deep: unreadable too
        return {}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (a line cut short by a crash is skipped; a damaged line is skipped
    with one warning)."""
    return read_records(Path(run_dir) / METRICS_FILE)


def read_rollouts(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``rollouts.jsonl`` (``rl/log_completions``), read as ``metrics.jsonl`` is; empty
    when the run logged none."""
    return read_records(Path(run_dir) / ROLLOUTS_FILE)


def read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects with a ``step`` of a JSON-lines file (a line cut short by a crash is skipped; a
    damaged line, or one whose step is not a count, is skipped with one warning); empty when missing."""
    try:
        lines = metric_lines(path)
    except OSError:
        return []
    records = []
    bad: list[tuple[int, Any]] = []
    for number, (_raw, text) in enumerate(lines, start=1):
        record = _record(text)
        if record is None:
            continue
        step = record_step(record)
        if step is None:
            bad.append((number, record["step"]))
            continue
        records.append({**record, "step": step})
    warn_bad_steps(path, bad)
    return records


def record_step(record: Mapping[str, Any]) -> int | None:
    """The step of a record: a whole number from 0 to :data:`MAX_STEP` (``3`` or ``3.0``); None for any
    other value (``1e400``, which JSON reads as infinity, ``"3"``, ``true``, none at all)."""
    return count(record.get("step"), MAX_STEP, whole_floats=True)


def warn_bad_steps(path: Path, bad: list[tuple[int, Any]]) -> None:
    """One warning naming the JSON-lines file ``path`` and its first line whose step is no count, of the
    ``(line number, step)`` in ``bad`` (once per process)."""
    if not bad or (str(path), bad[0][0]) in _WARNED:
        return
    number, step = bad[0]
    _WARNED.add((str(path), number))
    shown = ascii(step)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    more = f" (and {len(bad) - 1} more lines)" if len(bad) > 1 else ""
    print(f"warning: {path}:{number}: step {shown} is not a step count; skipped that line{more}", file=sys.stderr)


def metric_lines(path: Path) -> list[tuple[bytes, str | None]]:
    """Each line of the metrics file ``path``: its bytes and its text, None for a line that is not UTF-8
    (reported in one warning per file on stderr, then left to the caller to skip or keep)."""
    lines: list[tuple[bytes, str | None]] = []
    damaged: list[tuple[int, UnicodeDecodeError]] = []
    for number, raw in enumerate(Path(path).read_bytes().splitlines(), start=1):
        try:
            lines.append((raw, raw.decode("utf-8")))
        except UnicodeDecodeError as exc:
            lines.append((raw, None))
            damaged.append((number, exc))
    if damaged:
        _warn_damaged(Path(path), damaged)
    return lines


class NoValue(enum.Enum):
    """Why a metrics line holds no JSON value (:func:`parse_line`)."""

    CUT_SHORT = "not JSON: a crash cut it short, or it nests past the parser's depth"
    UNREADABLE = "JSON that Python will not read: an integer past its 4,300 digits"


def parse_line(text: str) -> Any:
    """The JSON value of a metrics line, or the :class:`NoValue` that says why there is none.
    Listings skip every line without a record; :func:`~theseus.training.metrics.cut_records` drops the lines
    cut short and keeps the unreadable ones as they are."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return NoValue.CUT_SHORT
    except ValueError:
        return NoValue.UNREADABLE


def _record(text: str | None) -> dict[str, Any] | None:
    """The metrics record on a line, None when the line holds none."""
    record = parse_line(text) if text is not None else None
    return record if isinstance(record, dict) and "step" in record else None


_WARNED: set[tuple[str, int]] = set()


def _warn_damaged(path: Path, damaged: list[tuple[int, UnicodeDecodeError]]) -> None:
    """One warning naming the file and its first line that is not UTF-8 (once per process)."""
    number, exc = damaged[0]
    if (str(path), number) in _WARNED:
        return
    _WARNED.add((str(path), number))
    byte = exc.object[exc.start : exc.start + 1].hex()
    more = f" (and {len(damaged) - 1} more lines)" if len(damaged) > 1 else ""
    print(f"warning: {path}:{number}: byte 0x{byte} is not UTF-8; skipped that line{more}", file=sys.stderr)


def read_provenance(run_dir: Path) -> dict[str, Any]:
    """The run's ``provenance.json`` (model class, tokenizer, versions); empty for a run written
    before it existed, ConfigError when it is damaged."""
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.is_file():
        return {}
    try:
        return jsonfile.read_object(path, check_numbers=False)  # a record of any configured value
    except jsonfile.UnreadableJSON as exc:
        raise ConfigError(f"{exc}; train the run again") from exc


__all__ = [
    "MAX_STEP",
    "flatten",
    "metric_lines",
    "read_config",
    "read_json",
    "read_metrics",
    "read_provenance",
    "read_records",
    "read_rollouts",
    "read_yaml",
    "record_step",
    "warn_bad_steps",
]
