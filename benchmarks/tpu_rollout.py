"""Rollout speed on a TPU against the chip's memory roofline, and what reading only the filled cache gains.

    python benchmarks/tpu_rollout.py                 # on a TPU: GPT 350M shape, 64 prompts x 256 new tokens
    python benchmarks/tpu_rollout.py --cpu-smoke     # tiny sizes on CPU (tests the script)

A decoding step reads every parameter once and, in each layer's attention, the keys and values of the
cache slots it attends to. At batch 64 the cache outweighs the parameters, so the roofline of a step is
``(parameter bytes + cache bytes read) / HBM bandwidth`` (v5e: 819 GB/s) and tokens/s at the roofline
are ``batch / that time``. Two decoders are timed side by side in rotated rounds on the same random
weights (bfloat16 parameters and activations), prompts and sampling:

* **stretches**: ``generate_tokens`` as it runs: a long generation decodes in stretches, each reading
  only the cache slots filled by its end (``theseus.model.generation.decode.view_limits``);
* **whole cache**: the same with a single stretch, reading every slot at every step.

Each is set against its own roofline (the bytes it reads) and against the roofline of the filled slots
alone (what an ideal ragged kernel would read). No end-of-text id is set, so every row gets all the
new tokens; tokens/s count new tokens, the prefill included in the time.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, publish_table

HBM_BYTES_PER_S = {"tpu": 819e9}  # v5e (published); other platforms: no roofline row


@dataclasses.dataclass(frozen=True)
class Setting:
    layers: int = 24
    width: int = 1024
    heads: int = 16
    vocab: int = 50304
    batch: int = 64
    prompt: int = 64
    new_tokens: int = 256
    rounds: int = 3


CPU_SMOKE = Setting(layers=2, width=64, heads=4, vocab=257, batch=4, prompt=8, new_tokens=80, rounds=1)


def build(setting: Setting) -> tuple[Any, Any]:
    """A GPT of ``setting``'s shape with random bfloat16 parameters."""
    import jax
    import jax.numpy as jnp

    from theseus.config import configuration, configure
    from theseus.model.models import GPT

    values = {
        "architecture/n_layers": setting.layers,
        "architecture/n_embd": setting.width,
        "architecture/n_heads": setting.heads,
        "architecture/vocab_size": setting.vocab,
        "architecture/block_size": setting.prompt + setting.new_tokens,
        "model/activation_dtype": "bfloat16",
    }
    with configuration(values):
        model = configure(GPT)
    params = jax.jit(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])()
    params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), jax.tree.map(lambda x: getattr(x, "value", x), params))
    return model, params


def slots_read(setting: Setting, limits: list[int]) -> float:
    """Mean cache slots a step reads: the prefill's and each new token's step (``limits``: the stretches)."""
    prompt, new = setting.prompt, setting.new_tokens
    reads = [limits[0]]  # the prefill
    for step in range(1, new):
        reads.append(next(limit for limit in limits if step <= limit - prompt))
    return sum(reads) / len(reads)


def filled_slots(setting: Setting) -> float:
    """Mean slots filled after each step's write: what a kernel reading only real slots would read."""
    prompt, new = setting.prompt, setting.new_tokens
    return sum([prompt, *(prompt + step for step in range(1, new))]) / new


def measure(setting: Setting) -> list[Row]:
    import jax
    import numpy as np

    from theseus.model.generation import decode
    from theseus.model.generation.sampling import SamplingParams

    model, params = build(setting)
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, setting.vocab - 1, (setting.batch, setting.prompt)).tolist()
    sampling = SamplingParams(temperature=1.0, top_p=0.95)
    platform = jax.devices()[0].platform
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    head_dim = setting.width // setting.heads
    slot_bytes = setting.layers * 2 * setting.batch * setting.heads * head_dim * 2  # keys + values, bf16
    variants = {"stretches": decode.DECODE_STRETCHES, "whole cache": 1}  # how many stretches each decodes in

    def rollout(stretches: int) -> float:
        began = time.perf_counter()
        done = decode.generate_tokens(
            model, params, prompts, setting.new_tokens, sampling=sampling, seed=0, stretches=stretches
        )
        assert all(len(c.tokens) == setting.new_tokens for c in done)
        return time.perf_counter() - began

    first = {name: rollout(stretches) for name, stretches in variants.items()}
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for round_ in range(setting.rounds):
        for name in names[round_ % 2 :] + names[: round_ % 2]:
            seconds[name].append(rollout(variants[name]))
    tokens = setting.batch * setting.new_tokens
    bandwidth = HBM_BYTES_PER_S.get(platform)
    ideal = (param_bytes + filled_slots(setting) * slot_bytes) / bandwidth if bandwidth else None
    rows = []
    for name, stretches in variants.items():
        limits = decode.view_limits(setting.prompt, setting.new_tokens, stretches)
        best = float(np.median(seconds[name]))
        step = best / setting.new_tokens
        read = param_bytes + slots_read(setting, limits) * slot_bytes
        note = (
            f"{step * 1e3:.2f} ms/step; {len(limits)} stretch(es) {limits}; first call {first[name]:.1f} s; "
            f"{read / 1e9:.2f} GB read per step ({param_bytes / 1e9:.2f} GB parameters)"
        )
        rows.append(Row(f"{name}: new tokens/s", tokens / best, "tok/s", note=note, fmt="{:,.0f}"))
        if bandwidth:
            own = read / bandwidth / step
            rows.append(Row(f"{name}: share of the roofline of the bytes it reads", 100 * own, "%", fmt="{:.1f}"))
            rows.append(
                Row(
                    f"{name}: share of the roofline of the filled slots",
                    100 * (ideal or 0) / step,
                    "%",
                    goal=50.0 if name == "stretches" else None,
                    direction="min",
                    fmt="{:.1f}",
                )
            )
    ratio = float(np.median(seconds["whole cache"])) / float(np.median(seconds["stretches"]))
    rows.append(Row("stretches ÷ whole cache, tokens/s", ratio, "x", fmt="{:.2f}"))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU")
    parser.add_argument("--output", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    setting = CPU_SMOKE if args.cpu_smoke else Setting()
    shape = (
        f"GPT {setting.layers}x{setting.width}, {setting.batch} prompts of {setting.prompt} tokens "
        f"x {setting.new_tokens} new tokens, bfloat16"
    )
    publish_table(measure(setting), args.output, title="Rollouts against the memory roofline", extra=shape)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
