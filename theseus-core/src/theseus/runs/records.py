"""Reading what a run wrote: its configuration, metrics and provenance.

Standard library and PyYAML only, so listing hundreds of runs never imports jax or OmegaConf. The
lenient readers (``read_yaml``, ``read_json``, ``read_metrics``) give empty results for a missing or
damaged file, for listings that must go on; ``read_provenance`` refuses a damaged record, for loading.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError
from theseus.runs.layout import CONFIG_FILE, METRICS_FILE, PROVENANCE_FILE


def read_yaml(path: Path) -> dict[str, Any]:
    """A YAML mapping (the C loader when available); empty when missing or unreadable."""
    import yaml

    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)(path.read_text(encoding="utf-8"))
        try:
            data = loader.get_single_data()
        finally:
            loader.dispose()
    except (OSError, yaml.YAMLError):
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
    """A JSON object; empty when missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (a line cut short by a crash is skipped)."""
    records = []
    try:
        text = (Path(run_dir) / METRICS_FILE).read_text(encoding="utf-8")
    except OSError:
        return []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record:
            records.append(record)
    return records


def read_provenance(run_dir: Path) -> dict[str, Any]:
    """The run's ``provenance.json`` (model class, tokenizer, versions); empty for a run written
    before it existed, ConfigError when it is damaged."""
    path = Path(run_dir) / PROVENANCE_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path} is unreadable ({exc}); train the run again") from exc
    if not isinstance(record, dict):
        raise ConfigError(f"{path} holds no JSON object; train the run again")
    return record


__all__ = ["flatten", "read_config", "read_json", "read_metrics", "read_provenance", "read_yaml"]
