"""MFU and tokens/s of the GPT-2 124M preset in bf16 on a GPU (Hopper: H100/H200), as one short script.

    python benchmarks/gpu_mfu.py                 # on a GPU machine: 124M, bf16 activations, 16x1024
    python benchmarks/gpu_mfu.py --batch 32      # another batch size
    python benchmarks/gpu_mfu.py --cpu-smoke     # tiny sizes on CPU: keeps the script tested

Measured side by side (interleaved rounds, medians after warm-up): our ``trainer.run()`` loop, the
minimal flax + optax loop on the same model and batches, and a large bf16 matmul. MFU is model FLOP/s
(``GPT.flops(seq)`` x batch / step time) over the device's published dense bf16 peak (goal >= 45% on
Hopper), and also over the measured matmul rate. Parameters stay float32, activations are bfloat16
(mixed precision); attention uses the model's ``auto`` path (cuDNN flash attention on GPU in bf16).
The whole run finishes in well under 5 minutes on an H100/H200.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, Timing, paired_ratio, percent, publish_table
from theseus.base.chips import published_peak

MFU_GOAL = 0.45


@dataclasses.dataclass(frozen=True)
class Setting:
    preset: str
    batch: int
    seq: int
    vocab: int | None
    matmul_size: int
    steps: int
    repeats: int
    warmup: int
    activation_dtype: str = "bfloat16"
    param_dtype: str = "float32"
    bare: bool = True
    peak_seconds: float = 1.0  # the in-round matmul window lasts at least this long
    #: further model configuration (tests shrink the model with it)
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)


GPU = Setting("gpt2-124m", 16, 1024, None, 8192, 10, 3, 3)
CPU_SMOKE = Setting("tiny", 2, 32, None, 128, 1, 1, 0, peak_seconds=0.0)


def measure(setting: Setting, log: Any = print) -> list[Row]:
    """Every row of the GPU table for ``setting``."""
    import jax

    from benchmarks.bare_loop import RUN_LOOP, BareLoop, measure_trainer_loop
    from benchmarks.common import Loop
    from benchmarks.peak import PeakLoop
    from benchmarks.workload import Workload

    device = jax.devices()[0]
    kind = str(getattr(device, "device_kind", device.platform))
    published = published_peak(kind) if device.platform == "gpu" else None
    log(f"device: {kind} ({device.platform}, {jax.device_count()} visible); published bf16 peak: {published}")

    work = Workload.create(
        setting.preset,
        batch=setting.batch,
        seq=setting.seq,
        vocab_size=setting.vocab,
        activation_dtype=setting.activation_dtype,
        param_dtype=setting.param_dtype,
        overrides=setting.model_overrides,
    )
    where = f"{setting.preset} {setting.batch}x{setting.seq}, {setting.activation_dtype} activations"
    peak_loop = PeakLoop(setting.matmul_size, "bfloat16", chain=8, min_seconds=setting.peak_seconds)
    others: list[Loop] = [peak_loop]
    if setting.bare:
        others.append(BareLoop(work))
    start = time.perf_counter()
    try:
        timings = measure_trainer_loop(
            work, others, steps=setting.steps, repeats=setting.repeats, warmup=setting.warmup
        )
    finally:
        for loop in others:
            loop.close()
    log(f"measured in {time.perf_counter() - start:.0f} s")
    ours, peak = timings[RUN_LOOP], timings[peak_loop.name]
    bare = timings.get(BareLoop.name)
    assert ours.flops_per_s is not None and peak.flops_per_s is not None

    rows = [
        Row("Device", None, note=f"{kind}; {jax.device_count()} device(s), one used"),
        Row("Published dense bf16 peak", None if published is None else published / 1e12, "TFLOP/s", fmt="{:.0f}"),
        Row(
            f"Measured bf16 matmul (size {setting.matmul_size}, in-round median)",
            peak.flops_per_s / 1e12,
            "TFLOP/s",
            fmt="{:.3g}",
        ),
        _tokens(f"Our trainer.run() loop ({where})", ours),
    ]
    if bare is not None:
        rows.append(_tokens(f"Bare flax+optax loop ({where})", bare))
        rows.append(
            Row(
                "Framework overhead: trainer.run() ÷ bare",
                paired_ratio(ours, bare),
                "x",
                1.03,
                "max",
                "step-time ratio, median of paired rounds",
                "{:.3f}",
            )
        )
    note = f"{ours.flops_per_s / 1e12:.3g} TFLOP/s of model FLOPs"
    if published is not None:
        rows.append(percent(f"MFU vs published peak ({where})", ours.flops_per_s / published, MFU_GOAL, note))
    else:
        rows.append(percent(f"MFU vs published peak ({where})", None, MFU_GOAL, f"no published peak for {kind}"))
    rows.append(percent("MFU vs measured bf16 matmul", ours.flops_per_s / peak.flops_per_s, None, note))
    if bare is not None and bare.flops_per_s is not None and published is not None:
        rows.append(percent("MFU of the bare loop vs published peak", bare.flops_per_s / published))
    return rows


def _tokens(name: str, timing: Timing) -> Row:
    return Row(
        name,
        timing.tokens_per_s,
        "tok/s",
        note=f"{timing.step_seconds * 1e3:.1f} ms/step, first step {timing.first_step_seconds:.1f} s",
        fmt="{:,.0f}",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a test of the script)")
    parser.add_argument("--batch", type=int, help="rows per step (default 16; smoke 2)")
    parser.add_argument("--seq", type=int, help="sequence length (default 1024; smoke 32)")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default 50257; e.g. 50304 = padded to 64)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare flax+optax loop")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    setting = CPU_SMOKE if args.cpu_smoke else GPU
    changes: dict[str, Any] = {}
    for key in ("batch", "seq", "vocab"):
        if getattr(args, key) is not None:
            changes[key] = getattr(args, key)
    if args.no_bare:
        changes["bare"] = False
    setting = dataclasses.replace(setting, **changes)
    if not args.cpu_smoke:
        import jax

        if jax.default_backend() != "gpu":
            print(f"error: no GPU visible to jax (backend {jax.default_backend()!r}); use --cpu-smoke on CPU")
            return 2
    started = time.perf_counter()
    rows = measure(setting, log=lambda text: print(text, file=sys.stderr, flush=True))
    mode = "cpu-smoke" if args.cpu_smoke else "gpu"
    publish_table(
        rows, args.output, title="theseus GPU MFU", extra=f"mode: {mode}, {time.perf_counter() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
