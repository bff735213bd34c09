"""GRPO after an SFT warm-up raises held-out arithmetic accuracy: docs/reinforcement-learning.md's
``arithmetic`` flow, run as written, once per seed.

    python benchmarks/rl_arithmetic.py [--seeds 0,1,2] [--sft-steps N] [--grpo-steps N] [--keep DIR]
    python benchmarks/rl_arithmetic.py --set DIGITS=2 --set LAYERS=8 --set WIDTH=256 --set SFT_STEPS=8000 \\
        --set GRPO_STEPS=200   # on the chip: about 3 minutes a seed

The page's flow is a bash script whose variables (``SEED``, ``SFT_STEPS``, ``GRPO_STEPS``, ``DIGITS``,
``LAYERS``, ``WIDTH``, ...) default to the page's values; this script sets ``SEED`` (and the others only
when asked: ``--set NAME=VALUE``), runs the flow in a fresh folder per seed with the installed
``theseus`` on this machine's accelerator (``JAX_PLATFORMS`` as set here; the docs tests keep the flow on
the CPU), and reads the GRPO run's validation records: the accuracy of one completion per held-out draw
at ``rl/eval_temperature`` before the first update (the SFT model, ``training/eval_at_start``) and at
each validation after. It prints one row per seed, the means, the wall time of each phase, and the
rollout share of a GRPO step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make ``tests`` importable
    sys.path.insert(0, str(REPO))

from tests.docs.doc_flows import Shell, page_flows  # noqa: E402  (the docs-flow runner, shared)

PAGE = REPO / "docs" / "reinforcement-learning.md"
FLOW = "arithmetic"
GRPO_RUN = "arithmetic-grpo"


def records(run: Path, split: str) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["split"] == split]


def run_seed(
    seed: int, work: Path, sft_steps: int | None, grpo_steps: int | None, settings: dict[str, str] | None = None
) -> dict[str, Any]:
    """The page's flow for one seed: accuracy before and after GRPO, and where the time went."""
    extra = {**(settings or {}), "SEED": str(seed)}
    if sft_steps is not None:
        extra["SFT_STEPS"] = str(sft_steps)
    if grpo_steps is not None:
        extra["GRPO_STEPS"] = str(grpo_steps)
    shell = Shell.create(work, **extra)
    # the docs tests keep jax on the CPU; the benchmark runs where this machine's jax would
    shell.env.pop("JAX_PLATFORMS", None)
    if "JAX_PLATFORMS" in os.environ:
        shell.env["JAX_PLATFORMS"] = os.environ["JAX_PLATFORMS"]
    shell.timeout = 3600
    (result,) = shell.run(page_flows(PAGE)[FLOW])
    run = shell.root / "runs" / GRPO_RUN
    val = records(run, "val")
    train = records(run, "train")
    # steps 1 and 2 hold the decoder's and the update's compiles
    shares = [row["rollout_share"] for row in train if row["step"] >= 3]
    return {
        "seed": seed,
        "curve": [(row["step"], row["accuracy"]) for row in val],
        "before": val[0]["accuracy"],
        "after": val[-1]["accuracy"],
        "steps": val[-1]["step"],
        "rollout_share": statistics.median(shares) if shares else float("nan"),
        "seconds": result.seconds,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT_STEPS (default: the page's)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO_STEPS (default: the page's)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="a flow variable")
    parser.add_argument("--keep", default="", help="run in this folder and keep it (default: a temporary one)")
    parser.add_argument("--json", default="", help="also write the rows to this file")
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    settings = dict(item.split("=", 1) for item in args.set)
    if settings:
        print("flow variables: " + " ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    with tempfile.TemporaryDirectory(prefix="rl-arithmetic-") as scratch:
        base = Path(args.keep or scratch)
        rows = []
        for seed in seeds:
            row = run_seed(seed, base / f"seed-{seed}", args.sft_steps, args.grpo_steps, settings)
            rows.append(row)
            curve = ", ".join(f"{step}: {acc:.1%}" for step, acc in row["curve"])
            print(
                f"seed {seed}: held-out accuracy {row['before']:.1%} -> {row['after']:.1%} over {row['steps']} "
                f"GRPO steps ({curve}); rollout share {row['rollout_share']:.0%}; flow {row['seconds']:.0f} s",
                flush=True,
            )
    before = [r["before"] for r in rows]
    after = [r["after"] for r in rows]
    spread = lambda xs: f" ± {statistics.stdev(xs):.1%}" if len(xs) > 1 else ""  # noqa: E731
    print(
        f"mean over {len(rows)} seeds: {statistics.mean(before):.1%}{spread(before)} after SFT -> "
        f"{statistics.mean(after):.1%}{spread(after)} after GRPO; improved in "
        f"{sum(a > b for a, b in zip(after, before, strict=True))} of {len(rows)}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
