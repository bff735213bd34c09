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


def parameter_shapes(model: TransformerLM) -> Any:
    """``model``'s parameters as shapes and dtypes (traced once per model object)."""

    def trace() -> Any:
        return nn.unbox(jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"]))

    return _kept(("shapes", _Same(model)), trace)


def random_params(model: TransformerLM, seed: int = 0, std: float = 0.3) -> Any:
    """Parameters of ``model`` drawn with numpy (norm scales around 1) so logits are O(1) and differ
    per token; only shapes come from Flax, so nothing is compiled."""
    flat, tree = jax.tree_util.tree_flatten_with_path(parameter_shapes(model))
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
    strings, and array keyword arguments, are the program's inputs; the others are fixed. A worker traces
    each function (a model's method: each model object's) once per fixed arguments and input shapes."""
    inputs = tuple(i for i, a in enumerate(args) if not (a is None or isinstance(a, bool | int | float | str)))
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, jax.Array | np.ndarray)}
    constants = tuple(None if i in inputs else a for i, a in enumerate(args))
    fixed = {k: v for k, v in kwargs.items() if k not in arrays}
    try:  # a bound method is keyed by its object's identity (two models equal field by field may differ
        # in what they read from the configuration when they build their layers)
        key = ("program", fn, inputs, _frozen(constants), _frozen(fixed))
        hash(key)
    except TypeError:  # something unhashable: traced afresh
        key = None

    def make() -> Callable[..., Any]:
        return _make_program(fn, inputs, constants, fixed)

    program = make() if key is None else _kept(key, make)
    return program([args[i] for i in inputs], arrays)


#: What :func:`jitted`, :func:`parameter_shapes` and :func:`logits_loss_grads` made, kept for the next call
#: with the same function or model object (each key holds the objects it names, so no id is reused).
_PROGRAMS: dict[Any, Any] = {}
MAX_PROGRAMS = 256


def _kept(key: Any, make: Callable[[], Any]) -> Any:
    """What ``make()`` returned for ``key`` before, else ``make()`` (kept; all forgotten past
    :data:`MAX_PROGRAMS` entries)."""
    if key not in _PROGRAMS:
        if len(_PROGRAMS) >= MAX_PROGRAMS:
            _PROGRAMS.clear()
        _PROGRAMS[key] = make()
    return _PROGRAMS[key]


def _frozen(value: Any) -> Any:
    """``value`` as a hashable key: Python scalars and their containers by value, telling types apart
    (``True`` from ``1``, ``-0.0`` from ``0.0``, a list from a tuple); anything else by identity."""
    if isinstance(value, dict):
        return (dict, tuple(sorted((k, _frozen(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return (type(value), tuple(_frozen(v) for v in value))
    if isinstance(value, float):
        return (float, repr(value))
    if value is None or isinstance(value, bool | int | str | bytes):
        return (type(value), value)
    return _Same(value)


class _Same:
    """A key part equal only to one holding the very same object (which it keeps alive)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.value is self.value

    def __hash__(self) -> int:
        return id(self.value)


def _make_program(
    fn: Callable[..., Any], inputs: tuple[int, ...], constants: tuple[Any, ...], fixed: dict[str, Any]
) -> Callable[..., Any]:
    def call(values: list[Any], named: dict[str, Any]) -> Any:
        positional = list(constants)
        for i, value in zip(inputs, values, strict=True):
            positional[i] = value
        return fn(*positional, **named, **fixed)

    return jax.jit(call)


def forward(model: Any, params: Any, ids: Any, mask: Any = None) -> np.ndarray:
    """A model's logits for ``ids`` (``mask``: which positions are real), deterministic, compiled as one
    program (:func:`jitted`)."""
    padding = None if mask is None else jnp.asarray(mask)
    logits, _ = jitted(model.apply, {"params": params}, jnp.asarray(ids), padding_mask=padding, deterministic=True)
    return np.asarray(logits)


def logits_loss_grads(model: TransformerLM, params: Any, x: Any, y: Any, mask: Any) -> tuple[Any, Any, Any]:
    """One jitted deterministic forward and backward pass of ``model``: its logits, loss and gradients."""

    def fn(p: Any, x: Any, y: Any, mask: Any) -> tuple[Any, Any]:
        logits, loss = model.apply({"params": p}, x, y, padding_mask=mask, deterministic=True)
        return loss, logits

    program = _kept(("loss and gradients", _Same(model)), lambda: jax.jit(jax.value_and_grad(fn, has_aux=True)))
    (loss, logits), grads = program(params, x, y, mask)
    return logits, loss, grads


@pytest.fixture(params=[GPT, Llama], ids=["gpt", "llama"])
def family(request: pytest.FixtureRequest) -> type[TransformerLM]:
    return request.param


@pytest.fixture
def make_model() -> Callable[..., TransformerLM]:
    return build


def decoded_after_left_padding(layer: Any, params: Any, x: jax.Array, pad: int = 2, prompt: int = 5) -> tuple[Any, Any]:
    """A token-mixing layer's outputs for rows ``x`` ``[B, T, E]`` decoded through its cache after ``pad``
    positions of junk (masked out): the padded prompt of ``prompt`` real positions at once, then one position
    at a time. Returns the real positions' outputs ``[B, T, E]`` and the empty cache it started from."""
    rows, steps, width = x.shape
    padded = jnp.concatenate([jnp.ones((rows, pad, width)), x], axis=1)
    mask = jnp.arange(pad + steps)[None, :].repeat(rows, 0) >= pad
    cache = jax.tree.map(jnp.zeros_like, jitted(layer.init, jax.random.key(1), padded, decode=True)["cache"])
    start = pad + prompt
    first = (padded[:, :start], mask[:, :start])
    out, mutated = jitted(layer.apply, {"params": params, "cache": cache}, *first, decode=True, mutable=["cache"])
    outs = [np.asarray(out)[:, pad:]]
    for t in range(start, pad + steps):
        step = (padded[:, t : t + 1], mask[:, t : t + 1])
        out, mutated = jitted(
            layer.apply, {"params": params, "cache": mutated["cache"]}, *step, decode=True, mutable=["cache"]
        )
        outs.append(np.asarray(out))
    return np.concatenate(outs, axis=1), cache
