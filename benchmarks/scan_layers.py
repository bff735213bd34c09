"""Scan over layers: start-up that stays flat in depth, and the steady-state step it costs.

Two measurements, scanned (``model/scan_layers=true``; by default from 8 layers on) against unrolled:

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

from benchmarks.common import load_average, machine_line, start_like_theseus_run

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


def steady_state(
    preset: str = "tiny",
    batch: int = 8,
    seq: int = 256,
    *,
    width: int | None = None,
    layers: int | None = None,
    unrolls: tuple[int, ...] = (1, 2),
    steps: int = 5,
    repeats: int = 7,
) -> dict[str, tuple[float, float]]:
    """The bare loop unrolled and scanned with each ``model/scan_unroll`` in ``unrolls``, timed in
    interleaved rounds: ``{name: (ms per step, median per-round ratio to unrolled)}``. ``width`` and ``layers``
    replace the preset's."""
    from benchmarks.bare_loop import BareLoop
    from benchmarks.common import interleaved
    from benchmarks.workload import Workload

    shape = {"architecture/n_embd": width} if width else {}
    if layers:
        shape["architecture/n_layers"] = layers
    variants = {"unrolled": {"model/scan_layers": False}}
    variants.update({f"scanned, unroll {u}": {"model/scan_layers": True, "model/scan_unroll": u} for u in unrolls})
    loops = []
    for name, overrides in variants.items():
        loop = BareLoop(Workload.create(preset, batch=batch, seq=seq, overrides={**shape, **overrides}))
        loop.name = name
        loops.append(loop)
    timings = interleaved(loops, steps=steps, repeats=repeats, warmup=1)
    for loop in loops:
        loop.close()
    base = timings["unrolled"]
    return {
        name: (t.step_seconds * 1e3, statistics.median(x / y for x, y in zip(t.windows, base.windows, strict=True)))
        for name, t in timings.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    parser.add_argument("--steady-only", action="store_true", help="skip the start-up runs")
    args = parser.parse_args(argv)
    before = load_average()
    print(f"{machine_line()}; load {before}", flush=True)
    if args.steady_only:
        depth = []
    elif args.quick:
        depth = depth_runs("tiny", 2, 32, depths=(2, 4))
    else:
        depth = depth_runs()
    print("first update in a fresh process, empty compilation cache (seconds)")
    for run in depth:
        layout = "scanned" if run.scanned else "unrolled"
        print(
            f"  {layout:9s} {run.layers:3d} layers: {run.seconds:6.1f} (warm {run.warm_seconds:5.1f}; "
            f"compile {run.compile_seconds:5.1f}) = {run.breakdown}"
        )
    for scanned in (True, False) if depth else ():
        mine = sorted((r for r in depth if r.scanned == scanned), key=lambda r: r.layers)
        ratio = mine[-1].seconds / mine[0].seconds
        layout = "scanned" if scanned else "unrolled"
        print(f"  {layout}: {mine[-1].layers} ÷ {mine[0].layers} layers = {ratio:.2f} (goal <= {DEPTH_RATIO_GOAL})")
    print(f"steady-state step, bare loop, interleaved rounds (goal: scanned ÷ unrolled <= {STEADY_GOAL})", flush=True)
    shapes = (
        {"tiny 2x32": dict(preset="tiny", batch=2, seq=32, steps=2, repeats=2)}
        if args.quick
        else {
            "tiny 8x256": dict(preset="tiny", batch=8, seq=256, unrolls=(1, 2, 4), repeats=9),
            "L4 E256 H4 16x256": dict(preset="tiny", batch=16, seq=256, width=256, repeats=5),
        }
    )
    for where, kwargs in shapes.items():
        for name, (ms, ratio) in steady_state(**kwargs).items():  # type: ignore[arg-type]
            print(f"  {where}: {name:18s} {ms:8.1f} ms  ÷ unrolled {ratio:.3f}", flush=True)
    print(f"load {load_average()}")


if __name__ == "__main__":
    start_like_theseus_run()
    main()
