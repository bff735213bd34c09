"""Repeated layers held stacked or one entry per layer, and conversion between the two layouts.

A model that scans over its layers holds each layer parameter once, with a leading layer axis
(``blocks/attn/query`` of shape ``[n_layers, ...]``); an unrolled model holds ``blocks_0``,
``blocks_1``, ... with the per-layer shapes. The values are the same, so a checkpoint written in
one layout loads into the other: :func:`layout_changes` compares the saved tree's paths with the
wanted tree, :func:`to_layout` rewrites a tree (arrays or abstract shapes) accordingly, and
:func:`per_layer` gives the unrolled view that name-based code (Hugging Face names, adapters,
per-layer statistics) works with. Every function walks nested mappings, tuples, lists and named
tuples (optimizer states), so the optimizer's moments follow their parameters.

**Runs.** A stack whose layers differ in shape (DeepSeek-V3's leading dense layers, then mixture
layers) is held as consecutive runs of identical layers, each stacked under its own entry: the
leading runs as ``<kind>_<name>`` (``dense_blocks``) in name order, then the main run ``<name>``
(``blocks``). A :class:`LayerRun` says which per-layer entries one of them holds (``dense_blocks``
[3] = ``blocks_0`` ... ``blocks_2``, ``blocks`` [58] = ``blocks_3`` ... ``blocks_60``);
:func:`layout_changes` finds the runs of a tree by that naming rule and their sizes from the shapes.

**Units.** A run that repeats a unit of ``period`` layers of different shapes (Qwen3-Next's three
linear-attention layers and one full-attention layer) holds each position of the unit stacked apart:
``<name>/periods/layers_<i>`` ``[n_units, ...]`` holds layers ``i``, ``i + period``, ... of the run, and
``<name>/rest_<j>`` the layer ``n_units * period + j`` left over after the last whole unit.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from theseus.checkpoint.shapes import param_shapes

_INDEXED = re.compile(r"^(?P<name>.+)_(?P<index>\d+)$")


@dataclass(frozen=True)
class LayerRun:
    """Stacked entry ``name`` holds the per-layer entries ``<layers>_<first>`` ...
    ``<layers>_<first + count - 1>`` (``count`` None: every ``<layers>_<i>`` from 0), one stack of them
    all, or per position of a unit of ``period`` layers (module docstring, **Units**)."""

    name: str
    layers: str
    first: int = 0
    count: int | None = None
    period: int = 1


#: What a model's ``stacked_layers`` lists: a stacked entry holding every layer of its name, or a run.
StackEntry = str | LayerRun


def as_run(entry: StackEntry) -> LayerRun:
    """``entry`` as a :class:`LayerRun` (a name stacks every layer of that name)."""
    return entry if isinstance(entry, LayerRun) else LayerRun(entry, entry)


def layer_names(entries: Iterable[StackEntry]) -> set[str]:
    """The per-layer entry names (``blocks`` of ``blocks_<i>``) that ``entries`` stack."""
    return {as_run(entry).layers for entry in entries}


@dataclass(frozen=True)
class LayoutChange:
    """Entry ``name`` is stacked on one side and per layer (``name_0`` ...) on the other; for a run
    (``layers`` set) ``name`` holds ``<layers>_<first>`` ... ``<layers>_<first + count - 1>``.

    ``stacked_to_per_layer``: the tree being rewritten holds it stacked and the result per layer.
    """

    name: str
    stacked_to_per_layer: bool
    layers: str | None = None
    first: int = 0
    count: int | None = None
    period: int = 1

    @property
    def run(self) -> LayerRun:
        return LayerRun(self.name, self.layers or self.name, self.first, self.count, self.period)


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


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape")


def _take(tree: Any, take: Callable[[Any, int], Any], index: int) -> Any:
    return jax.tree_util.tree_map(lambda leaf: take(leaf, index), tree, is_leaf=_is_array)


def _layers_of(stacked: Any, run: LayerRun, take: Callable[[Any, int], Any]) -> dict[int, Any]:
    """The layers (by index within the run) that the stacked entry ``stacked`` of ``run`` holds (a unit's
    positions found by their names when ``run`` does not give its period)."""
    units: Any = stacked.get("periods") if isinstance(stacked, Mapping) else None
    if run.period == 1 and not (isinstance(units, Mapping) and all(k.startswith("layers_") for k in units)):
        return {i: _take(stacked, take, i) for i in range(_layer_count(stacked, run.name))}
    period, count = len(units), _layer_count(units, run.name)
    layers = {j * period + i: _take(units[f"layers_{i}"], take, j) for i in range(period) for j in range(count)}
    rest = sorted(int(m["index"]) for key in stacked if (m := _INDEXED.match(key)) and m["name"] == "rest")
    return {**layers, **{count * period + j: stacked[f"rest_{j}"] for j in rest}}


def _split(mapping: Mapping[str, Any], run: LayerRun, take: Callable[[Any, int], Any]) -> dict[str, Any]:
    name = run.name
    if name not in mapping:
        return dict(mapping)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key != name:
            out[key] = value
            continue
        layers = _layers_of(value, run, take)
        out |= {f"{run.layers}_{run.first + index}": layers[index] for index in sorted(layers)}
    return out


def _run_indices(mapping: Mapping[str, Any], run: LayerRun) -> list[int]:
    """The layer indices of ``run`` that ``mapping`` holds per layer (all of them, or none)."""
    found = sorted(int(m["index"]) for k in mapping if (m := _INDEXED.match(k)) and m["name"] == run.layers)
    if run.count is None:
        if found != list(range(len(found))):
            raise ValueError(f"per-layer entries of {run.layers!r} are not numbered 0..{len(found) - 1}: {found}")
        return found
    wanted = list(range(run.first, run.first + run.count))
    held = [i for i in wanted if i in set(found)]
    if held and held != wanted:
        raise ValueError(f"run {run.name!r} needs {run.layers}_{wanted[0]}..{wanted[-1]}, found {held}")
    return held


def _stacked_layers(layers: list[Any], run: LayerRun, stack: Callable[[list[Any]], Any]) -> Any:
    """The stacked entry of ``run`` holding ``layers`` (in order): the reverse of :func:`_layers_of`."""

    def joined(trees: list[Any]) -> Any:
        return jax.tree_util.tree_map(lambda *leaves: stack(list(leaves)), *trees, is_leaf=_is_array)

    if run.period == 1:
        return joined(layers)
    count = len(layers) // run.period
    units = {f"layers_{i}": joined(layers[i : count * run.period : run.period]) for i in range(run.period)}
    return {"periods": units, **{f"rest_{j}": layer for j, layer in enumerate(layers[count * run.period :])}}


def _join(mapping: Mapping[str, Any], run: LayerRun, stack: Callable[[list[Any]], Any]) -> dict[str, Any]:
    indices = _run_indices(mapping, run)
    if not indices:
        return dict(mapping)
    names = [f"{run.layers}_{i}" for i in indices]
    joined = _stacked_layers([mapping[name] for name in names], run, stack)
    out: dict[str, Any] = {}
    for key, value in mapping.items():
        if key == names[0]:
            out[run.name] = joined
        elif key not in names:
            out[key] = value
    return out


def layer_slots(run: LayerRun, path: tuple[str, ...], count: int) -> list[tuple[str, tuple[str, ...], int | None]]:
    """Where the leaf at ``path`` below ``run``'s entry (leading axis ``count``) holds each of its layers:
    ``(per-layer entry, path below it, index on the leaf's leading axis)``; index None: the leaf is that
    one layer's (a unit's leftover layer ``rest_<j>``)."""
    if run.period == 1:
        return [(f"{run.layers}_{run.first + j}", path, j) for j in range(count)]
    if path[0] == "periods":
        position = int(path[1].removeprefix("layers_"))
        return [(f"{run.layers}_{run.first + j * run.period + position}", path[2:], j) for j in range(count)]
    if run.count is None:
        raise ValueError(f"the leftover layers of run {run.name!r} need its layer count")
    whole = run.count - run.count % run.period
    return [(f"{run.layers}_{run.first + whole + int(path[0].removeprefix('rest_'))}", path[1:], None)]


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
def _change(entry: StackEntry, stacked_to_per_layer: bool) -> LayoutChange:
    run = as_run(entry)
    return LayoutChange(run.name, stacked_to_per_layer, run.layers, run.first, run.count, run.period)


def per_layer(tree: Any, names: Iterable[StackEntry]) -> Any:
    """``tree`` with every stacked entry of ``names`` split into ``name_0``, ``name_1``, ... (a
    :class:`LayerRun` into its own layers; views of numpy arrays, slices of jax arrays, shapes of
    abstract arrays); trees already per layer come back unchanged."""
    return to_layout(tree, [_change(entry, True) for entry in names])


def stacked(tree: Any, names: Iterable[StackEntry]) -> Any:
    """``tree`` with ``name_0``, ``name_1``, ... of every name in ``names`` stacked into ``name`` (a
    :class:`LayerRun`'s layers into its entry)."""
    return to_layout(tree, [_change(entry, False) for entry in names])


def _segments(paths: Iterable[str]) -> set[str]:
    return {segment for path in paths for segment in path.split("/")}


def _mapping_keys(tree: Any) -> set[str]:
    keys: set[str] = set()

    def collect(mapping: Mapping[str, Any]) -> dict[str, Any]:
        keys.update(str(k) for k in mapping)
        return dict(mapping)

    _map_mappings(tree, collect)
    return keys


def _runs_of(layers: str, keys: Iterable[str]) -> list[str]:
    """The stacked entries among ``keys`` that hold runs of ``layers``, in layer order: the leading
    ``<kind>_<layers>`` by name, then ``<layers>``."""
    keys = set(keys)
    leading = sorted(k for k in keys if k.endswith(f"_{layers}") and not _INDEXED.match(k))
    return leading + ([layers] if layers in keys else [])


def _run_changes(
    layers: str, entries: list[str], sizes: Mapping[str, int | None], stacked_to_per_layer: bool
) -> list[LayoutChange]:
    """The changes of the stacked ``entries`` of ``layers`` (a single entry of that name: the whole stack)."""
    if entries == [layers]:
        return [LayoutChange(layers, stacked_to_per_layer)]
    changes, first = [], 0
    for name in entries:
        count = sizes.get(name)
        if count is None:
            raise ValueError(f"the size of the stacked run {name!r} is unknown; pass the saved shapes")
        changes.append(LayoutChange(name, stacked_to_per_layer, layers, first, count))
        first += count
    return changes


def _leading_sizes(paths: Iterable[str], shapes: Mapping[str, Any] | None) -> dict[str, int | None]:
    """Each path segment's leading axis size in ``shapes`` (None without shapes)."""
    sizes: dict[str, int | None] = {}
    for path in paths:
        shape = None if shapes is None else tuple(shapes[path])
        for segment in path.split("/"):
            if sizes.get(segment) is None:
                sizes[segment] = shape[0] if shape else None
    return sizes


def _unit_period(paths: Iterable[str], name: str) -> int:
    """How many positions the stacked entry ``name`` holds apart (``name/periods/layers_<i>``), else 1."""
    positions = {
        parts[at + 2]
        for parts in (path.split("/") for path in paths)
        for at in range(len(parts) - 2)
        if parts[at] == name and parts[at + 1] == "periods" and parts[at + 2].startswith("layers_")
    }
    return max(1, len(positions))


def _with_units(changes: list[LayoutChange], paths: Iterable[str]) -> list[LayoutChange]:
    """``changes`` told the unit period of each stacked entry that the tree of ``paths`` holds per position."""
    paths = list(paths)
    return [dataclasses.replace(change, period=_unit_period(paths, change.name)) for change in changes]


def layout_changes(saved_paths: Iterable[str] | Mapping[str, Any], wanted: Any) -> list[LayoutChange]:
    """How ``wanted`` must be rewritten to match a saved tree whose leaf paths (``"a/b/c"``) are
    ``saved_paths`` (a mapping to their shapes: needed for a save that holds several runs stacked):
    entries that ``wanted`` holds stacked but the save per layer, and the reverse."""
    saved = _segments(saved_paths)
    keys = _mapping_keys(wanted)
    candidates = {m["name"] for key in saved | keys if (m := _INDEXED.match(key))}
    changes: list[LayoutChange] = []
    for layers in sorted(candidates):
        if f"{layers}_0" in saved and (stacks := [k for k in _runs_of(layers, keys) if k not in saved]):
            wanted_shapes = param_shapes(wanted)
            found = _run_changes(layers, stacks, _leading_sizes(wanted_shapes, wanted_shapes), True)
            changes += _with_units(found, wanted_shapes)
        elif f"{layers}_0" in keys - saved and (stacks := [k for k in _runs_of(layers, saved) if k not in keys]):
            shapes = saved_paths if isinstance(saved_paths, Mapping) else None
            changes += _with_units(
                _run_changes(layers, stacks, _leading_sizes(saved_paths, shapes), False), saved_paths
            )
    return changes


def to_layout(tree: Any, changes: Iterable[LayoutChange]) -> Any:
    """``tree`` (arrays, or ``jax.ShapeDtypeStruct`` whose shardings gain or lose the replicated layer
    axis) rewritten by ``changes``."""
    result = tree
    for change in changes:
        if change.stacked_to_per_layer:
            result = _map_mappings(result, functools.partial(_split, run=change.run, take=_take_layer))
        else:
            result = _map_mappings(result, functools.partial(_join, run=change.run, stack=_stack_layers))
    return result


def reversed_changes(changes: Iterable[LayoutChange]) -> list[LayoutChange]:
    """The changes that undo ``changes``."""
    return [dataclasses.replace(c, stacked_to_per_layer=not c.stacked_to_per_layer) for c in changes]


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
    "LayerRun",
    "LayoutChange",
    "StackEntry",
    "as_run",
    "convert_restored",
    "layer_names",
    "layer_slots",
    "layout_changes",
    "per_layer",
    "reversed_changes",
    "stacked",
    "to_layout",
]
