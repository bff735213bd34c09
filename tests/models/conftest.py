"""Fixtures for the model tests: tiny float32 GPT / Llama models with well-spread weights."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration, configure
from theseus.model.models import GPT, Llama, TransformerLM

#: Small shapes shared by the parity, FLOP and decoding tests.
TINY = {
    "architecture/n_layers": 2,
    "architecture/n_heads": 4,
    "architecture/n_embd": 32,
    "architecture/vocab_size": 64,
    "architecture/vocab_multiple": 64,  # no padding: shapes match the reference models (see test_vocab_padding)
    "architecture/block_size": 32,
}
LLAMA_TINY = {**TINY, "architecture/n_kv_heads": 2}


def build(cls: type[TransformerLM], **values: Any) -> TransformerLM:
    """``configure(cls)`` under the tiny configuration plus ``values`` (slash keys with ``__``)."""
    base = LLAMA_TINY if cls is Llama else TINY
    with configuration({**base, **{k.replace("__", "/"): v for k, v in values.items()}}):
        return configure(cls)


def random_params(model: TransformerLM, seed: int = 0, std: float = 0.3) -> Any:
    """Parameters of ``model`` drawn with numpy (norm scales around 1) so logits are O(1) and differ
    per token; only shapes come from Flax, so nothing is compiled."""
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])
    flat, tree = jax.tree_util.tree_flatten_with_path(nn.unbox(shapes))
    rng = np.random.default_rng(seed)
    out = []
    for path, leaf in flat:
        noise = rng.normal(0.0, std, leaf.shape)
        values = 1.0 + noise if "scale" in jax.tree_util.keystr(path) else noise
        out.append(jnp.asarray(np.asarray(values, leaf.dtype)))  # cast by numpy: no program compiled
    return jax.tree.unflatten(tree, out)


def jitted(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` compiled as one program (for ``model.apply`` and ``model.init``): run
    eagerly, each operation of a model is compiled as a program of its own, about six times the CPU time
    of a two-layer Llama's forward pass compiled whole. Positional arguments other than Python scalars and
    strings, and array keyword arguments, are the program's inputs; the others are fixed."""
    inputs = [i for i, a in enumerate(args) if not (a is None or isinstance(a, bool | int | float | str))]
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array | np.ndarray)}
    fixed = {k: v for k, v in kwargs.items() if k not in arrays}

    def call(values: list[Any], named: dict[str, Any]) -> Any:
        positional = list(args)
        for i, value in zip(inputs, values, strict=True):
            positional[i] = value
        return fn(*positional, **named, **fixed)

    return jax.jit(call)([args[i] for i in inputs], arrays)


def forward(model: Any, params: Any, ids: Any, mask: Any = None) -> np.ndarray:
    """A model's logits for ``ids`` (``mask``: which positions are real), deterministic, compiled as one
    program (:func:`jitted`)."""
    padding = None if mask is None else jnp.asarray(mask)
    logits, _ = jitted(model.apply, {"params": params}, jnp.asarray(ids), padding_mask=padding, deterministic=True)
    return np.asarray(logits)


def logits_loss_grads(model: TransformerLM, params: Any, x: Any, y: Any, mask: Any) -> tuple[Any, Any, Any]:
    """One jitted deterministic forward and backward pass of ``model``: its logits, loss and gradients."""

    def fn(p: Any) -> tuple[Any, Any]:
        logits, loss = model.apply({"params": p}, x, y, padding_mask=mask, deterministic=True)
        return loss, logits

    (loss, logits), grads = jax.jit(jax.value_and_grad(fn, has_aux=True))(params)
    return logits, loss, grads


@pytest.fixture(params=[GPT, Llama], ids=["gpt", "llama"])
def family(request: pytest.FixtureRequest) -> type[TransformerLM]:
    return request.param


@pytest.fixture
def make_model() -> Callable[..., TransformerLM]:
    return build
