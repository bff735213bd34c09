"""A run resumes on the data it was trained on: each invocation records the identity of every
prepared dataset it reads (``<run>/data.json``), and resuming after the data was prepared again
differently (``data/force=true``) is refused in one line, unless ``training/accept_new_data=true``.

The training loop checks before it restores anything, so a refused resume writes nothing, and
writes the record beside the run's ``config.yaml`` (process 0, holding the run's lock).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.config import field
from theseus.errors import ConfigError
from theseus.files import replace_file
from theseus.runs.layout import DATA_FILE

ACCEPT_KEY = "training/accept_new_data"


@dataclass
class DataCheckConfig:
    """The key that lets a run resume on data prepared again since it started."""

    accept_new_data: bool = field(
        ACCEPT_KEY,
        default=False,
        help="resume although the run's prepared data changed since it started (data/force=true)",
    )


def read_record(run_dir: Path) -> dict[str, Any] | None:
    """The datasets the run's last invocation read (None when it recorded none, or its record is
    missing, damaged or refused by :mod:`theseus.base.jsonfile`)."""
    try:
        record = jsonfile.read_object(Path(run_dir) / DATA_FILE)
    except jsonfile.UnreadableJSON:
        return None
    datasets = record.get("datasets")
    return datasets if isinstance(datasets, dict) else None


def write_record(run_dir: Path, identity: Mapping[str, Any]) -> None:
    """Record ``identity`` (dataset name -> ``Header.identity()``) as what the run trains on."""
    path = Path(run_dir) / DATA_FILE
    data = (json.dumps({"datasets": dict(identity)}, indent=2, sort_keys=True) + "\n").encode("utf-8")
    if path.is_file() and path.stat().st_size == len(data) and path.read_bytes() == data:
        return  # compared as bytes: a record that is no UTF-8 (or no JSON) is replaced, not decoded
    replace_file(path, data)


def _sizes(identity: Mapping[str, Any]) -> str:
    """``train 1,234 tokens, val 56 tokens``: the splits of ``identity`` that record a count of tokens."""
    splits = identity.get("splits")
    if not isinstance(splits, Mapping):
        return "no splits"
    parts = []
    for name, split in sorted(splits.items()):
        tokens = split.get("tokens") if isinstance(split, Mapping) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens >= 0:
            parts.append(f"{name} {tokens:,} tokens")
    return ", ".join(parts) or "no splits"


def changed(previous: Mapping[str, Any], current: Mapping[str, Any]) -> str | None:
    """The first dataset read by both whose contents differ, described; None when none does."""
    for name, now in current.items():
        before = previous.get(name)
        if isinstance(before, Mapping) and before.get("digest") != now.get("digest"):
            return (
                f"data {name!r} as prepared {before.get('created') or '?'} ({_sizes(before)}); "
                f"it was prepared again since ({_sizes(now)} now)"
            )
    return None


def check_resume(run_dir: Path, run: str, identity: Mapping[str, Any], *, accept: bool) -> str | None:
    """Refuse (ConfigError) to resume run ``run`` on data that differs from what it recorded; with
    ``accept``, the warning line to show instead. None when nothing changed or nothing is recorded."""
    previous = read_record(run_dir)
    problem = changed(previous, identity) if previous is not None else None
    if problem is None:
        return None
    if accept:
        return f"warning: run {run!r} was trained on {problem}; resuming on this data ({ACCEPT_KEY}=true)"
    raise ConfigError(
        f"run {run!r} was trained on {problem}; prepare it as it was, start a new run with "
        f"run/name=<new name>, or resume on this data with {ACCEPT_KEY}=true"
    )


__all__ = ["ACCEPT_KEY", "DataCheckConfig", "check_resume", "read_record", "write_record"]
