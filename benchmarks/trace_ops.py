"""The operations that take a traced step's time on the device, from a ``training/profile`` trace.

    python benchmarks/trace_ops.py RUN_DIR/profile [--top 10]

Reads the newest ``perfetto_trace.json.gz`` below the folder (what Perfetto opens) and, on the device's
``XLA Ops`` track (every device track where none is named so; the host's when no device track exists),
sums the self time of each op: its duration less that of the ops nested in it, so a loop counts only what
no op inside it covers. Where the trace has ``XLA Modules`` events, only the ops inside the longest one
count (one whole execution of the step). Prints the largest ops, then the time per HLO category
(``convolution fusion``: matmuls, ``loop fusion``: elementwise, ``custom-call``: Pallas kernels and
ragged products: the profiler's ``hlo_category``).
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys
from pathlib import Path
from typing import Any

Track = tuple[Any, Any]


def newest_trace(folder: Path) -> Path:
    traces = sorted(folder.rglob("perfetto_trace.json.gz"), key=lambda path: path.stat().st_mtime)
    if not traces:
        raise FileNotFoundError(f"no perfetto_trace.json.gz below {folder}; run with training/profile=START:STOP")
    return traces[-1]


def thread_names(events: list[dict[str, Any]], kind: str) -> dict[Track, str]:
    """``process_name`` (by pid, tid None) or ``thread_name`` (by pid and tid) metadata."""
    return {
        (e["pid"], None if kind == "process_name" else e.get("tid")): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("name") == kind
    }


def op_tracks(events: list[dict[str, Any]]) -> tuple[str, set[Track]]:
    """(a description, the tracks) holding the device's ops."""
    processes = {pid: name for (pid, _), name in thread_names(events, "process_name").items()}
    threads = thread_names(events, "thread_name")
    devices = {pid for pid, name in processes.items() if name.startswith("/device:")}
    named = {track for track, name in threads.items() if track[0] in devices and name == "XLA Ops"}
    if named:
        return ", ".join(sorted(f"{processes[pid]} XLA Ops" for pid, _ in named)), named
    pids = devices or set(processes)
    tracks = {(e["pid"], e.get("tid")) for e in events if e.get("ph") == "X" and e.get("pid") in pids}
    return ", ".join(sorted(processes[pid] for pid in pids)), tracks


def step_window(events: list[dict[str, Any]]) -> tuple[float, float] | None:
    """(start, end) of the longest ``XLA Modules`` event: one whole execution of the step."""
    threads = thread_names(events, "thread_name")
    modules = [e for e in events if e.get("ph") == "X" and threads.get((e.get("pid"), e.get("tid"))) == "XLA Modules"]
    if not modules:
        return None
    longest = max(modules, key=lambda e: float(e.get("dur", 0.0)))
    return float(longest["ts"]), float(longest["ts"]) + float(longest["dur"])


def self_times(track: list[dict[str, Any]], key: str = "name") -> collections.Counter[str]:
    """Microseconds per event name (or ``args[key]``) on one track, each event less those nested inside it."""
    times: collections.Counter[str] = collections.Counter()
    open_events: list[tuple[float, str]] = []  # (end, label) of the events enclosing the current one
    for event in sorted(track, key=lambda e: (float(e.get("ts", 0.0)), -float(e.get("dur", 0.0)))):
        start, duration = float(event.get("ts", 0.0)), float(event.get("dur", 0.0))
        while open_events and open_events[-1][0] <= start:
            open_events.pop()
        label = str(event.get("name", "?") if key == "name" else event.get("args", {}).get(key, "?"))
        times[label] += duration
        if open_events:
            times[open_events[-1][1]] -= duration
        open_events.append((start + duration, label))
    return times


def step_ops(events: list[dict[str, Any]]) -> tuple[str, list[list[dict[str, Any]]]]:
    """(the tracks read, the ops of one step per track)."""
    description, tracks = op_tracks(events)
    window = step_window(events)
    grouped: dict[Track, list[dict[str, Any]]] = collections.defaultdict(list)
    for event in events:
        track = (event.get("pid"), event.get("tid"))
        if event.get("ph") != "X" or track not in tracks:
            continue
        start = float(event.get("ts", 0.0))
        if window is None or window[0] <= start < window[1]:
            grouped[track].append(event)
    return description, list(grouped.values())


def op_times(events: list[dict[str, Any]], key: str = "name") -> tuple[str, collections.Counter[str]]:
    """(the tracks read, self microseconds per op name or per ``args[key]``) over one step."""
    description, tracks = step_ops(events)
    times: collections.Counter[str] = collections.Counter()
    for track in tracks:
        times.update(self_times(track, key))
    return description, times


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
    window = step_window(events)
    span = f"; one step of {(window[1] - window[0]) / 1e3:.1f} ms" if window else ""
    print(f"{trace} ({tracks}{span}; ops busy {total / 1e3:.1f} ms)")
    for name, micros in times.most_common(args.top):
        print(f"{micros / 1e3:10.2f} ms  {micros / total:6.1%}  {name}")
    print("by HLO category:")
    for category, micros in op_times(events, "hlo_category")[1].most_common(args.top):
        print(f"{micros / 1e3:10.2f} ms  {micros / total:6.1%}  {category}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
