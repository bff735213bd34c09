"""The operations that take a traced step's time on the device, from a ``training/profile`` trace.

    python benchmarks/trace_ops.py RUN_DIR/profile [--top 10]

Reads the newest ``perfetto_trace.json.gz`` below the folder (what Perfetto opens), sums the duration of
each complete event per name on the device's tracks (``/device:...``; the host's when no device track
exists) and prints the largest with their share of the device's busy time.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path
from typing import Any


def newest_trace(folder: Path) -> Path:
    traces = sorted(folder.rglob("perfetto_trace.json.gz"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no perfetto_trace.json.gz below {folder}; run with training/profile=START:STOP")
    return traces[-1]


def op_times(events: list[dict[str, Any]]) -> tuple[str, collections.Counter[str]]:
    """(the tracks read, microseconds per event name) of the device tracks, else of the host's."""
    processes = {e["pid"]: str(e.get("args", {}).get("name", "")) for e in events if e.get("name") == "process_name"}
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    chosen = devices or set(processes)
    times: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("pid") in chosen:
            times[str(event.get("name", "?"))] += float(event.get("dur", 0.0))
    return ", ".join(sorted(processes[pid] for pid in chosen)), times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="a run's profile/ folder (or any folder above the trace)")
    parser.add_argument("--top", type=int, default=10)
    args = parser.parse_args(argv)
    trace = newest_trace(args.folder)
    loaded = json.loads(gzip.decompress(trace.read_bytes()))
    events = loaded["traceEvents"] if isinstance(loaded, dict) else loaded
    tracks, times = op_times(events)
    total = sum(times.values()) or 1.0
    print(f"{trace} ({tracks})")
    for name, micros in times.most_common(args.top):
        print(f"{micros / 1e3:10.2f} ms  {micros / total:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
