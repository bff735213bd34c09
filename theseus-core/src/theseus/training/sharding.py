"""The device mesh and the shardings of parameters, optimizer state and batches.

The trainer builds one ``TrainerSharding`` from ``mesh/*`` configuration and the model's
``ShardingPlan``. The mesh has the axes ``data`` and ``model``, and with an ``ep`` layout first an
``expert`` axis: mixture layers split their experts over it, and batch rows are split over
``expert`` and ``data`` together (expert-major), so the expert axis also carries data parallelism.
With ``mesh/context`` above 1 the mesh has a ``context`` axis between ``data`` and ``model``: each
row's sequence is split over it (context parallelism; logical ``sequence`` maps onto it), parameters
are laid out as the layout says, and attention meets the other devices' keys in the form
``context_attention`` names (:mod:`theseus.model.layers.context_parallel`).
With ``mesh/pipeline`` above 1 the mesh has a ``pipeline`` axis first: the layer axis of a scanned
stack (logical ``layers``) is split over it, each device holding consecutive layers, and the stack runs
as the ``pipelining`` schedule says (:mod:`theseus.model.stack.pipeline`); batch rows are not split over it
(with ``1f1b`` the vocabulary rows of the embeddings and the head are: :attr:`TrainerSharding.storage_rules`).
The same object is handed to ``train_step`` / ``val_step`` / ``trace`` for every layout:
``.mesh`` is a ``jax.sharding.Mesh`` with Auto axis types and ``.parameter_fwdbwd_mapping`` is
the rule list for ``flax.linen.logical_axis_rules``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from theseus.base.accelerator import Accelerator, of_devices, targeting
from theseus.base.axis import (
    CONTEXT_ATTENTION,
    PIPELINE_SCHEDULES,
    Axis,
    MeshAxes,
    MeshAxis,
    Pipelining,
    ShardingPlan,
    attending_with,
    pipelining,
)
from theseus.base.tree import path_text
from theseus.errors import ConfigError

#: The mesh axes each layout shards parameters over (``ep``: the stacked experts of mixture layers).
LAYOUTS: dict[str, tuple[str, ...]] = {
    "dp": (),
    "fsdp": (MeshAxis.DATA,),
    "tp": (MeshAxis.MODEL,),
    "fsdp+tp": (MeshAxis.DATA, MeshAxis.MODEL),
    "ep": (MeshAxis.EXPERT,),
    "fsdp+ep": (MeshAxis.DATA, MeshAxis.EXPERT),
    "tp+ep": (MeshAxis.MODEL, MeshAxis.EXPERT),
    "fsdp+tp+ep": (MeshAxis.DATA, MeshAxis.MODEL, MeshAxis.EXPERT),
}


@dataclass(frozen=True, eq=False)
class TrainerSharding:
    """The mesh, the layout's logical-axis rules, and helpers to place arrays on the mesh."""

    mesh: Mesh
    layout: str
    plan: ShardingPlan
    parameter_fwdbwd_mapping: list[tuple[str, MeshAxes]] = field(default_factory=list)
    context_attention: str = "allgather"
    pipelining: Pipelining = field(default_factory=Pipelining)

    @property
    def batch_axes(self) -> tuple[str, ...]:
        """The mesh axes batch rows are split over: ``data``, with ``expert`` first when the mesh has one."""
        return batch_axes(self.mesh)

    @property
    def data_size(self) -> int:
        """Number of data-parallel shards of a batch (the sizes of the :attr:`batch_axes` multiplied)."""
        return int(np.prod([self.mesh.shape[name] for name in self.batch_axes]))

    @property
    def expert_size(self) -> int:
        """Size of the ``expert`` mesh axis (1 without one)."""
        return int(self.mesh.shape.get(MeshAxis.EXPERT, 1))

    @property
    def context_size(self) -> int:
        """Size of the ``context`` mesh axis: devices each row's sequence is split over (1 without one)."""
        return int(self.mesh.shape.get(MeshAxis.CONTEXT, 1))

    @property
    def pipeline_size(self) -> int:
        """Size of the ``pipeline`` mesh axis: stages the layer stack is split into (1 without one)."""
        return int(self.mesh.shape.get(MeshAxis.PIPELINE, 1))

    @property
    def model_size(self) -> int:
        return int(self.mesh.shape[MeshAxis.MODEL])

    @functools.cached_property
    def _feed(self) -> tuple[int, int]:
        return data_feed(self.mesh)

    @property
    def feed_index(self) -> int:
        """Which share of every global batch this process feeds (0 with one process)."""
        return self._feed[0]

    @property
    def feed_count(self) -> int:
        """Number of distinct shares a global batch is split into across processes.

        Equals the process count when each process holds its own data-parallel rows;
        processes that share rows (a model axis spanning processes) feed identical data.
        """
        return self._feed[1]

    @property
    def accelerator(self) -> Accelerator:
        """The kind of device the mesh spans (what model code chooses kernels for)."""
        return of_devices(list(self.mesh.devices.flat))

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The abstract mesh, logical-axis rules and target accelerator under which model code runs."""
        with (
            jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh),
            nn.logical_axis_rules(self.parameter_fwdbwd_mapping),
            targeting(self.accelerator),
            attending_with(self.context_attention),
            pipelining(self.pipelining),
        ):
            yield

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self, ndim: int, leading: int = 0) -> NamedSharding:
        """Rows sharded over the :attr:`batch_axes`; ``leading`` unsharded axes come first (e.g. micro-steps)."""
        rows = self.batch_axes if len(self.batch_axes) > 1 else self.batch_axes[0]
        spec = (None,) * leading + (rows,) + (None,) * (ndim - leading - 1)
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def put_batch(self, batch: Mapping[str, Any], leading: int = 0) -> dict[str, jax.Array]:
        """Place host arrays on the mesh, rows sharded over the data axis.

        With several processes, each passes its own share (``feed_index`` of ``feed_count``)
        of the global batch; the result is the global array of all shares in order.
        """
        placed = {}
        for name, value in batch.items():
            array = np.asarray(value)
            sharding = self.batch_sharding(array.ndim, leading)
            if jax.process_count() == 1:
                placed[name] = jax.device_put(array, sharding)
            else:
                shape = list(array.shape)
                shape[leading] *= self.feed_count
                placed[name] = jax.make_array_from_process_local_data(sharding, array, tuple(shape))
        return placed

    def put_global(self, batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Place a batch that every process holds in full (e.g. evaluation rows): each passes on its share."""
        if jax.process_count() == 1:
            return self.put_batch(batch)
        index, count = self.feed_index, self.feed_count
        local = {}
        for name, value in batch.items():
            array = np.asarray(value)
            rows = len(array)
            if rows % count:
                raise ConfigError(f"a batch of {rows} rows cannot be split over {count} processes")
            local[name] = array[rows // count * index : rows // count * (index + 1)]
        return self.put_batch(local)

    def fetch(self, tree: Any) -> Any:
        """Host (numpy) copies of the arrays in ``tree``, complete on every process."""
        if jax.process_count() == 1:
            return jax.device_get(tree)
        from jax.experimental import multihost_utils

        return multihost_utils.process_allgather(tree, tiled=True)

    def put_replicated(self, value: Any) -> Any:
        """A host value (the same on every process) as arrays replicated over the mesh."""
        return jax.tree.map(
            lambda leaf: jax.make_array_from_callback(np.shape(leaf), self.replicated, lambda i: np.asarray(leaf)[i]),
            value,
        )

    @property
    def storage_rules(self) -> list[tuple[str, MeshAxes]]:
        """The rules parameters are stored by: the computation's, and with a ``1f1b`` pipeline the
        vocabulary rows of the embeddings and the output head split over ``pipeline`` as well, so that
        each stage holds its share of them as it holds its share of the layers (gathered where they are
        used). Not under ``gpipe`` or ``interleaved``, whose head runs after the pipeline: there XLA
        then partitions the head's logits by that split and keeps more temporaries than it saves
        (36 GB per device more at a 70B shape on 4 x 8 H100, docs/sharding-design.md)."""
        rules = self.parameter_fwdbwd_mapping
        if self.pipeline_size == 1 or self.pipelining.schedule != "1f1b":
            return rules
        vocab = next((axes for name, axes in rules if name == Axis.VOCAB), None)  # flax's first match
        names = () if vocab is None else (vocab,) if isinstance(vocab, str) else tuple(vocab)
        return [(Axis.VOCAB, (*names, MeshAxis.PIPELINE)), *rules]

    def logical_shardings(self, logical_specs: Any) -> Any:
        """Turn a tree of logical ``PartitionSpec`` (from ``nn.get_partition_spec``) into the shardings
        parameters are stored with (:attr:`storage_rules`)."""
        shardings = nn.logical_to_mesh_sharding(logical_specs, self.mesh, self.storage_rules)
        return jax.tree.map(_canonical, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def _canonical(sharding: Any) -> Any:
    """Drop trailing unsharded dimensions (``P('data', None)`` -> ``P('data')``), the form jit returns."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes of ``mesh`` that split batch rows, major first: ``expert`` (if present), then ``data``."""
    return tuple(name for name in (MeshAxis.EXPERT, MeshAxis.DATA) if name in mesh.axis_names)


def data_feed(mesh: Mesh, process_index: int | None = None) -> tuple[int, int]:
    """``(index, count)``: the share of each global batch that ``process_index`` feeds (see :func:`feed_share`)."""
    process = jax.process_index() if process_index is None else process_index
    return feed_share(mesh.devices, tuple(mesh.axis_names.index(name) for name in batch_axes(mesh)), process)


def feed_share(devices: np.ndarray, data_axes: int | tuple[int, ...], process: int) -> tuple[int, int]:
    """``(index, count)`` of ``process`` for a mesh's device array whose ``data_axes`` (major first) split batches.

    A process feeds the rows of the data positions its devices occupy (the positions on
    ``data_axes`` counted row-major). Those positions must form equal contiguous blocks that
    are either identical or disjoint between processes (what ``jax.make_mesh`` builds); each
    distinct block is one share, numbered in data order.
    """
    axes = (data_axes,) if isinstance(data_axes, int) else data_axes
    sizes = [devices.shape[axis] for axis in axes]
    rows: dict[int, set[int]] = {}
    for position, device in np.ndenumerate(devices):
        row = int(np.ravel_multi_index(tuple(position[axis] for axis in axes), sizes))
        rows.setdefault(int(device.process_index), set()).add(row)
    blocks = sorted({tuple(sorted(r)) for r in rows.values()})
    for block in blocks:
        contiguous = list(block) == list(range(block[0], block[0] + len(block)))
        overlapping = any(other != block and set(other) & set(block) for other in blocks)
        if not contiguous or overlapping or len(block) != len(blocks[0]):
            raise ConfigError(
                f"the mesh gives processes the data positions {[list(b) for b in blocks]}; each process must hold "
                "one contiguous block of data positions, the same size for all - build the mesh with jax.make_mesh"
            )
    return blocks.index(tuple(sorted(rows[process]))), len(blocks)


def check_divisible(abstract_params: Any, shardings: Any, logical_specs: Any, mesh: Mesh) -> None:
    """Raise ConfigError if a parameter dimension cannot be split evenly over its mesh axes."""
    flat_params = jax.tree_util.tree_flatten_with_path(abstract_params)[0]
    structure: Any = jax.tree_util.tree_structure(abstract_params)
    flat_shardings = structure.flatten_up_to(shardings)
    flat_logical = structure.flatten_up_to(logical_specs)  # PartitionSpec, or None for unnamed parameters
    for (path, leaf), sharding, logical in zip(flat_params, flat_shardings, flat_logical, strict=True):
        logical = tuple(logical) if isinstance(logical, PartitionSpec) else ()
        for dim, (size, axes) in enumerate(zip(leaf.shape, sharding.spec, strict=False)):
            if axes is None:
                continue
            names = (axes,) if isinstance(axes, str) else tuple(axes)
            parts = int(np.prod([mesh.shape[name] for name in names]))
            if size % parts:
                logical_name = logical[dim] if dim < len(logical) else None
                label = f"{logical_name}={size}" if logical_name else f"size {size}"
                fixes = {
                    Axis.VOCAB: f"set architecture/vocab_multiple to a multiple of {parts}",
                    Axis.EXPERT: f"set architecture/moe/n_experts to a multiple of {parts}",
                    Axis.LAYERS: f"set architecture/n_layers to a multiple of {parts}",
                }
                size_fix = fixes.get(
                    logical_name or "", f"make the model's {logical_name or 'dimension'} size a multiple of {parts}"
                )
                raise ConfigError(
                    f"parameter {path_text(path)!r} dimension {dim} ({label}) is not divisible by the "
                    f"{' x '.join(names)} mesh axis of size {parts}; set {' x '.join(f'mesh/{n}' for n in names)} "
                    f"to a divisor of {size}, {size_fix}, or use a layout that does not shard {logical_name or 'it'}"
                )


def resolve_mesh_shape(
    data: int, model: int, device_count: int, expert: int = 1, context: int = 1, pipeline: int = 1
) -> tuple[int, int]:
    """Sizes of the ``data`` and ``model`` axes; one of them may be -1 (= fill the devices left by the
    others, ``expert``, ``context`` and ``pipeline`` among them)."""
    if data == -1 and model == -1:
        raise ConfigError("mesh/data and mesh/model cannot both be -1; set one of them to a size")
    for key, size in (("mesh/data", data), ("mesh/model", model)):
        if size == 0 or size < -1:
            raise ConfigError(f"{key} must be a positive size or -1 (fill), got {size}")
    for key, size in (("mesh/pipeline", pipeline), ("mesh/expert", expert), ("mesh/context", context)):
        if device_count % size:
            raise ConfigError(f"{key}={size} does not divide the {device_count} available devices; choose a divisor")
    sized = (("pipeline", pipeline), ("expert", expert), ("data", 0), ("context", context), ("model", 0))
    named = [name for name, size in sized if size != 1]
    axes = " x ".join(f"mesh/{name}" for name in named)
    fixed = pipeline * expert * context
    if device_count % fixed:
        given = " x ".join(f"mesh/{name}" for name, size in sized if size > 1)
        raise ConfigError(
            f"{given} = {fixed} does not divide the {device_count} available "
            "devices; choose sizes whose product divides them"
        )
    left = device_count // fixed
    if data == -1 or model == -1:
        known = model if data == -1 else data
        if left % known:
            raise ConfigError(
                f"{device_count} devices cannot be split into mesh axes with size {known}; "
                f"choose {axes} = {device_count}"
            )
        fill = left // known
        data, model = (fill, model) if data == -1 else (data, fill)
    if fixed * data * model != device_count:
        values = {"pipeline": pipeline, "expert": expert, "data": data, "context": context, "model": model}
        sizes = "x".join(str(values[name]) for name in named)
        raise ConfigError(
            f"{axes} = {sizes} = {fixed * data * model} does not match the {device_count} "
            f"available devices; use -1 for one axis to fill the rest"
        )
    return data, model


def _check_axis(layout: str, axis: str, size: int) -> None:
    """``mesh/<axis>`` > 1 needs a layout that shards over it (``model``: tp, ``expert``: ep)."""
    if size > 1 and axis not in LAYOUTS[layout]:
        with_axis = [name for name, axes in LAYOUTS.items() if axis in axes]
        raise ConfigError(
            f"mesh/{axis}={size} but layout {layout!r} does not shard over the {axis} axis; "
            f"use mesh/layout={' or '.join(with_axis[:2])}, or set mesh/{axis}=1"
        )


def _check_experts(plan: ShardingPlan, expert: int) -> None:
    """``mesh/expert`` > 1 needs a model with experts to split (its plan maps a logical axis onto ``expert``)."""
    targets = {name for value in plan.values() for name in ((value,) if isinstance(value, str) else value or ())}
    if expert > 1 and MeshAxis.EXPERT not in targets:
        raise ConfigError(
            f"mesh/expert={expert} but the model has no mixture-of-experts layers to split over the expert axis; "
            "set mesh/expert=1 (the devices then go to mesh/data), or choose a model with experts"
        )


def _check_pipeline(plan: Pipelining, stages: int) -> Pipelining:
    """``plan`` when it can run; a one-line ConfigError naming the key to change otherwise."""
    if plan.schedule not in PIPELINE_SCHEDULES:
        raise ConfigError(f"mesh/pipeline_schedule {plan.schedule!r} is not one of {', '.join(PIPELINE_SCHEDULES)}")
    if plan.microbatches < 0 or plan.virtual < 1:
        raise ConfigError(
            f"mesh/pipeline_microbatches must be 0 or more and mesh/pipeline_virtual 1 or more, got "
            f"{plan.microbatches} and {plan.virtual}"
        )
    return plan


def _over_context(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` with every mapping onto ``data`` extended to ``data`` x ``context``."""

    def extended(value: MeshAxes) -> MeshAxes:
        names = () if value is None else (value,) if isinstance(value, str) else tuple(value)
        if MeshAxis.DATA not in names:
            return value
        at = names.index(MeshAxis.DATA) + 1
        return (*names[:at], MeshAxis.CONTEXT, *names[at:])

    return ShardingPlan({axis: extended(value) for axis, value in plan.items()})


def torus_sides(devices: Sequence[Any]) -> tuple[int, ...] | None:
    """The sides of the physical torus of TPU ``devices`` (from their ``coords``); None for other devices."""
    found = [getattr(device, "coords", None) for device in devices]
    coords: list[Sequence[int]] = [c for c in found if c is not None]
    if not coords or len(coords) != len(found):
        return None
    return tuple(max(c[i] for c in coords) - min(c[i] for c in coords) + 1 for i in range(len(coords[0])))


def _make_mesh(shape: tuple[int, ...], names: tuple[str, ...], devices: Sequence[Any]) -> Mesh:
    """``jax.make_mesh``, with a mesh that cannot be laid on a TPU slice's torus (an axis of 8 on a 4x4x4
    slice, whose axes must each be a product of some of its sides) as one line naming what fits."""
    axis_types = (AxisType.Auto,) * len(names)
    try:
        mesh = jax.make_mesh(shape, names, axis_types=axis_types, devices=devices)
    except NotImplementedError as error:
        sides = torus_sides(devices)
        if sides is None:
            raise
        fits = sorted({int(np.prod(subset)) for subset in _subsets(sides)})
        laid = " x ".join(f"{name} {size}" for name, size in zip(names, shape, strict=True))
        raise ConfigError(
            f"the mesh ({laid}) cannot be laid on the {'x'.join(map(str, sides))} torus of these TPU chips: "
            f"each mesh axis must be a product of some of its sides ({', '.join(map(str, fits))}); "
            "set mesh/model, mesh/expert, mesh/context or mesh/pipeline to such sizes"
        ) from error
    if len({device.process_index for device in devices}) > 1 and not _feeds_contiguously(mesh):
        # jax lays a TPU slice's axes along its torus, which can give a host every other data position
        # (v5p:2x2x2, two hosts: [0, 2, 4, 6] and [1, 3, 5, 7]); a host feeds one contiguous share of each
        # batch, so its devices go in one block of the mesh instead (the collectives stay on the slice).
        ordered = sorted(devices, key=lambda device: (device.process_index, device.id))
        mesh = Mesh(np.array(ordered, dtype=object).reshape(shape), names, axis_types=axis_types)
    return mesh


def _feeds_contiguously(mesh: Mesh) -> bool:
    """Whether every process of ``mesh`` holds one contiguous block of its data positions."""
    try:
        for process in {device.process_index for device in mesh.devices.flat}:
            data_feed(mesh, process)
    except ConfigError:
        return False
    return True


def _subsets(sides: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    for mask in range(1 << len(sides)):
        yield tuple(side for i, side in enumerate(sides) if mask >> i & 1)


def build_sharding(
    plan: ShardingPlan,
    *,
    layout: str = "dp",
    data: int = -1,
    model: int = 1,
    expert: int = 1,
    context: int = 1,
    context_attention: str = "allgather",
    pipeline: int = 1,
    pipeline_plan: Pipelining | None = None,
    devices: Sequence[Any] | None = None,
) -> TrainerSharding:
    """The mesh and rules for ``layout`` over ``devices`` (all devices by default).

    A layout with ``ep`` gives the mesh an ``expert`` axis of size ``expert`` (first, so it is the
    major part of the batch split) and splits batch rows over ``expert`` x ``data``. ``context`` above
    1 adds a ``context`` axis of that size that splits each row's sequence, with attention across it
    in the form ``context_attention`` (``allgather`` or ``ring``). ``pipeline`` above 1 adds a
    ``pipeline`` axis of that size, first, that splits the stacked layers into stages run as
    ``pipeline_plan`` says."""
    if layout not in LAYOUTS:
        raise ConfigError(f"mesh/layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    for key, size in (("mesh/expert", expert), ("mesh/context", context), ("mesh/pipeline", pipeline)):
        if size < 1:
            raise ConfigError(f"{key} must be a positive size, got {size}")
    pipeline_plan = _check_pipeline(pipeline_plan or Pipelining(), pipeline)
    if context_attention not in CONTEXT_ATTENTION:
        raise ConfigError(f"mesh/context_attention {context_attention!r} is not one of {', '.join(CONTEXT_ATTENTION)}")
    devices = list(devices) if devices is not None else jax.devices()
    _check_axis(layout, MeshAxis.MODEL, model)
    _check_axis(layout, MeshAxis.EXPERT, expert)
    _check_experts(plan, expert)
    data, model = resolve_mesh_shape(data, model, len(devices), expert, context, pipeline)
    _check_axis(layout, MeshAxis.MODEL, model)
    restricted = plan.restricted(LAYOUTS[layout])
    if context > 1:  # a row's devices hold parts of one batch shard: FSDP splits over data x context
        restricted = _over_context(restricted)
    names: tuple[str, ...] = (MeshAxis.DATA, MeshAxis.MODEL)
    shape: tuple[int, ...] = (data, model)
    if context > 1:
        names, shape = (MeshAxis.DATA, MeshAxis.CONTEXT, MeshAxis.MODEL), (data, context, model)
    if MeshAxis.EXPERT in LAYOUTS[layout]:
        names, shape = (MeshAxis.EXPERT, *names), (expert, *shape)
    if pipeline > 1:
        names, shape = (MeshAxis.PIPELINE, *names), (pipeline, *shape)
    mesh = _make_mesh(shape, names, devices)
    rules: list[tuple[str, MeshAxes]] = []
    if Axis.BATCH not in restricted:
        rows = batch_axes(mesh)
        rules.append((Axis.BATCH, rows if len(rows) > 1 else rows[0]))
    if context > 1:
        rules.append((Axis.SEQUENCE, MeshAxis.CONTEXT))
    if pipeline > 1:
        rules.append((Axis.LAYERS, MeshAxis.PIPELINE))
    rules.extend(restricted.rules())
    return TrainerSharding(
        mesh=mesh,
        layout=layout,
        plan=restricted,
        parameter_fwdbwd_mapping=rules,
        context_attention=context_attention,
        pipelining=pipeline_plan,
    )
