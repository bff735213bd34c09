"""The device mesh and the shardings of parameters, optimizer state and batches.

The trainer builds one ``TrainerSharding`` from ``mesh/*`` configuration and the model's
``ShardingPlan``. The same object is handed to ``train_step`` / ``val_step`` / ``trace``
for every layout: ``.mesh`` is a ``jax.sharding.Mesh`` with Auto axis types and
``.parameter_fwdbwd_mapping`` is the rule list for ``flax.linen.logical_axis_rules``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from theseus.base.axis import Axis, MeshAxes, MeshAxis, ShardingPlan
from theseus.errors import ConfigError

LAYOUTS: dict[str, tuple[str, ...]] = {
    "dp": (),
    "fsdp": (MeshAxis.DATA,),
    "tp": (MeshAxis.MODEL,),
    "fsdp+tp": (MeshAxis.DATA, MeshAxis.MODEL),
}


@dataclass(frozen=True, eq=False)
class TrainerSharding:
    """The mesh, the layout's logical-axis rules, and helpers to place arrays on the mesh."""

    mesh: Mesh
    layout: str
    plan: ShardingPlan
    parameter_fwdbwd_mapping: list[tuple[str, MeshAxes]] = field(default_factory=list)

    @property
    def data_size(self) -> int:
        """Number of data-parallel shards (size of the ``data`` mesh axis)."""
        return int(self.mesh.shape[MeshAxis.DATA])

    @property
    def model_size(self) -> int:
        return int(self.mesh.shape[MeshAxis.MODEL])

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """The abstract mesh and logical-axis rules under which model code runs."""
        with (
            jax.sharding.use_abstract_mesh(self.mesh.abstract_mesh),
            nn.logical_axis_rules(self.parameter_fwdbwd_mapping),
        ):
            yield

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    def batch_sharding(self, ndim: int, leading: int = 0) -> NamedSharding:
        """Rows sharded over ``data``; ``leading`` unsharded axes come first (e.g. micro-steps)."""
        spec = (None,) * leading + (MeshAxis.DATA,) + (None,) * (ndim - leading - 1)
        return NamedSharding(self.mesh, PartitionSpec(*spec))

    def put_batch(self, batch: Mapping[str, Any], leading: int = 0) -> dict[str, jax.Array]:
        """Place host arrays on the mesh, rows sharded over the data axis."""
        placed = {}
        processes = jax.process_count()
        for name, value in batch.items():
            array = np.asarray(value)
            sharding = self.batch_sharding(array.ndim, leading)
            if processes == 1:
                placed[name] = jax.device_put(array, sharding)
            else:  # each process holds its own rows of the global batch
                shape = list(array.shape)
                shape[leading] *= processes
                placed[name] = jax.make_array_from_process_local_data(sharding, array, tuple(shape))
        return placed

    def logical_shardings(self, logical_specs: Any) -> Any:
        """Turn a tree of logical ``PartitionSpec`` (from ``nn.get_partition_spec``) into shardings."""
        shardings = nn.logical_to_mesh_sharding(logical_specs, self.mesh, self.parameter_fwdbwd_mapping)
        return jax.tree.map(_canonical, shardings, is_leaf=lambda x: isinstance(x, NamedSharding))


def _canonical(sharding: Any) -> Any:
    """Drop trailing unsharded dimensions (``P('data', None)`` -> ``P('data')``), the form jit returns."""
    if not isinstance(sharding, NamedSharding):
        return sharding
    spec = list(sharding.spec)
    while spec and spec[-1] is None:
        spec.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*spec), memory_kind=sharding.memory_kind)


def resolve_mesh_shape(data: int, model: int, device_count: int) -> tuple[int, int]:
    """Sizes of the ``data`` and ``model`` axes; one of them may be -1 (= fill)."""
    if data == -1 and model == -1:
        raise ConfigError("mesh/data and mesh/model cannot both be -1; set one of them to a size")
    for key, size in (("mesh/data", data), ("mesh/model", model)):
        if size == 0 or size < -1:
            raise ConfigError(f"{key} must be a positive size or -1 (fill), got {size}")
    if data == -1 or model == -1:
        known = model if data == -1 else data
        if device_count % known:
            raise ConfigError(
                f"{device_count} devices cannot be split into mesh axes with size {known}; "
                f"choose mesh/data x mesh/model = {device_count}"
            )
        fill = device_count // known
        data, model = (fill, model) if data == -1 else (data, fill)
    if data * model != device_count:
        raise ConfigError(
            f"mesh/data x mesh/model = {data}x{model} = {data * model} does not match the {device_count} "
            f"available devices; use -1 for one axis to fill the rest"
        )
    return data, model


def _check_model_axis(layout: str, model: int) -> None:
    if model > 1 and MeshAxis.MODEL not in LAYOUTS[layout]:
        raise ConfigError(
            f"mesh/model={model} but layout {layout!r} does not shard over the model axis; "
            "use mesh/layout=tp or fsdp+tp, or set mesh/model=1"
        )


def build_sharding(
    plan: ShardingPlan,
    *,
    layout: str = "dp",
    data: int = -1,
    model: int = 1,
    devices: Sequence[Any] | None = None,
) -> TrainerSharding:
    """The mesh and rules for ``layout`` over ``devices`` (all devices by default)."""
    if layout not in LAYOUTS:
        raise ConfigError(f"mesh/layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    devices = list(devices) if devices is not None else jax.devices()
    _check_model_axis(layout, model)
    data, model = resolve_mesh_shape(data, model, len(devices))
    _check_model_axis(layout, model)
    restricted = plan.restricted(LAYOUTS[layout])
    rules: list[tuple[str, MeshAxes]] = []
    if Axis.BATCH not in restricted:
        rules.append((Axis.BATCH, MeshAxis.DATA))
    rules.extend(restricted.rules())
    mesh = jax.make_mesh(
        (data, model),
        (MeshAxis.DATA, MeshAxis.MODEL),
        axis_types=(AxisType.Auto, AxisType.Auto),
        devices=devices,
    )
    return TrainerSharding(mesh=mesh, layout=layout, plan=restricted, parameter_fwdbwd_mapping=rules)
