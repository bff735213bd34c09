"""Frozen kernels: parameters stored as integer codes (a quantized base, ``model/quantize``), which no
update differentiates, whatever the trainer or its objective.

A frozen kernel is a mapping of arrays at least one of which is not floating point: the codes of a
quantized kernel, held with their float companions (scales, block maxima) in one mapping such as
``{"codes", "absmax_codes", "absmax_scales", "absmax_mean"}``. The rule needs no parameter names, so
any model's quantized layers are covered. Frozen kernels stay in ``state.params`` (sharding,
checkpoints and loading see one parameter tree); :data:`FROZEN_KERNELS` is ``BaseTrainer``'s default
``HELD_OUT``, so every update sees the parameters without them and a model call that puts them back
(:func:`theseus.training.steps.holding_out`), and :func:`excluding` gives the optimizer the same view:
a frozen kernel has no gradient, no optimizer state, and leaves every step bit for bit as it came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax

from theseus.training.steps import HeldOut


def _frozen_dtype(leaf: Any) -> bool:
    """Whether an array (or its shape) holds values an update cannot differentiate (integers, booleans)."""
    dtype = getattr(leaf, "dtype", None)
    return dtype is not None and not jnp.issubdtype(dtype, jnp.inexact)


def is_frozen_kernel(node: Any) -> bool:
    """Whether ``node`` is a frozen kernel: a mapping of arrays only, one of them or more not floating point."""
    if not isinstance(node, Mapping) or not node:
        return False
    values = list(node.values())
    return not any(isinstance(v, Mapping) for v in values) and any(_frozen_dtype(v) for v in values)


def split(params: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(frozen, rest)``: the frozen kernels of ``params`` and everything else, nested as in ``params``
    (a mapping left with nothing but frozen kernels stays in ``rest``, empty)."""
    frozen: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for key, value in params.items():
        if is_frozen_kernel(value):
            frozen[key] = value
        elif isinstance(value, Mapping):
            held, others = split(value)
            if held:
                frozen[key] = held
            rest[key] = others
        else:
            rest[key] = value
    return frozen, rest


def join(rest: Mapping[str, Any], frozen: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`split`."""
    out = dict(rest)
    for key, value in frozen.items():
        out[key] = value if is_frozen_kernel(value) else join(rest.get(key, {}), value)
    return out


def without_frozen(params: Any) -> Any:
    """``params`` without their frozen kernels."""
    return split(params)[1] if isinstance(params, Mapping) else params


def has_frozen(params: Any) -> bool:
    """Whether ``params`` (arrays or shapes) hold a frozen kernel (decided from dtypes: static under jit)."""
    return isinstance(params, Mapping) and bool(split(params)[0])


def integer_paths(params: Any) -> list[str]:
    """The paths of the leaves of ``params`` that are not floating point (none once frozen kernels are out)."""
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    return [jax.tree_util.keystr(path) for path, leaf in leaves if _frozen_dtype(leaf)]


class FrozenKernels:
    """The frozen kernels of a model, held out of every update (``BaseTrainer.HELD_OUT``)."""

    def split(self, params: Any) -> tuple[Any, Any]:
        """``(frozen kernels, the rest)`` of ``params``."""
        return split(params) if isinstance(params, Mapping) else ({}, params)

    def join(self, rest: Any, held: Any) -> Any:
        """The parameters again, from :meth:`split`'s two parts."""
        return join(rest, held) if held else rest


#: What every trainer holds out of the update by default: a quantized base's frozen kernels.
FROZEN_KERNELS = FrozenKernels()


def excluding(held_out: HeldOut, tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` over the parameters without what ``held_out`` splits off (it never sees the frozen kernels)."""

    def strip(tree: Any) -> Any:
        return held_out.split(tree)[1]

    def init(params: Any) -> Any:
        return tx.init(strip(params))

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        return tx.update(strip(updates), state, None if params is None else strip(params))

    return optax.GradientTransformation(init, update)


__all__ = [
    "FROZEN_KERNELS",
    "FrozenKernels",
    "excluding",
    "has_frozen",
    "integer_paths",
    "is_frozen_kernel",
    "join",
    "split",
    "without_frozen",
]
