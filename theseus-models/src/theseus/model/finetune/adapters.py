"""Training only the LoRA adapters: optimizer partition, frozen base, adapter-only checkpoint trees."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import optax

from theseus.model.layers.lora import SUFFIX_B, adapter_labels, is_adapter


def has_adapters(params: Any) -> bool:
    """Whether ``params`` hold any LoRA adapter (decided from the tree's names: static under jit)."""
    return any(is_adapter(path) for path, _ in jax.tree_util.tree_flatten_with_path(params)[0])


def adapters_only(tx: optax.GradientTransformation, params: Any) -> optax.GradientTransformation:
    """``tx`` applied to the adapters of ``params``; the base gets zero updates and no optimizer state."""
    labels = adapter_labels(params)
    return optax.multi_transform({"adapter": tx, "frozen": optax.set_to_zero()}, labels)


def freeze_base(params: Any) -> Any:
    """``params`` with gradients stopped at every base parameter (adapters still learn)."""
    return jax.tree_util.tree_map_with_path(lambda p, v: v if is_adapter(p) else jax.lax.stop_gradient(v), params)


def keep_base(new: Any, old: Any) -> Any:
    """``new`` adapters with ``old`` base parameters, so the base stays bit for bit what it was."""
    return jax.tree_util.tree_map_with_path(lambda p, n, o: n if is_adapter(p) else o, new, old)


def switched_off(params: Any) -> Any:
    """``params`` with every adapter's second factor zeroed: the model then computes its base exactly
    (the reference of preference tuning with LoRA, without a second copy of the weights)."""

    def off(path: Any, value: Any) -> Any:
        name = str(getattr(path[-1], "key", path[-1])) if path else ""
        return jax.numpy.zeros_like(value) if name.endswith(SUFFIX_B) else value

    return jax.tree_util.tree_map_with_path(off, params)


def prune(tree: Any) -> Any:
    """The adapters of a nested parameter mapping, nested the same way (empty branches dropped)."""

    def walk(node: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(node, Mapping):
            kept = {k: walk(v, (*path, k)) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None and not (isinstance(v, Mapping) and not v)}
        return node if is_adapter(path) else None

    return walk(tree, ())


def overlay(base: Any, adapters: Any) -> Any:
    """``base`` with the leaves that ``adapters`` holds replaced by them."""
    if not isinstance(adapters, Mapping):
        return adapters
    out = dict(base)
    for key, value in adapters.items():
        out[key] = overlay(base[key], value) if isinstance(value, Mapping) else value
    return out


def tree_bytes(tree: Any) -> int:
    """Bytes of every array leaf of ``tree`` (shapes and dtypes only)."""
    return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree) if hasattr(leaf, "dtype"))


__all__ = [
    "adapters_only",
    "freeze_base",
    "has_adapters",
    "keep_base",
    "overlay",
    "prune",
    "switched_off",
    "tree_bytes",
]
