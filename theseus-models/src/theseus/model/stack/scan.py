"""The stack of one run of layers (:func:`run_stack`): a unit of one or more layers, repeated and run
by one ``nn.scan``, one unit per step. A unit of one layer that needs no static layer index is a plain
stack of alike layers (:func:`layer_stack`); a longer unit gives each of its positions a layer of its
own, with its own ``BLOCK`` fields and static layer index (window, RoPE base, KV-cache shape).
Parameters, recorded outputs and what layers sow are held as one stack ``[n_layers, ...]`` when every
position has the same shape, else per position; the KV cache is always held per position."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, ClassVar, NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.base.sown import AUX_COLLECTIONS
from theseus.model.layers import splash
from theseus.model.layers._common import INIT_STD, child
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture
from theseus.model.stack.block import INDEX_ARGNUM, STATIC_ARGNUMS, Block, LayerCall

#: The entry of the stacked layers of a scanned model (``blocks_<i>`` per layer otherwise).
LAYERS = "blocks"

#: ``model/remat`` policies: what the backward pass keeps from the forward pass of a layer.
REMAT_POLICIES: dict[str, Any] = {
    "none": None,  # everything (no recomputation)
    "full": jax.checkpoint_policies.nothing_saveable,  # only the layer's input
    # the projections' outputs and splash attention's (its forward kernel is not run again)
    "dots": jax.checkpoint_policies.save_from_both_policies(
        jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
        jax.checkpoint_policies.save_only_these_names(splash.RESIDUALS),
    ),
}

#: The collections a scan stacks per step (every one a layer variable lives in).
SCANNED_AXES: dict[Any, int] = {"params": 0, "cache": 0, "intermediates": 0, **dict.fromkeys(AUX_COLLECTIONS, 0)}

#: The collections a unit of alike positions holds as one stack ``[n_layers, ...]`` (all but the cache,
#: whose shapes differ between positions).
PER_LAYER = nn.DenyList("cache")

#: ``nn.scan``'s ``in_axes`` for a :class:`LayerCall`: the same for every layer.
BROADCAST_CALL = (nn.broadcast,) * len(LayerCall._fields)


class Position(NamedTuple):
    """One layer of a run's unit: its extra ``BLOCK`` fields and the static index its call's ``layer``
    gets (a layer of the same ``layer_types`` entry; None: the layer needs none, or gets its index at
    run time)."""

    options: tuple[tuple[str, Any], ...] = ()
    layer: int | None = None


def with_remat(block: type[Block], policy: str, *, prevent_cse: bool, static_layer: bool = False) -> type[Block]:
    """``block`` recomputed in the backward pass under ``policy`` (unchanged for ``"none"``);
    ``static_layer``: the call's ``layer`` index is a Python value too."""
    if policy == "none":
        return block
    lifted: type[Block] = nn.remat(  # deterministic and decode (and a static layer index) are Python values
        block,
        static_argnums=(*STATIC_ARGNUMS, INDEX_ARGNUM) if static_layer else STATIC_ARGNUMS,
        policy=REMAT_POLICIES[policy],
        prevent_cse=prevent_cse,
    )
    return lifted


@functools.cache
def _scan_body(block: Any) -> type[Block]:
    """``block`` with the call shape ``nn.scan`` expects: ``(carry, *call) -> (carry, None)``, the
    :class:`LayerCall` then, for an indexed stack, the layer's index (the scanned input)."""

    class Layer(block):  # type: ignore[valid-type,misc]
        @nn.nowrap  # only the layer's own call is a module method: recorded outputs stay as unrolled
        def __call__(self, x: jax.Array, *call: Any) -> tuple[jax.Array, None]:  # type: ignore[override]
            return super().__call__(x, *call), None

    Layer.__name__ = Layer.__qualname__ = f"Scanned{block.__name__}"
    return Layer


@functools.cache
def layer_stack(block: Any, n_layers: int, remat: str, unroll: int = 1, indexed: bool = False) -> type[Block]:
    """``n_layers`` copies of ``block`` run by one ``nn.scan``: every variable gets a leading layer axis
    (logical axis ``layers``, never sharded), dropout and initialisation a key per layer; ``remat``
    applies per layer; each loop iteration runs ``unroll`` layers. ``indexed``: the stack is called with
    the layer indices ``[n_layers]`` as a scanned input (each layer picks its window at run time)."""
    body = with_remat(_scan_body(block), remat, prevent_cse=False)
    stack: type[Block] = nn.scan(
        body,
        variable_axes=SCANNED_AXES,
        split_rngs={"params": True, "dropout": True},
        in_axes=(*BROADCAST_CALL, 0) if indexed else BROADCAST_CALL,
        length=n_layers,
        unroll=unroll,
        metadata_params={nn.PARTITION_NAME: Axis.LAYERS},
    )
    return stack


