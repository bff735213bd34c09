"""Generation's first-call compile time and steady decoding speed, on whatever device jax sees.

    python benchmarks/generation_compile.py                  # Llama 350M shape, 64 prompts x 256 new tokens
    python benchmarks/generation_compile.py --looped         # also the decoder with its layers in a loop
    python benchmarks/generation_compile.py --cpu-smoke      # tiny sizes on CPU (tests the script)

The decoder (``theseus.model.generation.decode``) compiles one program per (batch, prompt length, new
tokens, sampling): the prefill, then a ``while_loop`` over tokens per stretch of growing cache views.
Its ``_sample`` is compiled ahead of time on the benchmark's random bfloat16 weights (trace + lower, then
XLA's compile, timed apart), then the compiled program is called in rounds: new tokens/s count every
row's new tokens (no end-of-text id: all are generated), the prefill included. The program's size is
read from its HLO: ``while`` loops and matrix products. The layers run as the decoder runs them on
this device by default (``decode.layer_loop``: looped on a TPU, unrolled elsewhere); ``--unrolled`` adds
the same generation with the layers unrolled, ``--looped`` with them looped.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, publish_table


@dataclasses.dataclass(frozen=True)
class Setting:
    layers: int = 24
    width: int = 1024
    heads: int = 16
    kv_heads: int = 8
    vocab: int = 32000
    batch: int = 64
    prompt: int = 64
    new_tokens: int = 256
    rounds: int = 3
    dtype: str = "bfloat16"


CPU_SMOKE = Setting(layers=8, width=64, heads=4, kv_heads=2, vocab=257, batch=4, prompt=8, new_tokens=24, rounds=1)


def build(setting: Setting) -> tuple[Any, Any]:
    """A Llama (preset ``tiny`` resized to ``setting``, layers scanned) with random parameters and activations
    in ``setting.dtype``."""
    import jax
    import jax.numpy as jnp

    from theseus.config import configuration, configure
    from theseus.model.models import Llama

    values = {
        "architecture/preset": "tiny",
        "architecture/n_layers": setting.layers,
        "architecture/n_embd": setting.width,
        "architecture/n_heads": setting.heads,
        "architecture/n_kv_heads": setting.kv_heads,
        "architecture/vocab_size": setting.vocab,
        "architecture/block_size": setting.prompt + setting.new_tokens,
        "model/activation_dtype": setting.dtype,
        "model/scan_layers": True,
    }
    with configuration(values):
        model = configure(Llama)
    params = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])()
    params = jax.tree.map(lambda x: x.astype(setting.dtype), jax.tree.map(lambda x: getattr(x, "value", x), params))
    return model, params


def measure_variant(setting: Setting, model: Any, params: Any, loop: bool) -> dict[str, Any]:
    """Compile seconds (trace + lower, compile), program size and new tokens/s of one decoder variant."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from theseus.model.generation import decode
    from theseus.model.generation.sampling import SamplingParams
    from theseus.model.stack.decoding import unrolled_model

    rng = np.random.default_rng(0)
    prompts = rng.integers(0, setting.vocab - 1, (setting.batch, setting.prompt)).tolist()
    ids, mask = decode.left_pad(prompts)
    platform = jax.devices()[0].platform
    limits = tuple(decode.view_limits(setting.prompt, setting.new_tokens, decode.decode_stretches(platform)))
    slots = setting.prompt + setting.new_tokens - 1

    def args() -> tuple[Any, ...]:  # a new cache each call: the decoder donates it
        cache = decode.empty_cache(model if loop else unrolled_model(model), setting.batch, slots)
        return (params, cache, jnp.asarray(ids), jnp.asarray(mask), jnp.int32(0), jnp.asarray([-1], jnp.int32))

    static = {
        "model": model,
        "max_new_tokens": setting.new_tokens,
        "sampling": SamplingParams(temperature=1.0, top_p=0.95),
        "limits": limits,
        "loop": loop,
    }
    began = time.perf_counter()
    lowered = decode._sample.trace(*args(), **static).lower()
    traced = time.perf_counter()
    compiled = lowered.compile()
    done = time.perf_counter()
    text = compiled.as_text()
    first = time.perf_counter()
    jax.block_until_ready(compiled(*args()))
    first_run = time.perf_counter() - first
    seconds = []
    for _ in range(setting.rounds):
        given = args()
        start = time.perf_counter()
        out, _, _ = compiled(*given)
        jax.block_until_ready(out)
        seconds.append(time.perf_counter() - start)
    return {
        "tokens": np.asarray(out),
        "lower": traced - began,
        "compile": done - traced,
        "first_run": first_run,
        "seconds": statistics.median(seconds),
        "whiles": len(re.findall(r"\bwhile\(", text)),
        "products": len(re.findall(r"\b(?:dot|convolution)\(", text)),
        "limits": list(limits),
    }


def measure(setting: Setting, variants: dict[str, bool]) -> list[Row]:
    import jax

    from theseus.model.stack.decoding import loops_layers

    model, params = build(setting)
    if not loops_layers(model):
        raise SystemExit("the benchmark's model should loop its layers; see theseus.model.stack.decoding.loops_layers")
    tokens = setting.batch * setting.new_tokens
    rows, drawn = [], []
    for name, loop in variants.items():
        got = measure_variant(setting, model, params, loop)
        drawn.append(got["tokens"])
        shape = f"{got['whiles']} while loops, {got['products']} matrix products; stretches {got['limits']}"
        rows.append(Row(f"{name}: trace + lower", got["lower"], "s", fmt="{:.1f}"))
        rows.append(Row(f"{name}: compile", got["compile"], "s", note=shape, fmt="{:.1f}"))
        step = got["seconds"] / setting.new_tokens
        note = f"{step * 1e3:.2f} ms/step; first run {got['first_run']:.2f} s; {jax.devices()[0].device_kind}"
        rows.append(Row(f"{name}: new tokens/s", tokens / got["seconds"], "tok/s", note=note, fmt="{:,.0f}"))
    if len(drawn) > 1:  # the same seed and sampling: the variants should draw the same tokens
        same = float((drawn[0] == drawn[1]).all(axis=1).mean())
        rows.append(Row("rows drawn alike by both variants", 100 * same, "%", fmt="{:.0f}"))
    return rows


