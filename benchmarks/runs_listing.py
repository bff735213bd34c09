"""``theseus runs`` with many runs: 200 synthetic run directories, listed as a fresh subprocess.

Each synthetic run holds what a real one does for listing purposes: ``status.json``, a nested
``config.yaml``, ``provenance.json``, a ``metrics.jsonl`` of 100 records and two checkpoint
directories; the states cycle through completed, stopped, failed, running (this process's pid, so
alive) and crashed. Reported: the median wall time of ``theseus runs --root R`` (table) and
``--json`` as subprocesses (interpreter start-up included), against the ``theseus jobs`` start-up
measured in the same rounds, and the in-process listing time alone.

    python benchmarks/runs_listing.py [--runs 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, markdown_table
from benchmarks.first_step import _env, theseus_command

GOAL_SECONDS = 0.5
STATES = ("completed", "stopped", "failed", "running", "crashed")


def make_runs(root: Path, count: int) -> None:
    """``count`` synthetic run directories under ``root/runs``."""
    now = time.time()
    for index in range(count):
        run = root / "runs" / f"run-{index:04d}"
        (run / "checkpoints" / "500").mkdir(parents=True)
        (run / "checkpoints" / "1000").mkdir()
        state = STATES[index % len(STATES)]
        step = 1000 if state == "completed" else 500
        status = {
            "version": 1,
            "run": run.name,
            "job": f"train/pretrain-{index % 7}",
            "state": state,
            "step": step,
            "start_step": 0,
            "total_steps": 1000,
            "stop_step": 1000,
            "tokens_per_step": 32 * 1024,
            "tokens": step * 32 * 1024,
            "best_val_loss": 3.0 + index / count,
            "last_val_loss": 3.1,
            "checkpoint": step,
            "eta_seconds": None,
            "started": now - 3600,
            "updated": now - index,
            "wall_time": 3600.0,
            "pid": os.getpid() if state == "running" else 1_000_000_000,
            "process_start": None,
            "host": platform.node(),
            "error": "non-finite loss (nan) at step 500; lower training/lr" if state == "failed" else None,
        }
        (run / "status.json").write_text(json.dumps(status))
        config = "\n".join(
            f"{section}:\n" + "\n".join(f"  key_{k}: {k * 1.5}" for k in range(12)) for section in ("training", "arch")
        )
        (run / "config.yaml").write_text(config + "\n")
        (run / "provenance.json").write_text(json.dumps({"job": status["job"], "host": platform.node()}))
        records = [json.dumps({"step": s, "split": "train", "loss": 4.0 - s / 100}) for s in range(1, 101)]
        (run / "metrics.jsonl").write_text("\n".join(records) + "\n")


def _median_subprocess(command: list[str], repeats: int) -> float:
    times = []
    for index in range(repeats + 1):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=120)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed: {done.stderr.strip()[-300:]}")
        if index:  # the first call warms the page cache and .pyc files
            times.append(elapsed)
    return statistics.median(times)


def measure(count: int = 200, repeats: int = 5) -> list[Row]:
    """The rows of this benchmark, measured over ``count`` synthetic runs."""
    from theseus.tracking.runs import list_runs

    with tempfile.TemporaryDirectory(prefix="theseus-runs-bench-") as scratch:
        root = Path(scratch)
        make_runs(root, count)
        listed = list_runs(root)
        assert len(listed) == count, len(listed)
        assert {r.status for r in listed} == set(STATES), {r.status for r in listed}
        table = _median_subprocess([*theseus_command(), "runs", "--root", str(root)], repeats)
        as_json = _median_subprocess([*theseus_command(), "runs", "--root", str(root), "--json"], repeats)
        jobs = _median_subprocess([*theseus_command(), "jobs"], repeats)
        in_process = statistics.median(_timed(lambda: list_runs(root, sort="updated")) for _ in range(max(3, repeats)))
    return [
        Row(f"`theseus runs` ({count} runs)", table, "s", GOAL_SECONDS, "max", fmt="{:.3f}"),
        Row(f"`theseus runs --json` ({count} runs)", as_json, "s", GOAL_SECONDS, "max", fmt="{:.3f}"),
        Row("`theseus jobs` (same rounds, for scale)", jobs, "s", fmt="{:.3f}"),
        Row(f"listing alone, in process ({count} runs)", in_process, "s", fmt="{:.4f}"),
    ]


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(markdown_table(measure(args.runs, args.repeats), title="theseus runs"))


if __name__ == "__main__":
    main()