# ----------------------------------------------------------------- variable layouts of a unit

Tree = Any


def _is_box(leaf: Any) -> bool:
    return isinstance(leaf, nn.Partitioned)


def _each(fn: Callable[[jax.Array], jax.Array], names: Callable[[tuple[Any, ...]], tuple[Any, ...]]) -> Any:
    """A tree function applying ``fn`` to every array (a box's value, whose logical axes become ``names``)."""

    def leaf(x: Any) -> Any:
        return x.replace(value=fn(x.value), names=names(tuple(x.names))) if _is_box(x) else fn(x)

    return lambda tree: jax.tree_util.tree_map(leaf, tree, is_leaf=_is_box)


def _stacked(trees: list[Tree], axis: Any = None, join: Callable[..., jax.Array] = jnp.stack) -> Tree:
    """``trees`` joined leaf by leaf (stacked on a new leading axis named ``axis``, or ``join``-ed)."""

    def leaf(*xs: Any) -> Any:
        if not _is_box(xs[0]):
            return join(list(xs))
        names = (axis, *xs[0].names) if join is jnp.stack else xs[0].names
        return xs[0].replace(value=join([x.value for x in xs]), names=names)

    return jax.tree_util.tree_map(leaf, *trees, is_leaf=_is_box)


def _collections(fn: Callable[[Tree], Tree]) -> Callable[[Any], dict[str, Tree]]:
    """``fn`` applied to each non-empty collection of a variable group."""
    return lambda group: {name: fn(tree) if tree else tree for name, tree in group.items()}


def _remapped(module: Any, collections: Any, read: Callable[[Tree], Tree], write: Callable[[Tree], Tree]) -> Any:
    """``module`` seeing each of ``collections`` as ``read`` gives it, its writes stored back by ``write``."""
    return nn.map_variables(
        module, collections, trans_in_fn=_collections(read), trans_out_fn=_collections(write), mutable=True
    )


def _drop_first(names: tuple[Any, ...]) -> tuple[Any, ...]:
    return names[1:]


def _at(index: int) -> Any:
    """A tree function taking entry ``index`` of every array's leading axis (which a box's names lose)."""

    def take(v: jax.Array) -> jax.Array:
        return v[index]

    return _each(take, _drop_first)


def _split_positions(tree: Tree, period: int) -> Tree:
    """One unit's variables ``[period, ...]`` -> ``layers_<i>`` with position ``i``'s."""
    return {f"layers_{i}": _at(i)(tree) for i in range(period)}


def _join_positions(tree: Tree, period: int) -> Tree:
    """``layers_<i>`` -> one unit's variables stacked ``[period, ...]`` (the reverse)."""
    return _stacked([tree[f"layers_{i}"] for i in range(period)])


def _split_rest(tree: Tree, scanned: int, n_layers: int) -> Tree:
    """Every layer's variables ``[n_layers, ...]`` -> ``periods`` (the same arrays, uncopied) and the
    leftover layers ``rest_<j>`` (layer ``scanned + j``)."""
    rest = {f"rest_{j}": _at(scanned + j)(tree) for j in range(n_layers - scanned)}
    return {"periods": tree, **rest}


def _join_rest(tree: Tree, scanned: int, n_layers: int) -> Tree:
    """``periods`` ``[scanned, ...]`` and ``rest_<j>`` -> every layer's variables ``[n_layers, ...]``."""
    if scanned == n_layers:
        return tree["periods"]
    rest = _stacked([tree[f"rest_{j}"] for j in range(n_layers - scanned)], Axis.LAYERS)
    return _stacked([tree["periods"], rest], join=jnp.concatenate)