def agreement(setting: Setting, model: Any, params: Any) -> list[Row]:
    """How far the looped layers' logits are from the unrolled ones, against how far both are from the
    training forward pass: the prefill's last-position logits three ways, then greedy generations."""
    import jax
    import numpy as np

    from theseus.model.generation import decode
    from theseus.model.generation.sampling import SamplingParams
    from theseus.model.stack.decoding import cached_step, init_cache, looped_step, unrolled

    rows_count, new = min(setting.batch, 16), min(setting.new_tokens, 32)
    prompts = np.random.default_rng(1).integers(0, setting.vocab - 1, (rows_count, setting.prompt))
    ids, mask = decode.left_pad(prompts.tolist())
    forward = jax.jit(lambda p, x: model.apply({"params": p}, x, deterministic=True)[0][:, -1])(params, ids)
    flat, flat_params = unrolled(model, params)
    length = setting.prompt + new - 1
    step = jax.jit(cached_step, static_argnums=0)
    plain = step(flat, flat_params, init_cache(flat, rows_count, length), ids, mask)[0][:, -1]
    looped = jax.jit(looped_step, static_argnums=0)(model, params, init_cache(model, rows_count, length), ids, mask)
    logits = {"forward": forward, "unrolled": plain, "looped": looped[0][:, -1]}
    logits = {name: np.asarray(value, np.float32) for name, value in logits.items()}
    top = np.sort(logits["forward"], axis=-1)
    gap = float(np.median(top[:, -1] - top[:, -2]))
    scale = f"{setting.dtype}; logits std {logits['forward'].std():.3g}, median top-1 lead {gap:.3g}"
    rows = []
    for a, b in (("unrolled", "forward"), ("looped", "forward"), ("looped", "unrolled")):
        same = float((logits[a].argmax(-1) == logits[b].argmax(-1)).mean())
        note = f"top-1 alike in {100 * same:.0f} % of rows; {scale}"
        rows.append(
            Row(
                f"prefill logits, {a} against {b}: largest difference",
                float(np.abs(logits[a] - logits[b]).max()),
                note=note,
                fmt="{:.3g}",
            )
        )
    greedy = SamplingParams(temperature=0.0)
    drawn = [
        np.asarray(
            [
                c.tokens + [-1] * (new - len(c.tokens))
                for c in decode.generate_tokens(model, params, prompts.tolist(), new, sampling=greedy, loop_layers=loop)
            ]
        )
        for loop in (False, True)
    ]
    first = float((drawn[0][:, 0] == drawn[1][:, 0]).mean())
    best = logits["forward"].argmax(-1)
    own = ", ".join(
        f"{name} {100 * float((d[:, 0] == best).mean()):.0f} %"
        for name, d in zip(("unrolled", "looped"), drawn, strict=True)
    )
    note = f"first token alike in {100 * first:.0f} % of rows; the forward pass's top-1 first: {own}"
    alike = 100 * float((drawn[0] == drawn[1]).all(axis=1).mean())
    rows.append(Row("greedy generations, looped against unrolled: rows alike", alike, "%", note=note, fmt="{:.0f}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--unrolled", action="store_true", help="also time the decoder with its layers unrolled")
    parser.add_argument("--looped", action="store_true", help="also time the decoder with its layers in a loop")
    parser.add_argument("--layers", type=int, help="override the setting's layers")
    parser.add_argument("--rounds", type=int, help="override the timed rounds")
    parser.add_argument("--agreement", action="store_true", help="only compare looped, unrolled and forward logits")
    parser.add_argument("--dtype", default="bfloat16", help="activations and parameters (bfloat16 or float32)")
    parser.add_argument("--output", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        import os

        os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import jax

    from theseus.model.generation.decode import layer_loop

    setting = CPU_SMOKE if args.cpu_smoke else Setting()
    setting = dataclasses.replace(
        setting, layers=args.layers or setting.layers, rounds=args.rounds or setting.rounds, dtype=args.dtype
    )
    if args.agreement:
        if args.dtype == "float32":  # TPU matrix products of float32 take one bfloat16 pass by default
            jax.config.update("jax_default_matmul_precision", "highest")
        rows = agreement(setting, *build(setting))
        publish_table(rows, args.output, title="Looped against unrolled decoding", extra=jax.devices()[0].device_kind)
        return 0
    loop = layer_loop(jax.devices()[0].platform)
    variants = {"as the decoder runs": loop}
    if args.unrolled and loop:
        variants["layers unrolled"] = False
    if args.looped and not loop:
        variants["layers looped"] = True
    shape = (
        f"Llama {setting.layers}x{setting.width}, {setting.heads}/{setting.kv_heads} heads, vocab {setting.vocab}, "
        f"{setting.batch} prompts of {setting.prompt} tokens x {setting.new_tokens} new tokens, bfloat16"
    )
    publish_table(measure(setting, variants), args.output, title="Generation compile and decode speed", extra=shape)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
