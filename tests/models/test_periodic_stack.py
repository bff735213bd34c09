"""A scanned stack whose ``layer_types`` repeat, with layers left over after the last whole period: its
training and decoding steps read every layer's parameters from the stack ``[n_layers, ...]`` in place.
Checked on the traced programs (jaxprs), which name every slice and every saved residual before XLA
rewrites them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, JaxprEqn

from tests.models.conftest import build
from theseus.model.models import Gemma3, TransformerLM, init_cache

#: 8 layers of period 3: two whole periods scanned, two layers left over.
TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2 + ["sliding_attention"] * 2
N_LAYERS, PERIOD = 8, 3


def periodic_model() -> TransformerLM:
    values = {"architecture__n_layers": N_LAYERS, "architecture__layer_types": TYPES}
    values |= {"architecture__n_kv_heads": 2, "architecture__sliding_window": 3}
    model = build(Gemma3, model__scan_layers=True, **values)
    assert model.scan_period == PERIOD
    return model


def equations(jaxpr: Jaxpr) -> Iterator[JaxprEqn]:
    """Every equation of ``jaxpr`` and of the jaxprs inside it (scans, remat, pjit, ...)."""
    for eqn in jaxpr.eqns:
        yield eqn
        for param in eqn.params.values():
            for inner in param if isinstance(param, (tuple, list)) else (param,):
                if isinstance(inner, ClosedJaxpr):
                    yield from equations(inner.jaxpr)
                elif isinstance(inner, Jaxpr):
                    yield from equations(inner)


def shape(var: Any) -> tuple[int, ...]:
    """The shape of a jaxpr variable."""
    return tuple(var.aval.shape)


def layer_shapes(params: Any) -> set[tuple[int, ...]]:
    """One layer's shape of every stacked block parameter."""
    return {tuple(leaf.shape[1:]) for leaf in jax.tree.leaves(params["blocks"])}


def multi_layer_slices(closed: ClosedJaxpr, layers: set[tuple[int, ...]]) -> list[str]:
    """Static slices of a stacked parameter ``[n_layers, ...]`` that keep two layers or more (the copy
    a scan over the whole periods makes when it slices the leftover layers off)."""
    found = []
    for eqn in equations(closed.jaxpr):
        if eqn.primitive.name != "slice":
            continue
        operand, out = shape(eqn.invars[0]), shape(eqn.outvars[0])
        if operand[:1] == (N_LAYERS,) and operand[1:] in layers and out[0] > 1:
            found.append(f"{operand} -> {out}")
    return found


def test_a_decoding_step_reads_the_parameter_stack_in_place() -> None:
    model = periodic_model()
    tokens = jnp.zeros((1, 1), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), tokens, deterministic=True)["params"])
    cache = init_cache(model, 1, 8)

    def step(params: Any, cache: Any) -> Any:
        variables = {"params": params, "cache": cache}
        return model.apply(variables, tokens, deterministic=True, decode=True, mutable=["cache"])

    assert multi_layer_slices(jax.make_jaxpr(step)(params, cache), layer_shapes(params)) == []


def test_a_training_step_neither_copies_nor_saves_the_parameter_stack() -> None:
    """No slice of the stack in the forward pass, and the scan over whole periods saves no copy of its
    layers' parameters for the backward pass (it reads them from the stack again)."""
    model = periodic_model()
    x = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 5)), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), x, deterministic=True)["params"])

    def loss(params: Any) -> Any:
        return model.apply({"params": params}, x, x, deterministic=True)[1]

    closed = jax.make_jaxpr(jax.grad(loss))(params)
    layers = layer_shapes(params)
    assert multi_layer_slices(closed, layers) == []
    n_periods = N_LAYERS // PERIOD
    saved = {shape(v) for eqn in equations(closed.jaxpr) if eqn.primitive.name == "scan" for v in eqn.outvars}
    stacked_layers = {(n_periods, *shape) for shape in layers} | {(n_periods, PERIOD, *shape) for shape in layers}
    assert saved & stacked_layers == set()
