"""Layer stacks under one ``nn.scan``: every layer alike (:func:`layer_stack`), or one scan step per
period of ``layer_types`` (:func:`periodic_stack`), each position its own layer with its own window,
RoPE base and KV-cache shape. Both hold every layer variable but the cache stacked under one entry with
a leading ``[n_layers]`` axis, so checkpoints, Hugging Face names and adapters see one layout."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.base.sown import AUX_COLLECTIONS
from theseus.model.layers._common import INIT_STD, child
from theseus.model.models.architecture import Architecture
from theseus.model.models.block import Block
from theseus.model.module import Module

#: The entry of the stacked layers of a scanned model (``blocks_<i>`` per layer otherwise).
LAYERS = "blocks"

#: ``model/remat`` policies: what the backward pass keeps from the forward pass of a layer.
REMAT_POLICIES: dict[str, Any] = {
    "none": None,  # everything (no recomputation)
    "full": jax.checkpoint_policies.nothing_saveable,  # only the layer's input
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # the projections' outputs
}

#: The collections a scan stacks per layer (every one a layer variable lives in).
SCANNED_AXES: dict[Any, int] = {"params": 0, "cache": 0, "intermediates": 0, **dict.fromkeys(AUX_COLLECTIONS, 0)}

#: Every collection but the KV cache keeps the ``[n_layers]`` layout in a periodic stack; the cache
#: keeps one stack per position of the period (its shapes differ between positions).
PER_LAYER_COLLECTIONS = nn.DenyList("cache")


def with_remat(block: type[Block], policy: str, *, prevent_cse: bool, static_layer: bool = False) -> type[Block]:
    """``block`` recomputed in the backward pass under ``policy`` (unchanged for ``"none"``);
    ``static_layer``: the call's ``layer`` index is a Python int too (layers with ``layer_types``
    that are unrolled or positions of a period)."""
    if policy == "none":
        return block
    lifted: type[Block] = nn.remat(  # deterministic and decode (and a static layer index) are Python values
        block,
        static_argnums=(4, 5, 6) if static_layer else (4, 5),
        policy=REMAT_POLICIES[policy],
        prevent_cse=prevent_cse,
    )
    return lifted


@functools.cache
def _scan_body(block: Any, indexed: bool = False) -> type[Block]:
    """``block`` with the call shape ``nn.scan`` expects: ``(carry, ...) -> (carry, None)``; ``indexed``:
    the layer's index comes in as the scanned input ``layer`` (architectures with ``layer_types``)."""

    class Layer(block):  # type: ignore[valid-type,misc]
        @nn.nowrap  # only the layer's own call is a module method: recorded outputs stay as unrolled
        def __call__(  # type: ignore[override]
            self,
            x: jax.Array,
            padding_mask: jax.Array | None = None,
            positions: jax.Array | None = None,
            deterministic: bool = False,
            decode: bool = False,
            layer: jax.Array | None = None,
        ) -> tuple[jax.Array, None]:
            if indexed:
                return super().__call__(x, padding_mask, positions, deterministic, decode, layer), None
            return super().__call__(x, padding_mask, positions, deterministic, decode), None

    Layer.__name__ = Layer.__qualname__ = f"Scanned{block.__name__}"
    return Layer


@functools.cache
def layer_stack(block: Any, n_layers: int, remat: str, unroll: int = 1, indexed: bool = False) -> type[Block]:
    """``n_layers`` copies of ``block`` run by one ``nn.scan``: parameters, KV cache, recorded
    intermediates and what layers sow for the trainer get a leading layer axis (logical axis
    ``layers``, never sharded), dropout and initialisation get a key per layer; ``remat`` applies
    per layer; each loop iteration runs ``unroll`` layers (the compiled program grows with
    ``unroll``, never with ``n_layers``).
    ``indexed``: the stack is called with the layer indices ``[n_layers]`` as a scanned input, so
    each layer can pick its own window and RoPE base (``layer_types``)."""
    body = with_remat(_scan_body(block, indexed), remat, prevent_cse=False)
    broadcast = (nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast)
    stack: type[Block] = nn.scan(
        body,
        variable_axes=SCANNED_AXES,
        split_rngs={"params": True, "dropout": True},
        in_axes=(*broadcast, 0) if indexed else broadcast,
        length=n_layers,
        unroll=unroll,
        metadata_params={nn.PARTITION_NAME: Axis.LAYERS},
    )
    return stack


