"""Scan over layers: start-up that stays flat in depth, and the steady-state step it costs.

Two measurements, scanned (``model/scan_layers=true``, the default) against unrolled:

* **depth**: a fresh process's wall time until the first training update is done (imports, setup,
  state init, trace, compile, first step; empty compilation cache) at the gpt2-124m width, batch 1,
  sequence 128, with 12 and with 24 layers. Goals: 24 ÷ 12 layers <= 1.25, 12 layers <= 8 s.
* **steady state**: the bare flax + optax step of both layouts timed in interleaved rounds (ratio =
  median per-round scanned ÷ unrolled step time). Goal: within 3 %.

Run ``python benchmarks/scan_layers.py [--quick]`` (``--quick``: tiny shapes, for a smoke test).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_average, machine_line

DEPTH_RATIO_GOAL = 1.25
FIRST_STEP_GOAL = 8.0  # seconds, gpt2-124m width, cold
STEADY_GOAL = 1.03


@dataclass
class DepthRun:
    layers: int
    scanned: bool
    seconds: float  # until the first update is done, cold cache
    warm_seconds: float
    compile_seconds: float
    breakdown: str


def _until_first_step(times: dict[str, float]) -> float:
    from benchmarks.startup import PHASES

    return sum(times[name] for name in PHASES[: PHASES.index("first step") + 1])


def depth_runs(
    preset: str = "gpt2-124m", batch: int = 1, seq: int = 128, depths: tuple[int, ...] = (12, 24)
) -> list[DepthRun]:
    """One cold + warm start-up per (depth, layout), each in fresh processes."""
    from benchmarks.startup import PHASES, startup_breakdown

    runs = []
    for scanned in (True, False):
        for layers in depths:
            overrides = {"architecture/n_layers": layers, "model/scan_layers": scanned}
            result = startup_breakdown(preset, batch, seq, overrides=overrides)
            cold = result["cold"]
            parts = " + ".join(f"{name} {cold[name]:.1f}" for name in PHASES[: PHASES.index("first step") + 1])
            runs.append(
                DepthRun(
                    layers, scanned, _until_first_step(cold), _until_first_step(result["warm"]), cold["compile"], parts
                )
            )
    return runs


def steady_ratio(
    preset: str = "tiny", batch: int = 8, seq: int = 256, *, width: int | None = None, steps: int = 5, repeats: int = 7
) -> dict:
    """Interleaved step times of the bare loop, scanned and unrolled: ``{name: ms, "ratio": x}``."""
    from benchmarks.bare_loop import BareLoop
    from benchmarks.common import interleaved
    from benchmarks.workload import Workload

    loops = []
    for scanned in (True, False):
        overrides = {"model/scan_layers": scanned, **({"architecture/n_embd": width} if width else {})}
        loop = BareLoop(Workload.create(preset, batch=batch, seq=seq, overrides=overrides))
        loop.name = "scanned" if scanned else "unrolled"
        loops.append(loop)
    timings = interleaved(loops, steps=steps, repeats=repeats, warmup=1)
    for loop in loops:
        loop.close()
    a, b = timings["scanned"], timings["unrolled"]
    return {
        "scanned_ms": a.step_seconds * 1e3,
        "unrolled_ms": b.step_seconds * 1e3,
        "ratio": statistics.median(x / y for x, y in zip(a.windows, b.windows, strict=True)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    args = parser.parse_args(argv)
    before = load_average()
    if args.quick:
        depth = depth_runs("tiny", 2, 32, depths=(2, 4))
        steady = {"tiny 2x32": steady_ratio("tiny", 2, 32, steps=2, repeats=2)}
    else:
        depth = depth_runs()
        steady = {
            "tiny 8x256": steady_ratio("tiny", 8, 256),
            "L4 E256 H4 16x256": steady_ratio("tiny", 16, 256, width=256, repeats=5),
        }
    print(f"{machine_line()}; load {before} -> {load_average()}")
    print("first update in a fresh process, empty compilation cache (seconds)")
    for run in depth:
        layout = "scanned" if run.scanned else "unrolled"
        print(
            f"  {layout:9s} {run.layers:3d} layers: {run.seconds:6.1f} (warm {run.warm_seconds:5.1f}; "
            f"compile {run.compile_seconds:5.1f}) = {run.breakdown}"
        )
    for scanned in (True, False):
        mine = sorted((r for r in depth if r.scanned == scanned), key=lambda r: r.layers)
        ratio = mine[-1].seconds / mine[0].seconds
        layout = "scanned" if scanned else "unrolled"
        print(f"  {layout}: {mine[-1].layers} ÷ {mine[0].layers} layers = {ratio:.2f} (goal <= {DEPTH_RATIO_GOAL})")
    print("steady-state step, bare loop, interleaved rounds")
    for where, result in steady.items():
        print(
            f"  {where}: scanned {result['scanned_ms']:.1f} ms, unrolled {result['unrolled_ms']:.1f} ms, "
            f"scanned ÷ unrolled {result['ratio']:.3f} (goal <= {STEADY_GOAL})"
        )


if __name__ == "__main__":
    main()
