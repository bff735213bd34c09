"""Writing a run directory: its resolved configuration and provenance record (the layout is in
``theseus.runs.layout``)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib.metadata as metadata
import json
import os
import platform
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.config import read_yaml, write_yaml
from theseus.files import replace_file
from theseus.runs.layout import (
    ANALYSIS,
    CHECKPOINTS,
    CONFIG_FILE,
    LOSS_PLOT,
    METRICS_FILE,
    PROFILE,
    PROVENANCE_FILE,
    TOKENIZER,
    TOKENIZER_COMPANIONS,
    run_path,
)

_VERSIONED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy")


def default_run_name(job_key: str | None, job_class: type) -> str:
    """``"my/gpt/train"`` -> ``"my-gpt-train"``; without a key, the class name."""
    base = job_key or job_class.__name__
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", base).strip("-.")
    return name or "run"


class RunDirectory:
    """``<root>/runs/<name>`` and the files in it."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = Path(root)
        self.name = name
        self.path = run_path(self.root, name)

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_file(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def loss_plot(self) -> Path:
        return self.path / LOSS_PLOT

    def plot(self, metric: str) -> Path:
        """The plot of a metric a trainer draws beside the loss (``reward.png``; ``/`` becomes ``-``)."""
        return self.path / f"{metric.replace('/', '-')}.png"

    @property
    def profile_dir(self) -> Path:
        return self.path / PROFILE

    def analysis_dir(self, name: str) -> Path:
        return self.path / ANALYSIS / name

    def create(self) -> None:
        self.path.mkdir(parents=True, exist_ok=True)

    def remove_if_empty(self) -> bool:
        """Remove the run directory when it holds nothing but empty folders (what a start that failed
        before writing any record leaves); whether it is gone. Nothing else is removed."""
        for folder, _subdirs, _files in os.walk(self.path, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only an empty folder goes
        return not self.path.exists()

    def keep_tokenizer(self, spec: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """``spec`` with its tokenizer file (and the companions beside it) copied into the run's
        ``tokenizer/`` folder and the path pointing there: the run keeps decoding after its data
        folder is prepared again with another tokenizer. Specs without a file are returned as they are."""
        if spec is None:
            return None
        kept = dict(spec)
        source = Path(str(kept.get("path") or ""))
        if not kept.get("path") or not source.is_file():
            return kept
        folder = self.path / TOKENIZER
        folder.mkdir(parents=True, exist_ok=True)
        for companion in (source.name, *TOKENIZER_COMPANIONS):
            if (source.parent / companion).is_file() and source.parent != folder:
                shutil.copyfile(source.parent / companion, folder / companion)
        kept["path"] = str(folder / source.name)
        return kept

    def previous_config(self) -> dict[str, Any] | None:
        return read_yaml(self.config_file) if self.config_file.is_file() else None

    def write_config(self, values: Mapping[str, Any]) -> list[str]:
        """Write the resolved configuration; returns the keys that differ from the last run's."""
        previous = self.previous_config()
        changed: list[str] = []
        if previous is not None:
            current = {k: (list(v) if isinstance(v, tuple) else v) for k, v in values.items()}
            keys = set(previous) | set(current)
            changed = sorted(k for k in keys if previous.get(k) != current.get(k))
        write_yaml(dict(values), self.config_file)
        return changed

    def write_provenance(self, record: Mapping[str, Any]) -> None:
        replace_file(self.path / PROVENANCE_FILE, json.dumps(record, indent=2, sort_keys=True, default=str) + "\n")


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def theseus_distributions() -> dict[str, str]:
    """Installed distributions whose name starts with ``theseus``, with versions."""
    found: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.name or ""
        if name.lower().replace("_", "-").startswith("theseus"):
            found[name] = dist.version
    return dict(sorted(found.items()))


def objective_record(objective: Any) -> dict[str, Any]:
    """An objective as provenance keeps it: its class and, for a dataclass, its plain values (numbers,
    strings, flags; a teacher model or a reference table is left out)."""
    values = {}
    if dataclasses.is_dataclass(objective):
        for item in dataclasses.fields(objective):
            value = getattr(objective, item.name)
            if isinstance(value, (bool, int, float, str)) or value is None:
                values[item.name] = value
    kind = type(objective)
    return {"class": f"{kind.__module__}:{kind.__qualname__}", "values": values}


def provenance(
    job_key: str | None,
    job_class: type,
    *,
    resumed_from: int | None,
    model: type | None = None,
    tokenizer: Mapping[str, Any] | None = None,
    selection: Mapping[str, str] | None = None,
    objective: Any = None,
) -> dict[str, Any]:
    """Who and what produced this run: distributions, plugins, versions, devices, command, the objective
    it optimised, and the model class and tokenizer spec that ``generate`` needs to rebuild the model and
    decode its tokens."""
    import jax

    from theseus.plugins.discovery import plugins

    registry = plugins().registry
    devices = [
        {"id": d.id, "platform": d.platform, "kind": d.device_kind, "process_index": d.process_index}
        for d in jax.devices()
    ]
    return {
        "job": job_key,
        "job_class": f"{job_class.__module__}:{job_class.__qualname__}",
        "model": f"{model.__module__}:{model.__qualname__}" if model is not None else None,
        "tokenizer": dict(tokenizer) if tokenizer is not None else None,
        "selection": dict(selection) if selection is not None else None,
        "objective": objective_record(objective) if objective is not None else None,
        "distributions": theseus_distributions(),
        "plugins": dict(sorted(registry.distributions.items())),
        "blocked_plugins": sorted(registry.blocked),
        "versions": {"python": platform.python_version(), **{d: _version(d) for d in _VERSIONED}},
        "devices": devices,
        "process_count": jax.process_count(),
        "host": platform.node(),
        "argv": list(sys.argv),
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "resumed_from": resumed_from,
    }
