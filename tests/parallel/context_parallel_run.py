"""Run in a subprocess with four host devices: loss and gradients of each family with its sequence split
over ``mesh/context`` against one device.

``python -m tests.parallel.context_parallel_run OUT.json`` writes, per case, the largest difference of the
loss and of any gradient leaf from one device, and the error messages of the refused settings. Cases:
gpt, llama, gemma3 (sliding windows shorter than a chunk, so the skipped blocks matter) and mixtral at
T=512 over ``context=4`` in both attention forms, with a padded row (one layer each; the scanned Gemma 3
two); gpt over ``context=2`` beside ``fsdp+tp`` (model 2) with packed rows; mixtral's experts over
``expert=2`` beside ``context=2``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from tests.conftest import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(devices=4)
os.environ["JAX_PLATFORMS"] = "cpu"

import flax.linen as nn
import jax
import numpy as np

from theseus.base.axis import ShardingPlan
from theseus.config import Schema, configuration, configure, resolve
from theseus.errors import ConfigError
from theseus.model.models import GPT, DeepseekV3, Gemma3, Llama, Llama4, Mixtral, Qwen3Next
from theseus.training.sharding import build_sharding

STEPS = 512
SMALL = {
    "architecture/n_layers": 1,
    "architecture/n_embd": 64,
    "architecture/n_heads": 4,
    "architecture/vocab_size": 128,
    "architecture/block_size": STEPS,
    "model/activation_dtype": "float32",
    "model/loss_chunk": 128,  # tokens per device: the loss by chunks of strided positions, split over devices too
}
FAMILIES: dict[str, tuple[type, dict[str, Any]]] = {
    "gpt": (GPT, {}),
    "llama": (Llama, {"architecture/n_kv_heads": 2}),
    "gemma3": (Gemma3, {"architecture/n_kv_heads": 2, "architecture/head_dim": 16, "architecture/sliding_window": 40}),
    "mixtral": (Mixtral, {"architecture/n_kv_heads": 2, "architecture/sliding_window": 96}),
}


#: Loss and gradients on one device, per (family, packed rows, scanned layers).
ONE_DEVICE: dict[tuple[str, bool, bool], Any] = {}
#: Initial parameters per (family, scanned layers): the same for both forms and every layout, initialised once.
PARAMS: dict[tuple[str, bool], Any] = {}


def model_of(cls: type, keys: dict[str, Any]) -> Any:
    config = resolve(Schema.build(cls.gather()), overrides={**SMALL, **keys})
    with configuration(config):
        return configure(cls)


def batch(vocab: int, packed: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, vocab, (4, STEPS)).astype(np.int32)
    y = rng.integers(0, vocab, (4, STEPS)).astype(np.int32)
    if packed:  # three examples in row 0, padding at the end of row 1
        mask = np.ones((4, STEPS), np.int32)
        mask[0, 150:] = 2
        mask[0, 400:] = 3
        mask[1, 470:] = 0
    else:
        mask = np.ones((4, STEPS), bool)
        mask[1, :37] = False  # left padding
        mask[2, 300:] = False  # right padding
    return {"x": x, "y": y, "padding_mask": mask}


def loss_and_grads(model: Any, params: Any, data: dict[str, Any]) -> tuple[Any, Any]:
    def loss(p: Any) -> jax.Array:
        return model.apply({"params": p}, data["x"], data["y"], padding_mask=data["padding_mask"])[1]

    return jax.value_and_grad(loss)(params)


def compare(
    name: str,
    form: str,
    *,
    context: int,
    layout: str = "dp",
    model: int = 1,
    expert: int = 1,
    packed: bool = False,
    scanned: bool = False,
) -> dict[str, float]:
    cls, keys = FAMILIES[name]
    depth = {"architecture/n_layers": 2} if scanned else {}  # a scan over two layers' windows
    module = model_of(cls, {**keys, **depth, "model/scan_layers": scanned})
    data = batch(module.architecture.vocab_size, packed)
    if (name, scanned) not in PARAMS:
        PARAMS[name, scanned] = nn.unbox(jax.jit(module.init)(jax.random.key(1), data["x"][:1, :8])["params"])
    params = PARAMS[name, scanned]
    key = (name, packed, scanned)
    if key not in ONE_DEVICE:
        ONE_DEVICE[key] = jax.jit(lambda p, d: loss_and_grads(module, p, d))(params, data)
    one_loss, one_grads = ONE_DEVICE[key]
    sharding = build_sharding(
        module.sharding, layout=layout, data=-1, model=model, expert=expert, context=context, context_attention=form
    )
    placed = sharding.put_batch(data)
    with sharding.context():
        compiled = jax.jit(lambda p, d: loss_and_grads(module, p, d)).lower(params, placed).compile()
    split_loss, split_grads = compiled(params, placed)
    differences = jax.tree.map(largest_difference, one_grads, split_grads)
    program = compiled.as_text()
    return {
        "loss": float(abs(one_loss - split_loss)),
        "grads": max(jax.tree.leaves(differences)),
        "scale": max(float(np.max(np.abs(np.asarray(g)))) for g in jax.tree.leaves(one_grads)),
        "collective_permutes": program.count("collective-permute-start") + program.count("collective-permute("),
        "all_gathers": program.count("all-gather-start") + program.count("all-gather("),
    }


def largest_difference(a: Any, b: Any) -> float:
    """The largest absolute difference of two arrays, on the host."""
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))))


def refused() -> dict[str, str]:
    """The one-line errors of settings context parallelism does not take."""
    messages = {}
    cases = {
        "devices": lambda: build_sharding(ShardingPlan(), context=3),
        "sequence": lambda: _split_sequence(GPT, 500),
        "latent": lambda: _split_sequence(DeepseekV3, 64),
        "linear": lambda: _split_sequence(Qwen3Next, 64),
        "chunked": lambda: _split_sequence(Llama4, 64),
    }
    for name, case in cases.items():
        try:
            case()
        except ConfigError as exc:
            messages[name] = str(exc)
        else:
            messages[name] = "no error"
    return messages


def _split_sequence(cls: type, steps: int) -> None:
    module = model_of(cls, {"architecture/n_layers": 2})
    sharding = build_sharding(module.sharding, context=4)
    x = np.zeros((4, steps), np.int32)
    with sharding.context():
        jax.eval_shape(lambda: module.init(jax.random.key(0), x))


def main() -> None:
    out: dict[str, Any] = {}
    for name in FAMILIES:
        for form in ("allgather", "ring"):
            out[f"{name} {form}"] = compare(name, form, context=4)
    out["gemma3 ring scanned"] = compare("gemma3", "ring", context=4, scanned=True)
    out["gpt ring fsdp+tp packed"] = compare("gpt", "ring", context=2, layout="fsdp+tp", model=2, packed=True)
    out["mixtral allgather ep"] = compare("mixtral", "allgather", context=2, layout="fsdp+ep", expert=2)
    out["errors"] = refused()
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
