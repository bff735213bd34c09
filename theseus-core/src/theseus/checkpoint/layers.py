"""Repeated layers held stacked or one entry per layer, and conversion between the two layouts.

A model that scans over its layers holds each layer parameter once, with a leading layer axis
(``blocks/attn/query`` of shape ``[n_layers, ...]``); an unrolled model holds ``blocks_0``,
``blocks_1``, ... with the per-layer shapes. The values are the same, so a checkpoint written in
one layout loads into the other: :func:`layout_changes` compares the saved tree's paths with the
wanted tree, :func:`to_layout` rewrites a tree (arrays or abstract shapes) accordingly, and
:func:`per_layer` gives the unrolled view that name-based code (Hugging Face names, adapters,
per-layer statistics) works with. Every function walks nested mappings, tuples, lists and named
tuples (optimizer states), so the optimizer's moments follow their parameters.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

_INDEXED = re.compile(r"^(?P<name>.+)_(?P<index>\d+)$")


@dataclass(frozen=True)
class LayoutChange:
    """Entry ``name`` is stacked on one side and per layer (``name_0`` ...) on the other.

    ``stacked_to_per_layer``: the tree being rewritten holds it stacked and the result per layer.
    """

    name: str
    stacked_to_per_layer: bool


def _rebuild(node: Any, children: list[Any]) -> Any:
    if isinstance(node, tuple) and hasattr(node, "_fields"):
        return type(node)(*children)
    return type(node)(children)


def _map_mappings(tree: Any, fn: Callable[[Mapping[str, Any]], dict[str, Any]]) -> Any:
    """``tree`` with ``fn`` applied to every mapping, innermost first; other nodes keep their type."""
    if isinstance(tree, Mapping):
        return fn({key: _map_mappings(value, fn) for key, value in tree.items()})
    if isinstance(tree, (tuple, list)):
        return _rebuild(tree, [_map_mappings(child, fn) for child in tree])
    return tree


def _leaves(tree: Any) -> list[Any]:
    return jax.tree_util.tree_leaves(tree, is_leaf=lambda x: hasattr(x, "shape"))


def _layer_count(subtree: Any, name: str) -> int:
    counts = {int(leaf.shape[0]) for leaf in _leaves(subtree) if len(getattr(leaf, "shape", ())) >= 1}
    if len(counts) != 1:
        raise ValueError(f"stacked layers {name!r} have no common leading layer axis (found {sorted(counts)})")
    return counts.pop()


def _split(mapping: Mapping[str, Any], name: str, take: Callable[[Any, int], Any]) -> dict[str, Any]:
    if name not in mapping:
        return dict(mapping)
    stacked = mapping[name]
    count = _layer_count(stacked, name)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key != name:
            out[key] = value
            continue
        for index in range(count):
            out[f"{name}_{index}"] = jax.tree_util.tree_map(
                lambda leaf, i=index: take(leaf, i), stacked, is_leaf=lambda x: hasattr(x, "shape")
            )
    return out


def _join(mapping: Mapping[str, Any], name: str, stack: Callable[[list[Any]], Any]) -> dict[str, Any]:
    indices = sorted(int(m["index"]) for k in mapping if (m := _INDEXED.match(k)) and m["name"] == name)
    if not indices:
        return dict(mapping)
    if indices != list(range(len(indices))):
        raise ValueError(f"per-layer entries of {name!r} are not numbered 0..{len(indices) - 1}: {indices}")
    layers = [mapping[f"{name}_{i}"] for i in indices]
    joined = jax.tree_util.tree_map(lambda *leaves: stack(list(leaves)), *layers, is_leaf=lambda x: hasattr(x, "shape"))
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        match = _INDEXED.match(key)
        if match and match["name"] == name:
            if match["index"] == "0":
                out[name] = joined
            continue
        out[key] = value
    return out


# -- leaf operations ---------------------------------------------------------------------------------
def _take_layer(leaf: Any, index: int) -> Any:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return _take_abstract(leaf, index)
    return leaf[index]


def _stack_layers(leaves: list[Any]) -> Any:
    if isinstance(leaves[0], jax.ShapeDtypeStruct):
        return _stack_abstract(leaves)
    if all(isinstance(leaf, np.ndarray) for leaf in leaves):
        return np.stack(leaves)
    import jax.numpy as jnp

    return jnp.stack(leaves)


def _sharding_without_layers(sharding: Any) -> Any:
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return sharding
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*tuple(spec)[1:]))


def _sharding_with_layers(sharding: Any) -> Any:
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return sharding
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(None, *tuple(spec)))


def _take_abstract(leaf: Any, index: int) -> Any:
    del index
    sharding = getattr(leaf, "sharding", None)
    return jax.ShapeDtypeStruct(
        tuple(leaf.shape[1:]), leaf.dtype, sharding=None if sharding is None else _sharding_without_layers(sharding)
    )


def _stack_abstract(leaves: list[Any]) -> Any:
    first = leaves[0]
    sharding = getattr(first, "sharding", None)
    return jax.ShapeDtypeStruct(
        (len(leaves), *first.shape), first.dtype, sharding=None if sharding is None else _sharding_with_layers(sharding)
    )


# -- public API --------------------------------------------------------------------------------------
def per_layer(tree: Any, names: Iterable[str]) -> Any:
    """``tree`` with every stacked entry of ``names`` split into ``name_0``, ``name_1``, ... (views of
    numpy arrays, slices of jax arrays, shapes of abstract arrays); trees already per layer come
    back unchanged."""
    return to_layout(tree, [LayoutChange(name, stacked_to_per_layer=True) for name in names])


def stacked(tree: Any, names: Iterable[str]) -> Any:
    """``tree`` with ``name_0``, ``name_1``, ... of every name in ``names`` stacked into ``name``."""
    return to_layout(tree, [LayoutChange(name, stacked_to_per_layer=False) for name in names])


def _segments(paths: Iterable[str]) -> set[str]:
    return {segment for path in paths for segment in path.split("/")}


def _mapping_keys(tree: Any) -> set[str]:
    keys: set[str] = set()

    def collect(mapping: Mapping[str, Any]) -> dict[str, Any]:
        keys.update(str(k) for k in mapping)
        return dict(mapping)

    _map_mappings(tree, collect)
    return keys


def layout_changes(saved_paths: Iterable[str], wanted: Any) -> list[LayoutChange]:
    """How ``wanted`` must be rewritten to match a saved tree whose leaf paths (``"a/b/c"``) are
    ``saved_paths``: entries that ``wanted`` holds stacked but the save per layer, and the reverse."""
    saved = _segments(saved_paths)
    changes: list[LayoutChange] = []
    seen: set[str] = set()
    for key in sorted(_mapping_keys(wanted)):
        match = _INDEXED.match(key)
        if key not in saved and f"{key}_0" in saved and key not in seen:
            changes.append(LayoutChange(key, stacked_to_per_layer=True))
            seen.add(key)
        elif match and key not in saved and match["name"] in saved and match["name"] not in seen:
            changes.append(LayoutChange(match["name"], stacked_to_per_layer=False))
            seen.add(match["name"])
    return changes


def to_layout(tree: Any, changes: Iterable[LayoutChange]) -> Any:
    """``tree`` (arrays, or ``jax.ShapeDtypeStruct`` whose shardings gain or lose the replicated layer
    axis) rewritten by ``changes``."""
    result = tree
    for change in changes:
        if change.stacked_to_per_layer:
            result = _map_mappings(result, functools.partial(_split, name=change.name, take=_take_layer))
        else:
            result = _map_mappings(result, functools.partial(_join, name=change.name, stack=_stack_layers))
    return result


def reversed_changes(changes: Iterable[LayoutChange]) -> list[LayoutChange]:
    """The changes that undo ``changes``."""
    return [LayoutChange(c.name, not c.stacked_to_per_layer) for c in changes]


def convert_restored(restored: Any, changes: list[LayoutChange], target: Any) -> Any:
    """A tree restored in the saved layout, rewritten into the layout of ``target`` (abstract arrays
    with shardings) and placed on ``target``'s shardings; unchanged without ``changes``."""
    if not changes:
        return restored
    undo = reversed_changes(changes)
    shardings = jax.tree_util.tree_map(
        lambda leaf: getattr(leaf, "sharding", None), target, is_leaf=lambda x: hasattr(x, "shape")
    )
    return jax.jit(lambda tree: to_layout(tree, undo), out_shardings=shardings)(restored)


__all__ = [
    "LayoutChange",
    "convert_restored",
    "layout_changes",
    "per_layer",
    "reversed_changes",
    "stacked",
    "to_layout",
]
