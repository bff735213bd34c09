"""Scanned against unrolled layers by depth on one accelerator: compile time and step time.

    python benchmarks/layer_stack.py                          # 12, 24, 32 and 48 layers, both layouts
    python benchmarks/layer_stack.py --depths 12,24 --batch 8
    python benchmarks/layer_stack.py --cpu-smoke              # tiny sizes on CPU (tests the script)

The gpt2-124m width (768, 12 heads, 50,304-token vocabulary) at each depth, ``--batch`` rows of 1,024
tokens, bf16 activations, ``model/remat=dots`` (so 48 unrolled layers fit one 16 GB chip at 4 rows): the
trainer's step is compiled (seconds of XLA compile, the persistent cache off) and run for a few updates
(median step time). The rule for ``model/scan_layers`` left unset on an accelerator rests on these figures
(``theseus.model.stack.transformer.UNROLL_UP_TO``). All cases run in this one process, one after another.
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, publish_table
from benchmarks.tpu_fit import build_trainer, compile_and_run
from benchmarks.tpu_mfu import Case


def measure(depth: int, scanned: bool, batch: int, smoke: bool) -> Row:
    keys = {"architecture/n_layers": depth, "model/scan_layers": scanned, "model/remat": "dots"}
    case = Case("gpt", "tiny", batch, 64, 256, keys) if smoke else Case("gpt", "gpt2-124m", batch, 1024, 50304, keys)
    with tempfile.TemporaryDirectory() as root:
        trainer, work = build_trainer(case, root)
        found = compile_and_run(trainer, work, steps=4)
        flops = work.flops_per_step()
    gc.collect()
    layout = "scanned" if scanned else "unrolled"
    if not found.get("ran"):
        return Row(f"{depth} layers, {layout}: compile", found.get("compile_seconds"), "s", note=found.get("error", ""))
    step = found["step_seconds"]
    note = f"{step * 1e3:.1f} ms/step, {flops / step / 1e12:.1f} TFLOP/s (model FLOPs)"
    return Row(f"{depth} layers, {layout}: compile", found["compile_seconds"], "s", note=note, fmt="{:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depths", default="12,24,32,48")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a test of the script)")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    depths = [int(depth) for depth in args.depths.split(",")]
    rows = []
    for depth in depths:
        for scanned in (True, False):
            row = measure(depth, scanned, args.batch, args.cpu_smoke)
            print(f"{row.name}: {row.value} {row.note}", file=sys.stderr, flush=True)
            rows.append(row)
    publish_table(rows, args.output, title="layer stack by depth")
    return 0


if __name__ == "__main__":
    sys.exit(main())
