"""Splash attention against XLA's on a TPU: agreement for every mask the families use, then speed and memory.

    python benchmarks/tpu_attention.py                   # on a TPU: parity cases, then timings to 32k tokens
    python benchmarks/tpu_attention.py --parts parity    # only the agreement cases
    python benchmarks/tpu_attention.py --cpu-smoke       # tiny sizes, Pallas interpreted on CPU (tests the script)

**Parity.** The cases of tests/models/test_splash_attention.py (causal, key padding, packed rows, sliding
window, Llama 4's chunks, soft-capped scores, sinks, grouped heads) in bf16: each kernel's output and the
gradients of q, k, v (and sinks) through a fixed random projection of the real positions' outputs, against
a float32 XLA reference at the highest matmul precision. XLA's attention in bf16 is measured against the
same reference, so the table shows the kernel's error beside the error bf16 itself brings.

**Speed.** Forward + backward of causal attention, 16 heads of 64, a fixed 16k tokens per call (batch =
16384 / T), medians of timed calls; XLA's peak bytes from the compiled program's memory analysis.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, median_seconds, publish_table


@dataclasses.dataclass(frozen=True)
class Setting:
    batch: int
    steps: int
    heads: int
    kv_heads: int
    head_dim: int
    tokens: int  # per timed call
    lengths: tuple[int, ...]
    repeats: int
    blocks: tuple[int, ...] = (512,)  # splash block sizes timed


CHIP = Setting(2, 1024, 8, 4, 128, 16384, (1024, 2048, 4096, 8192, 16384, 32768), 5, (256, 512, 1024))
CPU_SMOKE = Setting(2, 256, 4, 2, 32, 512, (256,), 1)


def cases(steps: int) -> dict[str, dict[str, Any]]:
    """The masks checked: keyword arguments of ``dot_product_attention`` (arrays built by :func:`inputs`)."""
    return {
        "causal": {},
        "key padding": {"padding_mask": "padding"},
        "packed rows": {"padding_mask": "segments"},
        "sliding window": {"window": steps // 4 + 3},
        "chunks (Llama 4)": {"chunk": steps // 4},
        "soft cap (Gemma 2)": {"softcap": 5.0, "scale": 0.2},
        "sinks (GPT-OSS)": {"sinks": "sinks", "window": steps // 2},
    }


def inputs(setting: Setting, dtype: Any) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp

    b, t, h, kv, d = setting.batch, setting.steps, setting.heads, setting.kv_heads, setting.head_dim
    keys = jax.random.split(jax.random.key(0), 5)
    index = jnp.arange(t)[None, :]
    lengths = jnp.array([t, t - t // 5] + [t] * (b - 2))[:, None]
    segments = jnp.where(index < t // 3, 1, jnp.where(index < t - t // 8, 2, 0))
    return {
        "q": jax.random.normal(keys[0], (b, t, h, d)).astype(dtype),  # drawn in float32: one input per case
        "k": jax.random.normal(keys[1], (b, t, kv, d)).astype(dtype),
        "v": jax.random.normal(keys[2], (b, t, kv, d)).astype(dtype),
        "sinks": jax.random.normal(keys[3], (h,), jnp.float32),
        "probe": jax.random.normal(keys[4], (b, t, h, d), jnp.float32),
        "padding": index < lengths,
        "segments": jnp.broadcast_to(segments, (b, t)).astype(jnp.int32),
    }


def parity_rows(setting: Setting) -> list[Row]:
    """Relative error (max |a - ref| / max |ref|) of the output and each gradient, splash and XLA in bf16."""
    import jax
    import jax.numpy as jnp

    from theseus.model.layers.attention import dot_product_attention

    rows = []
    for name, spec in cases(setting.steps).items():
        errors: dict[str, list[float]] = {}
        results = {}
        for label, impl, dtype in (
            ("ref", "xla", jnp.float32),
            ("xla", "xla", jnp.bfloat16),
            ("splash", "splash", jnp.bfloat16),
        ):
            arrays = inputs(setting, dtype)
            kwargs = {key: arrays[value] if isinstance(value, str) else value for key, value in spec.items()}
            kwargs.pop("sinks", None)
            sinks = arrays["sinks"] if "sinks" in spec else None
            mask = kwargs.get("padding_mask")
            real = None if mask is None else (mask > 0 if mask.dtype != jnp.bool_ else mask)

            def probe(
                q: Any,
                k: Any,
                v: Any,
                s: Any,
                impl: str = impl,
                kwargs: dict = kwargs,
                real: Any = real,
                arrays: dict = arrays,
            ) -> Any:
                out = dot_product_attention(
                    q, k, v, mask=None, is_causal=True, implementation=impl, sinks=s, **kwargs
                ).astype(jnp.float32)
                if real is not None:
                    out = jnp.where(real[:, :, None, None], out, 0.0)
                return jnp.sum(out * arrays["probe"]), out

            with jax.default_matmul_precision("highest" if label == "ref" else "default"):
                grad = jax.jit(jax.grad(probe, argnums=(0, 1, 2, 3), has_aux=True))
                grads, out = grad(arrays["q"], arrays["k"], arrays["v"], sinks)
            results[label] = (out, *grads)
        ref = results["ref"]
        for label in ("xla", "splash"):
            errors[label] = [
                float(jnp.max(jnp.abs(a.astype(jnp.float32) - r)) / jnp.maximum(jnp.max(jnp.abs(r)), 1e-30))
                for a, r in zip(results[label], ref, strict=True)
                if r is not None
            ]
        names = ["out", "dq", "dk", "dv"] + (["dsinks"] if "sinks" in spec else [])
        note = ", ".join(
            f"{n} {s:.2e} (xla {x:.2e})" for n, s, x in zip(names, errors["splash"], errors["xla"], strict=True)
        )
        rows.append(Row(f"parity: {name}", max(errors["splash"]), "rel", note=note, fmt="{:.2e}"))
    return rows


def speed_rows(setting: Setting) -> list[Row]:
    """Forward + backward milliseconds of XLA and splash attention (each block size) per sequence length."""
    import jax
    import jax.numpy as jnp

    from theseus.model.layers import splash

    rows = []
    default_block = splash.BLOCK
    for steps in setting.lengths:
        batch = max(1, setting.tokens // steps)
        keys = jax.random.split(jax.random.key(1), 3)
        q, k, v = (jax.random.normal(key, (batch, steps, 16, 64), jnp.bfloat16) for key in keys)
        seconds: dict[str, float] = {}
        notes = []
        for label, block in [("xla", None)] + [(f"splash/{b}", b) for b in setting.blocks]:
            splash.BLOCK = block or default_block
            try:
                took, peak = _time_attention("xla" if block is None else "splash", q, k, v, setting.repeats)
                seconds[label] = took
                notes.append(f"{label} {took * 1e3:.1f} ms {peak / 1e9:.2f} GB")
            except Exception as error:  # out of memory: reported, the next variant still runs
                notes.append(f"{label} failed: {str(error).splitlines()[0][:60]}")
        splash.BLOCK = default_block
        kernels = {label: t for label, t in seconds.items() if label != "xla"}
        best = min(kernels, key=kernels.__getitem__) if kernels else None
        ratio = seconds["xla"] / kernels[best] if best and "xla" in seconds else None
        note = f"{batch}x{steps}, best {best}: " + "; ".join(notes)
        rows.append(Row(f"splash speed-up, T={steps}", ratio, "x", note=note, fmt="{:.2f}"))
    return rows


def _time_attention(impl: str, q: Any, k: Any, v: Any, repeats: int) -> tuple[float, float]:
    """(median seconds, compiled argument + temporary bytes) of causal attention's forward and backward."""
    import jax
    import jax.numpy as jnp

    from theseus.model.layers.attention import dot_product_attention

    def loss(q: Any, k: Any, v: Any) -> Any:
        out = dot_product_attention(q, k, v, mask=None, is_causal=True, implementation=impl)
        return jnp.sum(out.astype(jnp.float32))

    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(q, k, v).compile()
    memory = compiled.memory_analysis()
    peak = getattr(memory, "temp_size_in_bytes", 0) + getattr(memory, "argument_size_in_bytes", 0)
    call = functools.partial(compiled, q, k, v)
    return median_seconds(functools.partial(_ready, call), repeats=repeats), peak


def _ready(call: Any) -> Any:
    import jax

    return jax.block_until_ready(call())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU, Pallas interpreted")
    parser.add_argument("--parts", default="parity,speed", help="comma-separated: parity, speed")
    parser.add_argument("--lengths", help="comma-separated sequence lengths to time (default: all)")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    import jax

    if not args.cpu_smoke and jax.default_backend() != "tpu":
        print(f"error: no TPU visible to jax (backend {jax.default_backend()!r}); use --cpu-smoke on CPU")
        return 2
    setting = CPU_SMOKE if args.cpu_smoke else CHIP
    if args.lengths:
        setting = dataclasses.replace(setting, lengths=tuple(int(n) for n in args.lengths.split(",")))
    parts = set(args.parts.split(","))
    started = time.perf_counter()
    rows: list[Row] = [Row("Device", None, note=str(jax.devices()[0].device_kind))]
    if "parity" in parts:
        rows += parity_rows(setting)
    if "speed" in parts:
        rows += speed_rows(setting)
    publish_table(rows, args.output, title="splash attention", extra=f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
