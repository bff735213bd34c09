"""The run directory's layout: ``<root>/runs/<name>/`` and the files in it, and listing what is there.

Reading a layout imports nothing heavy (``theseus runs`` lists runs without jax).
"""

from __future__ import annotations

import os
from pathlib import Path

RUNS = "runs"
CONFIG_FILE = "config.yaml"
PROVENANCE_FILE = "provenance.json"
METRICS_FILE = "metrics.jsonl"
STATUS_FILE = "status.json"
LOSS_PLOT = "loss.png"
CHECKPOINTS = "checkpoints"
#: Inside a checkpoint step's folder: the saved training state (orbax).
STATE = "state"
ANALYSIS = "analysis"
#: ``training/profile``'s traces (``jax.profiler``: TensorBoard's profile plugin and Perfetto read them).
PROFILE = "profile"
#: The run's copy of its file-based tokenizer (``tokenizer.json`` and the files that travel with it).
TOKENIZER = "tokenizer"
TOKENIZER_COMPANIONS = ("tokenizer_config.json", "special_tokens_map.json")


def runs_dir(root: str | Path) -> Path:
    """``<root>/runs``."""
    return Path(root).expanduser() / RUNS


def run_path(root: str | Path, name: str) -> Path:
    """``<root>/runs/<name>``."""
    return runs_dir(root) / name


def run_names(root: str | Path) -> list[str]:
    """Names of the runs under ``<root>/runs`` that hold a ``config.yaml``, sorted."""
    folder = runs_dir(root)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / CONFIG_FILE).is_file())


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps of the committed checkpoints of a run (folders ``checkpoints/<step>/state``), ascending.

    orbax writes a step under a temporary name and renames it when complete, so a step folder here
    is a complete checkpoint."""
    try:
        entries = os.scandir(Path(run_dir) / CHECKPOINTS)
    except OSError:
        return []
    with entries:
        return sorted(int(e.name) for e in entries if e.name.isdigit() and e.is_dir())


def state_path(run_dir: str | Path, step: int) -> Path:
    """The saved state of checkpoint ``step``."""
    return Path(run_dir) / CHECKPOINTS / str(step) / STATE


__all__ = [
    "ANALYSIS",
    "CHECKPOINTS",
    "CONFIG_FILE",
    "LOSS_PLOT",
    "METRICS_FILE",
    "PROVENANCE_FILE",
    "RUNS",
    "STATE",
    "STATUS_FILE",
    "TOKENIZER",
    "TOKENIZER_COMPANIONS",
    "checkpoint_steps",
    "run_names",
    "run_path",
    "runs_dir",
    "state_path",
]


def profile_traces(run_dir: str | Path) -> list[Path]:
    """The profiler traces of a run (``profile/plugins/profile/<session>/*.xplane.pb``), oldest first."""
    return sorted((Path(run_dir) / PROFILE).glob("plugins/profile/*/*.xplane.pb"))