# ----------------------------------------------------------------- periodic layer_types


def scan_period(layer_types: tuple[str, ...] | None) -> int | None:
    """The shortest period ``p`` of ``layer_types`` (``types[i] == types[i - p]`` for every ``i >= p``)
    when the layers hold at least two whole periods, else None (no ``layer_types``, or no repetition
    worth a loop: such a stack picks each layer's window at run time instead)."""
    if layer_types is None:
        return None
    n = len(layer_types)
    period = next(p for p in range(1, n + 1) if all(layer_types[i] == layer_types[i - p] for i in range(p, n)))
    return period if 2 * period <= n else None


Leaf = Any
Tree = Any


def _is_box(leaf: Leaf) -> bool:
    return isinstance(leaf, nn.Partitioned)


def _leaf_map(fn: Callable[[jax.Array], jax.Array], names: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> Any:
    """A leaf function applying ``fn`` to a value and ``names`` to a boxed value's logical axes."""

    def apply(leaf: Leaf) -> Leaf:
        if _is_box(leaf):
            return leaf.replace(value=fn(leaf.value), names=names(tuple(leaf.names)))
        return fn(leaf)

    return apply


def _tree_map(fn: Callable[..., Leaf], *trees: Tree) -> Tree:
    return jax.tree_util.tree_map(fn, *trees, is_leaf=_is_box)


def _stack(leaves: list[Leaf], axis_name: str | None) -> Leaf:
    """The leaves stacked on a new leading axis (a box gets ``axis_name`` in front of its names)."""
    if _is_box(leaves[0]):
        value = jnp.stack([leaf.value for leaf in leaves])
        return leaves[0].replace(value=value, names=(axis_name, *leaves[0].names))
    return jnp.stack(leaves)


def _per_collection(fn: Callable[[Tree], Tree]) -> Callable[[Mapping[str, Tree]], dict[str, Tree]]:
    """``fn`` applied to each non-empty collection of a variable group."""
    return lambda group: {name: fn(tree) if tree else tree for name, tree in group.items()}


def _position(index: int) -> str:
    return f"layers_{index}"


def _without_first(names: tuple[Any, ...]) -> tuple[Any, ...]:
    return names[1:]


def _index(index: int) -> Callable[[Leaf], Leaf]:
    """Entry ``index`` of a leaf's leading axis (which a box's names lose)."""
    return _leaf_map(lambda v: v[index], _without_first)


def _split_positions(tree: Tree, period: int) -> Tree:
    """One period's variables ``[period, ...]`` -> ``layers_<i>`` with position ``i``'s."""
    return {_position(i): _tree_map(_index(i), tree) for i in range(period)}


def _join_positions(tree: Tree, period: int) -> Tree:
    """``layers_<i>`` -> one period's variables stacked ``[period, ...]`` (the reverse)."""
    return _tree_map(lambda *leaves: _stack(list(leaves), None), *(tree[_position(i)] for i in range(period)))


def _rest(index: int) -> str:
    return f"rest_{index}"


def _split_layers(tree: Tree, period: int, n_layers: int) -> Tree:
    """Every layer's variables ``[n_layers, ...]`` -> ``periods`` (the same arrays, uncopied: the scan
    reads its layers from them) and the unrolled remainder ``rest_<j>`` (layer ``n_periods * period + j``)."""
    scanned = n_layers - n_layers % period
    out = {"periods": tree}
    for j in range(n_layers - scanned):
        out[_rest(j)] = _tree_map(_index(scanned + j), tree)
    return out


def _join_layers(tree: Tree, period: int, n_layers: int) -> Tree:
    """``periods`` (its ``n_periods * period`` layers ``[scanned, ...]``) and ``rest_<j>`` -> every layer's
    variables ``[n_layers, ...]`` (the reverse)."""
    scanned = n_layers - n_layers % period
    periods = tree["periods"]
    if scanned == n_layers:
        return periods
    rest = _tree_map(
        lambda *leaves: _stack(list(leaves), Axis.LAYERS), *(tree[_rest(j)] for j in range(n_layers - scanned))
    )

    def concat(head: Leaf, tail: Leaf) -> Leaf:
        if _is_box(head):
            return head.replace(value=jnp.concatenate([head.value, tail.value]))
        return jnp.concatenate([head, tail])

    return _tree_map(concat, periods, rest)


def _fold_periods(period: int, n_layers: int) -> Callable[[Leaf], Leaf]:
    """``[n_layers, ...]`` -> the whole periods ``[n_periods, period, ...]`` (a reshape, after a slice when
    layers are left over)."""
    scanned = n_layers - n_layers % period

    def fold(v: jax.Array) -> jax.Array:
        return (v if scanned == v.shape[0] else v[:scanned]).reshape(scanned // period, period, *v.shape[1:])

    return _leaf_map(fold, lambda names: (names[0], None, *names[1:]))


def _unfold_periods(v: jax.Array) -> jax.Array:
    return v.reshape(v.shape[0] * v.shape[1], *v.shape[2:])


def _without_second(names: tuple[Any, ...]) -> tuple[Any, ...]:
    return (names[0], *names[2:])


def _pick_positions(variables: Mapping[str, Tree], first: jax.Array, period: int) -> dict[str, Tree]:
    """One period's variables -> ``layers_<i>`` with position ``i``'s: parameters read from the whole stack
    ``[n_layers, ...]`` (the period's ``[first, first + period)`` dynamic slice, no copy of the stack),
    every other collection from its ``[period, ...]`` step of the scan."""

    def window(v: jax.Array) -> jax.Array:
        return jax.lax.dynamic_slice_in_dim(v, first, period)

    def at(i: int) -> Callable[[Leaf], Leaf]:
        return _leaf_map(lambda v: jax.lax.dynamic_index_in_dim(v, i, keepdims=False), _without_first)

    out: dict[str, Tree] = {}
    for name, tree in variables.items():
        if not tree:
            out[name] = tree
        elif name == "params":
            periods = _tree_map(_leaf_map(window, lambda names: names), tree)
            out[name] = {_position(i): _tree_map(at(i), periods) for i in range(period)}
        else:
            out[name] = _split_positions(tree, period)
    return out


def _run_layers(
    period: Period,
    x: jax.Array,
    padding_mask: jax.Array | None,
    positions: jax.Array | None,
    deterministic: bool,
    decode: bool,
) -> jax.Array:
    """``x`` through the layers of one period, position ``i`` told its static index ``i``."""
    for index, layer in enumerate(period.layers):
        x = layer(x, padding_mask, positions, deterministic, decode, index)
    return x


class Period(Module):
    """One scan step of a :func:`periodic_stack`: the ``PERIOD`` layers of one period (``layers_<i>``),
    position ``i`` told its static index ``i`` (its window and RoPE base from ``layer_types``). This one
    is scanned over its variables sliced ``[period, ...]`` per step (initialisation, or parameters being
    written); :class:`IndexedPeriod` reads the parameters from the whole stack."""

    BLOCK: ClassVar[type[Block]] = Block
    PERIOD: ClassVar[int] = 1
    REMAT: ClassVar[str] = "none"

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    def setup(self) -> None:
        block = with_remat(self.BLOCK, self.REMAT, prevent_cse=False, static_layer=True)
        self.layers = [
            child(self, block, architecture=self.architecture, out_std=self.out_std) for _ in range(self.PERIOD)
        ]

    @nn.nowrap  # only the layers' calls are module methods: recorded outputs stay as in a plain stack
    def __call__(
        self,
        x: jax.Array,
        padding_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
    ) -> tuple[jax.Array, None]:
        return _run_layers(self, x, padding_mask, positions, deterministic, decode), None


class IndexedPeriod(Period):
    """A :class:`Period` that gets the whole parameter stack ``[n_layers, ...]`` (broadcast into the scan)
    and its ``period_index``: position ``i`` reads layer ``period_index * PERIOD + i`` (a dynamic slice of
    the period's layers, as a plain scan reads its step), so no call copies the stack, also when layers
    are left over. Run under :func:`_recompute_stack_reads`: the backward pass reads those layers again
    instead of the forward pass saving copies of them."""

    @nn.nowrap
    def __call__(  # type: ignore[override]
        self,
        x: jax.Array,
        padding_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
        period_index: jax.Array | None = None,
    ) -> tuple[jax.Array, None]:
        first = jnp.asarray(0 if period_index is None else period_index) * self.PERIOD
        run = nn.map_variables(
            _run_layers,
            PER_LAYER_COLLECTIONS,
            trans_in_fn=functools.partial(_pick_positions, first=first, period=self.PERIOD),
            trans_out_fn=_per_collection(functools.partial(_join_positions, period=self.PERIOD)),
            mutable=True,
        )
        return run(self, x, padding_mask, positions, deterministic, decode), None


class PeriodicLayers(Module):
    """``N_LAYERS`` layers as ``periods`` (one ``nn.scan`` over whole periods of ``PERIOD`` layers) then
    the remainder unrolled (``rest_<j>``); :func:`periodic_stack` maps their variables to the stacked
    ``[n_layers]`` layout. The scan steps through the whole periods' slices of the stack (``SCANNED``: a
    reshape, free unless layers are left over); with layers left over and read-only parameters (training
    and decoding steps, not initialisation) it reads them from the whole stack instead (``INDEXED``),
    since slicing off the leftover layers would copy the stack on every call."""

    BLOCK: ClassVar[type[Block]] = Block
    PERIOD: ClassVar[int] = 1
    N_LAYERS: ClassVar[int] = 1
    REMAT: ClassVar[str] = "none"
    #: The scans over whole periods (:func:`_period_scan`): of the periods' slices, and of the whole stack
    #: (None without leftover layers).
    SCANNED: ClassVar[Any] = None
    INDEXED: ClassVar[Any] = None

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    def _indexed(self) -> bool:
        return self.INDEXED is not None and not self.is_mutable_collection("params")

    def setup(self) -> None:
        arch, out_std = self.architecture, self.out_std
        scan = self.INDEXED if self._indexed() else self.SCANNED
        self.periods = child(self, scan, architecture=arch, out_std=out_std)
        block = with_remat(self.BLOCK, self.REMAT, prevent_cse=True, static_layer=True)
        self.rest = [child(self, block, architecture=arch, out_std=out_std) for _ in range(self.N_LAYERS % self.PERIOD)]

    @nn.nowrap
    def __call__(
        self,
        x: jax.Array,
        padding_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
    ) -> tuple[jax.Array, None]:
        if self._indexed():
            period_indices = jnp.arange(self.N_LAYERS // self.PERIOD)
            x, _ = self.periods(x, padding_mask, positions, deterministic, decode, period_indices)
        else:
            x, _ = self.periods(x, padding_mask, positions, deterministic, decode)
        first = self.N_LAYERS - len(self.rest)
        for j, layer in enumerate(self.rest):
            x = layer(x, padding_mask, positions, deterministic, decode, first + j)
        return x, None


def _recompute_stack_reads(primitive: Any, *_: Any, **__: Any) -> bool:
    """Checkpoint policy of an :class:`IndexedPeriod` step: save what the backward pass needs as without
    remat, but the layers' parameters read from the stack (dynamic slices and their squeezes): the
    backward pass reads them again from the stack instead of the forward pass storing copies of them."""
    return primitive not in (jax.lax.dynamic_slice_p, jax.lax.squeeze_p)


def _period_scan(block: Any, n_layers: int, period: int, remat: str, unroll: int, indexed: bool) -> Any:
    """The ``nn.scan`` over the ``n_layers // period`` whole periods, ``unroll`` per loop iteration, taking
    and giving the variables ``[n_periods * period, ...]``; each step sees its layers as ``layers_<i>``.
    ``indexed``: the parameters are broadcast whole (:class:`IndexedPeriod`, told each step's index);
    otherwise the scan slices every per-layer collection ``[period, ...]`` per step (:class:`Period`)."""
    fields = {"BLOCK": block, "PERIOD": period, "REMAT": remat}
    broadcast = (nn.broadcast, nn.broadcast, nn.broadcast, nn.broadcast)
    options: dict[str, Any] = {"length": n_layers // period, "unroll": unroll}
    options["metadata_params"] = {nn.PARTITION_NAME: Axis.LAYERS}
    if indexed:  # remat only to recompute the layers' parameter reads (static: deterministic, decode)
        body = nn.remat(
            type("IndexedPeriod", (IndexedPeriod,), fields),
            policy=_recompute_stack_reads,
            prevent_cse=False,
            static_argnums=(4, 5),
        )
        scan = nn.scan(
            body,
            variable_axes={name: axis for name, axis in SCANNED_AXES.items() if name != "params"},
            variable_broadcast="params",
            split_rngs={"dropout": True},
            in_axes=(*broadcast, 0),
            **options,
        )
        return _folded(scan, nn.DenyList(("cache", "params")), period, n_layers)
    sliced = nn.map_variables(
        type("Period", (Period,), fields),
        PER_LAYER_COLLECTIONS,
        trans_in_fn=_per_collection(functools.partial(_split_positions, period=period)),
        trans_out_fn=_per_collection(functools.partial(_join_positions, period=period)),
        mutable=True,
    )
    scan = nn.scan(
        sliced, variable_axes=SCANNED_AXES, split_rngs={"params": True, "dropout": True}, in_axes=broadcast, **options
    )
    return _folded(scan, PER_LAYER_COLLECTIONS, period, n_layers)


def _folded(scan: Any, collections: Any, period: int, n_layers: int) -> Any:
    """``scan`` over whole periods with the variables of ``collections`` given and taken as
    ``[n_periods * period, ...]`` (folded to ``[n_periods, period, ...]`` for it)."""
    fold, unfold = _fold_periods(period, n_layers), _leaf_map(_unfold_periods, _without_second)
    return nn.map_variables(
        scan,
        collections,
        trans_in_fn=_per_collection(lambda tree: _tree_map(fold, tree)),
        trans_out_fn=_per_collection(lambda tree: _tree_map(unfold, tree)),
        mutable=True,
    )


@functools.cache
def periodic_stack(block: Any, n_layers: int, period: int, remat: str, unroll: int = 1) -> type[Module]:
    """``n_layers`` layers of ``block`` whose ``layer_types`` repeat every ``period`` layers: one
    ``nn.scan`` step runs one period, each position a layer of its own with a static layer index, so a
    sliding layer keeps a ring-buffer KV cache of its window and a full one the whole length; the
    ``n_layers % period`` last layers run unrolled after the loop. Parameters, recorded intermediates
    and what layers sow are held as :func:`layer_stack` holds them (``[n_layers, ...]``, logical axis
    ``layers``), and a training or decoding step reads each layer's parameters from that stack in place
    (no per-call copy of it, also with layers left over); the cache is held per position
    (``periods/layers_<i>/...`` ``[n_periods, ...]``, then ``rest_<j>/...``). ``unroll``: periods per
    loop iteration."""
    scans = {
        "SCANNED": _period_scan(block, n_layers, period, remat, unroll, indexed=False),
        "INDEXED": _period_scan(block, n_layers, period, remat, unroll, indexed=True) if n_layers % period else None,
    }
    fields = {"BLOCK": block, "PERIOD": period, "N_LAYERS": n_layers, "REMAT": remat, **scans}
    layers = type("PeriodicLayers", (PeriodicLayers,), fields)
    stack: type[Module] = nn.map_variables(
        layers,
        PER_LAYER_COLLECTIONS,
        trans_in_fn=_per_collection(functools.partial(_split_layers, period=period, n_layers=n_layers)),
        trans_out_fn=_per_collection(functools.partial(_join_layers, period=period, n_layers=n_layers)),
        mutable=True,
    )
    return stack


__all__ = [
    "REMAT_POLICIES",
    "IndexedPeriod",
    "Period",
    "PeriodicLayers",
    "layer_stack",
    "periodic_stack",
    "scan_period",
    "with_remat",
]
