"""Adapters over a frozen base: the one mechanism every trainer uses for LoRA.

A model with adapters (LoRA's ``<name>_lora_a`` / ``<name>_lora_b``, told apart from the base by
name alone) trains them alone: the optimizer holds state for the adapters only (:func:`adapters_only`),
gradients stop at the base (:func:`freeze_base`), and every update leaves the base bit for bit as it
was (:func:`keep_base`). Started from ``training/init_from``, the base is read from the source and the
adapters start fresh (:func:`base_only`, :func:`overlay`), and checkpoints hold the adapters alone
(:func:`prune`), whichever the source (a run, a Hugging Face checkpoint, a plugin's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import optax

#: The name endings of adapter parameters: ``A`` ``[*in, rank]`` and ``B`` ``[rank, *out]``.
SUFFIX_A, SUFFIX_B = "lora_a", "lora_b"


def is_adapter(path: Sequence[Any]) -> bool:
    """Whether the parameter at ``path`` (a key path or names) is an adapter."""
    last = path[-1] if path else ""
    name = str(getattr(last, "key", last))
    return name.endswith(SUFFIX_A) or name.endswith(SUFFIX_B)


def adapter_labels(params: Any) -> Any:
    """A tree like ``params`` holding ``"adapter"`` or ``"frozen"`` per leaf."""
    return jax.tree_util.tree_map_with_path(lambda p, _: "adapter" if is_adapter(p) else "frozen", params)


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


def base_only(tree: Any) -> Any:
    """``tree`` (parameters, shapes or shardings) without the adapters."""

    def strip(node: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(node, Mapping):
            kept = {k: strip(v, (*path, k)) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None}
        return None if is_adapter(path) else node

    return strip(tree, ())


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
    "SUFFIX_A",
    "SUFFIX_B",
    "adapter_labels",
    "adapters_only",
    "base_only",
    "freeze_base",
    "has_adapters",
    "is_adapter",
    "keep_base",
    "overlay",
    "prune",
    "switched_off",
    "tree_bytes",
]