def _fold(period: int, scanned: int) -> Any:
    """``[n_layers, ...]`` -> the whole units ``[n_units, period, ...]`` (a reshape, after a slice when
    layers are left over)."""

    def fold(v: jax.Array) -> jax.Array:
        return (v if v.shape[0] == scanned else v[:scanned]).reshape(scanned // period, period, *v.shape[1:])

    return _each(fold, lambda names: (names[0], None, *names[1:]))


_unfold = _each(lambda v: v.reshape(v.shape[0] * v.shape[1], *v.shape[2:]), lambda names: (names[0], *names[2:]))


def _read_in_place(variables: Any, first: jax.Array, period: int) -> dict[str, Tree]:
    """One unit's variables -> ``layers_<i>``: parameters read from the whole stack ``[n_layers, ...]``
    (layer ``first + i``, a dynamic slice: no copy of the stack), the rest from the step's ``[period, ...]``."""

    def at(i: int) -> Any:
        return _each(lambda v: jax.lax.dynamic_index_in_dim(v, first + i, keepdims=False), _drop_first)

    out: dict[str, Tree] = {}
    for name, tree in variables.items():
        if tree and name == "params":
            out[name] = {f"layers_{i}": at(i)(tree) for i in range(period)}
        else:
            out[name] = _split_positions(tree, period) if tree else tree
    return out


def _recompute_stack_reads(primitive: Any, *_: Any, **__: Any) -> bool:
    """Checkpoint policy of a step that reads its parameters in place: save what the backward pass needs
    as without remat, but not the parameters read from the stack (dynamic slices and their squeezes)."""
    return primitive not in (jax.lax.dynamic_slice_p, jax.lax.squeeze_p)


# ----------------------------------------------------------------- units of layers


class Unit(Module):
    """One scan step of a :func:`run_stack`: the layers ``layers_<i>`` of ``UNIT``, in order, each with
    its position's fields and static layer index. Given ``first`` (the unit's first layer), the
    parameters are the run's whole stack ``[n_layers, ...]`` and each layer reads its own in place."""

    BLOCK: ClassVar[type[Block]] = Block
    UNIT: ClassVar[tuple[Position, ...]] = (Position(),)
    REMAT: ClassVar[str] = "none"

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    def setup(self) -> None:
        block = with_remat(self.BLOCK, self.REMAT, prevent_cse=False, static_layer=True)
        arch, out_std = self.architecture, self.out_std
        self.layers = [child(self, block, architecture=arch, out_std=out_std, **dict(p.options)) for p in self.UNIT]

    @nn.nowrap
    def _run(self, x: jax.Array, call: LayerCall) -> jax.Array:
        layer: Any
        for layer, position in zip(self.layers, self.UNIT, strict=True):
            x = layer(x, *call, position.layer)
        return x

    @nn.nowrap  # only the layers' calls are module methods: recorded outputs stay as in a plain stack
    def __call__(self, x: jax.Array, *args: Any) -> tuple[jax.Array, None]:
        """``args``: the :class:`LayerCall`, then (parameters read in place) ``first``, the unit's first layer."""
        call, rest = LayerCall.split(args)
        first = rest[0] if rest else None
        if first is None:
            return self._run(x, call), None
        period = len(self.UNIT)
        run = nn.map_variables(
            type(self)._run,
            PER_LAYER,
            trans_in_fn=functools.partial(_read_in_place, first=first, period=period),
            trans_out_fn=_collections(functools.partial(_join_positions, period=period)),
            mutable=True,
        )
        return run(self, x, call), None


def _unit_scan(unit: type[Unit], n_layers: int, unroll: int, same: bool, in_place: bool) -> Any:
    """The ``nn.scan`` over the ``n_layers // period`` whole units, ``unroll`` per loop iteration. ``same``
    (alike positions): it takes and gives the collections of :data:`PER_LAYER` as ``[n_units * period,
    ...]``, sliced ``[period, ...]`` per step (``in_place``: the parameters broadcast whole and read in
    place, each step told its first layer); otherwise every variable per position (``layers_<i>``)."""
    period = len(unit.UNIT)
    scanned = n_layers - n_layers % period
    options: dict[str, Any] = {"length": scanned // period, "unroll": unroll}
    options |= {"metadata_params": {nn.PARTITION_NAME: Axis.LAYERS}, "split_rngs": {"dropout": True}}
    if in_place:  # remat only to read the parameters again in the backward pass (static: deterministic, decode)
        body = nn.remat(unit, policy=_recompute_stack_reads, prevent_cse=False, static_argnums=STATIC_ARGNUMS)
        axes = {name: axis for name, axis in SCANNED_AXES.items() if name != "params"}
        scan = nn.scan(body, variable_axes=axes, variable_broadcast="params", in_axes=(*BROADCAST_CALL, 0), **options)
        folded: Any = nn.DenyList(("cache", "params"))
    else:
        split = functools.partial(_split_positions, period=period)
        body = _remapped(unit, PER_LAYER, split, functools.partial(_join_positions, period=period)) if same else unit
        options["split_rngs"] = {"params": True, "dropout": True}
        scan = nn.scan(body, variable_axes=SCANNED_AXES, in_axes=BROADCAST_CALL, **options)
        folded = PER_LAYER
    return _remapped(scan, folded, _fold(period, scanned), _unfold) if same else scan


class UnitLayers(Module):
    """``N_LAYERS`` layers as ``periods`` (one ``nn.scan`` over whole units of ``UNIT``) then the
    leftover layers unrolled (``rest_<j>``: the unit's first positions). With layers left over and
    read-only parameters (training and decoding steps, not initialisation) a stack of alike positions
    scans with its parameters read in place (``IN_PLACE``): slicing the leftover layers off would copy
    the stack on every call."""

    BLOCK: ClassVar[type[Block]] = Block
    UNIT: ClassVar[tuple[Position, ...]] = (Position(),)
    N_LAYERS: ClassVar[int] = 1
    REMAT: ClassVar[str] = "none"
    SCANNED: ClassVar[Any] = None
    IN_PLACE: ClassVar[Any] = None

    architecture: Architecture | None = None
    out_std: float = INIT_STD

    def _in_place(self) -> bool:
        return self.IN_PLACE is not None and not self.is_mutable_collection("params")

    def setup(self) -> None:
        arch, out_std = self.architecture, self.out_std
        scan = self.IN_PLACE if self._in_place() else self.SCANNED
        self.periods = child(self, scan, architecture=arch, out_std=out_std)
        block = with_remat(self.BLOCK, self.REMAT, prevent_cse=True, static_layer=True)
        left = self.UNIT[: self.N_LAYERS % len(self.UNIT)]
        self.rest = [child(self, block, architecture=arch, out_std=out_std, **dict(p.options)) for p in left]

    @nn.nowrap
    def __call__(self, x: jax.Array, *args: Any) -> tuple[jax.Array, None]:
        """``args``: the :class:`LayerCall`."""
        call = LayerCall(*args)
        period = len(self.UNIT)
        firsts = (jnp.arange(0, self.N_LAYERS - len(self.rest), period),) if self._in_place() else ()
        x, _ = self.periods(x, *call, *firsts)
        for layer, position in zip(self.rest, self.UNIT, strict=False):
            x = layer(x, *call, position.layer)
        return x, None


def alike(unit: tuple[Position, ...]) -> bool:
    """Whether every position of ``unit`` has the same ``BLOCK`` fields (the same parameter shapes)."""
    return len({p.options for p in unit}) == 1


@functools.cache
def run_stack(
    block: Any, unit: tuple[Position, ...], n_layers: int, remat: str, unroll: int = 1, indexed: bool = False
) -> type[Module]:
    """The stack of a run of ``n_layers`` layers repeating ``unit``, one ``nn.scan`` step per unit,
    ``unroll`` units per loop iteration. A unit of one position without a static layer index is a
    :func:`layer_stack` (``indexed``: told each layer's index at run time; its position's fields are
    given to the stack). Otherwise each position is a layer of its own with its static index (a sliding
    layer keeps a ring-buffer KV cache of its window), and the ``n_layers % period`` last layers run
    unrolled after the loop. Positions of one shape hold their variables but the cache as
    :func:`layer_stack` does (``[n_layers, ...]``), read in place by training and decoding steps; the
    cache, and every variable of a unit whose positions differ in shape, is held per position
    (``periods/layers_<i>/...`` ``[n_units, ...]``, then ``rest_<j>/...``)."""
    if len(unit) == 1 and unit[0].layer is None:
        return layer_stack(block, n_layers, remat, unroll, indexed)
    body = type("Unit", (Unit,), {"BLOCK": block, "UNIT": unit, "REMAT": remat})
    same = alike(unit)
    scans = {
        "SCANNED": _unit_scan(body, n_layers, unroll, same, in_place=False),
        "IN_PLACE": _unit_scan(body, n_layers, unroll, same, in_place=True) if same and n_layers % len(unit) else None,
    }
    fields = {"BLOCK": block, "UNIT": unit, "N_LAYERS": n_layers, "REMAT": remat, **scans}
    layers: type[Module] = type("UnitLayers", (UnitLayers,), fields)
    if not same:
        return layers
    scanned = n_layers - n_layers % len(unit)
    split = functools.partial(_split_rest, scanned=scanned, n_layers=n_layers)
    stack: type[Module] = _remapped(
        layers, PER_LAYER, split, functools.partial(_join_rest, scanned=scanned, n_layers=n_layers)
    )
    return stack


__all__ = [
    "LAYERS",
    "REMAT_POLICIES",
    "Position",
    "Unit",
    "UnitLayers",
    "alike",
    "layer_stack",
    "run_stack",
    "with_remat",
]
