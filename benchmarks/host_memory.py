"""Huge pages for XLA's host buffers, as ``theseus run`` sets them, against glibc's defaults.

See :mod:`theseus.base.host_memory`.

The setting is per process, so each side runs the bare flax + optax loop in its own fresh process
(``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``, or glibc's defaults), the two alternating for ``--rounds``
rounds. Each process reports, over a window of steady-state steps: wall time per step, kernel (system)
CPU time per step, minor page faults per step and its peak resident memory. The ratio is the median
over rounds of ``huge ÷ system`` step time.

Run ``python benchmarks/host_memory.py [--preset tiny --batch 8 --seq 256]``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, add_workload_arguments

SIDES = ("huge", "system")


@dataclass
class Window:
    side: str
    step_seconds: float
    system_seconds: float  # kernel CPU time per step
    page_faults: float  # minor page faults per step
    peak_rss_mb: float  # the process's peak resident memory


def measure_window(
    preset: str, batch: int, seq: int, steps: int, warmup: int, overrides: dict[str, Any] | None = None
) -> dict[str, float]:
    """In this process: the bare loop's steady-state step time, kernel time and page faults per step."""
    from benchmarks.bare_loop import BareLoop
    from benchmarks.workload import Workload

    loop = BareLoop(Workload.create(preset, batch=batch, seq=seq, overrides=overrides))
    loop.prepare(warmup)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    loop.run(steps)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    return {
        "step_seconds": seconds / steps,
        "system_seconds": (after.ru_stime - before.ru_stime) / steps,
        "page_faults": (after.ru_minflt - before.ru_minflt) / steps,
        "peak_rss_mb": after.ru_maxrss / 1024,
    }


def run_side(
    side: str, preset: str, batch: int, seq: int, steps: int, warmup: int, overrides: dict[str, Any] | None = None
) -> Window:
    """One fresh process with the allocator of ``side``."""
    from theseus.base.host_memory import ENV_SWITCH, TUNABLES, huge_page_environment

    plain = {k: v for k, v in os.environ.items() if k != TUNABLES}
    if side == "system":
        env = dict(plain, **{ENV_SWITCH: "system"})
    else:
        huge = huge_page_environment(plain)
        if huge is None:
            raise RuntimeError("transparent huge pages are not available here (glibc >= 2.35 and THP needed)")
        env = huge
    command = [sys.executable, str(Path(__file__).resolve()), "--child"]
    command += ["--preset", preset, "--batch", str(batch), "--seq", str(seq), "--steps", str(steps)]
    command += ["--warmup", str(warmup), "--overrides", json.dumps(overrides or {})]
    done = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{side} process failed: {done.stderr.strip().splitlines()[-1:]}")
    return Window(side, **json.loads(done.stdout.strip().splitlines()[-1]))


def compare(
    preset: str,
    batch: int,
    seq: int,
    *,
    steps: int,
    warmup: int,
    rounds: int,
    overrides: dict[str, Any] | None = None,
) -> list[Window]:
    """``rounds`` x (huge, system) windows, alternating which side goes first."""
    windows = []
    for index in range(rounds):
        for side in SIDES if index % 2 == 0 else SIDES[::-1]:
            windows.append(run_side(side, preset, batch, seq, steps, warmup, overrides))
    return windows


def huge_ratio(windows: list[Window]) -> float:
    """Median over rounds of huge ÷ system step time."""
    huge = [w.step_seconds for w in windows if w.side == "huge"]
    system = [w.step_seconds for w in windows if w.side == "system"]
    return statistics.median(h / s for h, s in zip(huge, system, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--overrides", type=json.loads, default={}, help="model configuration values, as JSON")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure_window(args.preset, args.batch, args.seq, args.steps, args.warmup, args.overrides)))
        return
    windows = compare(
        args.preset,
        args.batch,
        args.seq,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        overrides=args.overrides,
    )
    print(f"{args.preset} {args.batch}x{args.seq}, {args.rounds} rounds of {args.steps} steps")
    for side in SIDES:
        mine = [w for w in windows if w.side == side]
        print(
            f"{side:<7} {statistics.median(w.step_seconds for w in mine) * 1e3:8.1f} ms/step "
            f"{statistics.median(w.system_seconds for w in mine) * 1e3:7.1f} ms kernel/step "
            f"{statistics.median(w.page_faults for w in mine):9.0f} page faults/step "
            f"{statistics.median(w.peak_rss_mb for w in mine):7.0f} MB peak RSS"
        )
    print(f"huge ÷ system step time: {huge_ratio(windows):.3f}")


if __name__ == "__main__":
    main()
