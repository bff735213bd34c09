"""Reading a base into a quantized layout (``model/quantize``): the float kernels a checkpoint stores are
read and quantized one by one (what ``read_params`` of the models does, for every trainer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from theseus.config import Configuration, current_configuration
from theseus.model.layers import quantization
from theseus.training import frozen


def plain_shapes(model: Any) -> Any:
    """The parameter shapes of ``model`` built without ``model/quantize`` (float kernels)."""
    import flax.linen as nn
    import jax.numpy as jnp

    own = getattr(model, "theseus_config", None) or current_configuration() or {}
    plain = model.clone(theseus_config=Configuration({**own, "model/quantize": "none"}))
    shapes = jax.eval_shape(lambda: plain.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), deterministic=True))
    return nn.unbox(shapes["params"])


def _plain_shardings(shardings: Any, plain: Any) -> Any:
    """``shardings`` in the float layout: a quantized kernel's float form is placed as its codes are."""

    def walk(node: Any, shapes: Any) -> Any:
        if not isinstance(node, Mapping):
            return node
        out = {}
        for key, value in node.items():
            method = quantization.method_of(key)
            if method is not None and isinstance(value, Mapping):
                out[str(key)[: -len(method) - 1]] = value["codes"]
            else:
                out[key] = walk(value, shapes.get(key, {}) if isinstance(shapes, Mapping) else {})
        return out

    return walk(shardings, plain)


def read_quantized(model: Any, read: Any, abstract: Any, shardings: Any) -> Any:
    """The parameters ``abstract`` names, read by ``read(model, abstract, shardings)`` in the float layout
    a checkpoint stores; with ``model/quantize``, the float kernels are read and quantized one by one into
    ``abstract``'s layout (what ``read_params`` of the models does)."""
    if not frozen.has_frozen(abstract):
        return read(model, abstract, shardings)
    plain = _matching(plain_shapes(model), abstract)
    float_base = read(model, plain, _plain_shardings(shardings, plain))
    return quantization.quantize_params(float_base, abstract, shardings)


def _matching(plain: Any, abstract: Any) -> Any:
    """``plain`` (float shapes) cut to the parameters ``abstract`` names: a float kernel where ``abstract``
    holds it quantized, nothing it leaves out (the adapters of a base, a trainer's own head)."""
    if not isinstance(abstract, Mapping) or not isinstance(plain, Mapping):
        return plain
    out: dict[str, Any] = {}
    for key, value in abstract.items():
        method = quantization.method_of(key)
        if method is not None and isinstance(value, Mapping):
            name = str(key)[: -len(method) - 1]
            out[name] = plain[name]
        elif key in plain:
            out[key] = _matching(plain[key], value)
    return out


__all__ = ["plain_shapes", "read_quantized"]
