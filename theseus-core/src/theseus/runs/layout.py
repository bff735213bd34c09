"""The run directory's layout: ``<root>/runs/<name>/`` and the files in it, and listing what is there.

Reading a layout imports nothing heavy (``theseus runs`` lists runs without jax).
"""

from __future__ import annotations

import os
from pathlib import Path

from theseus.checkpoint.commits import committed_steps
from theseus.errors import ConfigError

RUNS = "runs"
CONFIG_FILE = "config.yaml"
PROVENANCE_FILE = "provenance.json"
METRICS_FILE = "metrics.jsonl"
#: Rollouts of on-policy training written each step (``rl/log_completions``), one JSON object a line.
ROLLOUTS_FILE = "rollouts.jsonl"
STATUS_FILE = "status.json"
#: What each invocation trained on: the identity of every prepared dataset it read.
DATA_FILE = "data.json"
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


#: The longest run name (a folder name; file systems allow 255 bytes).
MAX_RUN_NAME = 128


def check_run_name(name: str) -> str:
    """``name`` if it is one folder name under ``<root>/runs``; else ConfigError naming the rule.

    A run name that is a path (``/tmp/x``, ``a/b``, ``..``) would put the run outside ``runs/``,
    where ``theseus runs`` cannot see it or remove it."""
    problem = None
    if not name or name in (".", ".."):
        problem = "is not a folder name"
    elif "/" in name or "\\" in name or os.sep in name:
        problem = "contains a path separator"
    elif name.startswith("-"):
        problem = "starts with '-'"
    elif len(name.encode("utf-8", "surrogateescape")) > MAX_RUN_NAME:  # file systems count bytes
        problem = f"is {len(name.encode('utf-8', 'surrogateescape'))} bytes long in UTF-8 (at most {MAX_RUN_NAME})"
    elif any(ord(char) < 32 or char == "\x7f" for char in name):
        problem = "contains a control character"
    if problem is not None:
        shown = name if len(name) <= 40 else name[:37] + "..."
        raise ConfigError(
            f"run/name={shown!r} {problem}; a run name is one folder name under <root>/runs, "
            f"such as my-run-1 (no '/', not '.' or '..', no leading '-', at most {MAX_RUN_NAME} bytes in UTF-8)"
        )
    return name


def run_path(root: str | Path, name: str) -> Path:
    """``<root>/runs/<name>`` (``name`` checked by :func:`check_run_name`)."""
    return runs_dir(root) / check_run_name(name)


def run_names(root: str | Path) -> list[str]:
    """Names of the runs under ``<root>/runs`` that hold a ``config.yaml``, sorted."""
    folder = runs_dir(root)
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if (p / CONFIG_FILE).is_file())


def checkpoint_steps(run_dir: str | Path) -> list[int]:
    """Steps of the committed checkpoints of a run (folders ``checkpoints/<step>`` with their state and
    commit marker, :func:`theseus.checkpoint.commits.is_committed`), ascending."""
    folder = Path(run_dir) / CHECKPOINTS
    try:
        entries = os.scandir(folder)
    except OSError:
        return []
    with entries:
        named = [int(e.name) for e in entries if e.name.isdigit() and e.is_dir()]
    return committed_steps(folder, named, STATE)


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
    "ROLLOUTS_FILE",
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
