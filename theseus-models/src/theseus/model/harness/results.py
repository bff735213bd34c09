"""lm-eval's results: JSON files as lm-eval's own command writes them, a console table, flat metrics."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.files import replace_file

RESULTS_FILE = "results.json"


def output_files(out: str | Path) -> tuple[Path, Path]:
    """``(results file, folder of the samples files)``: ``out`` itself when it ends in ``.json``,
    else ``out/results.json``; the samples lie beside the results file."""
    target = Path(out)
    if target.suffix == ".json":
        return target, target.parent
    return target / RESULTS_FILE, target


def dumps(value: Any) -> str:
    """JSON the way lm-eval's command writes it (numpy scalars as numbers, other objects as text)."""
    from lm_eval.utils import handle_non_serializable

    return json.dumps(value, indent=2, default=handle_non_serializable, ensure_ascii=False)


def sample_record(sample: Mapping[str, Any]) -> dict[str, Any]:
    """One logged sample as lm-eval writes it to ``samples_<task>.jsonl`` (arguments by name, responses as text)."""
    from lm_eval.utils import sanitize_list

    record = dict(sample)
    record["arguments"] = {
        f"gen_args_{i}": {f"arg_{j}": value for j, value in enumerate(argument)}
        for i, argument in enumerate(sample.get("arguments") or [])
    }
    record["resps"] = sanitize_list(sample.get("resps", []))
    record["filtered_resps"] = sanitize_list(sample.get("filtered_resps", []))
    record["target"] = str(sample.get("target"))
    return record


def write(results: dict[str, Any], out: str | Path) -> list[Path]:
    """Write the results JSON (and, when logged, ``samples_<task>.jsonl`` beside it); returns the files.

    ``results`` loses its ``samples`` entry, as in lm-eval's command, and gains ``task_hashes``.
    """
    from lm_eval.utils import handle_non_serializable, hash_string

    path, folder = output_files(out)
    folder.mkdir(parents=True, exist_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    samples: dict[str, list[dict[str, Any]]] = results.pop("samples", None) or {}
    results["task_hashes"] = {
        task: hash_string("".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in rows))
        for task, rows in samples.items()
    }
    replace_file(path, dumps(results) + "\n")
    written = [path]
    for task, rows in samples.items():
        target = folder / f"samples_{task}.jsonl"
        lines = (json.dumps(sample_record(s), default=handle_non_serializable, ensure_ascii=False) for s in rows)
        replace_file(target, "".join(line + "\n" for line in lines))
        written.append(target)
    return written


def table(results: Mapping[str, Any]) -> str:
    """lm-eval's markdown table of the task results (and of the groups, when there are any)."""
    from lm_eval.utils import make_table

    text = make_table(dict(results))
    if results.get("groups"):
        text += "\n" + make_table(dict(results), "groups")
    return str(text)


def flat_metrics(results: Mapping[str, Any]) -> dict[str, float]:
    """``{"<task>/<metric>": value}`` of every numeric metric (``<task>/<metric>/<filter>`` for a
    filter other than ``none``; stderrs as ``<metric>_stderr``) and ``<task>/samples``."""
    flat: dict[str, float] = {}
    for section in ("results", "groups"):
        for task, metrics in (results.get(section) or {}).items():
            for key, value in metrics.items():
                metric, comma, kept = str(key).partition(",")
                if not comma or isinstance(value, bool) or not isinstance(value, (int, float)):
                    continue
                name = metric if kept == "none" else f"{metric}/{kept}"
                flat[f"{task}/{name}"] = float(value)
    for task, counts in (results.get("n-samples") or {}).items():
        effective = counts.get("effective") if isinstance(counts, Mapping) else None
        if isinstance(effective, int):
            flat[f"{task}/samples"] = float(effective)
    return flat


__all__ = ["RESULTS_FILE", "dumps", "flat_metrics", "output_files", "sample_record", "table", "write"]
