"""Expert parallelism: a mixture layer's experts split over the ``expert`` mesh axis.

With a mesh that has an ``expert`` axis of size ``ep`` (a layout with ``ep``), the stacked experts
``[E, ...]`` are sharded over it (``E / ep`` per device) and so are the token rows: the batch is split
over ``expert`` x ``data``, so the expert axis also carries data parallelism. Routing, the auxiliary
losses and the capacity slots are computed on the global arrays as on one device; only the expert
computation runs under ``shard_map`` over the ``expert`` axis (``data`` and ``model`` stay automatic,
so FSDP and TP shardings of the expert weights compose).

* Dropless (:func:`parallel_dropless_experts`): each device sorts its token copies by destination
  device into fixed send buffers of ``n * min(k, E / ep)`` rows per destination (the most one device
  can send another, so nothing is ever dropped), exchanges them with one ``all_to_all``, runs the
  received rows through its local experts (:func:`~theseus.model.layers.experts.grouped_ffn`, padding
  rows skipped) and returns the results with a second ``all_to_all``. Static shapes cost buffer room:
  ``ep * min(k, E / ep) / k`` times the copies a device holds.
* Capacity (:func:`parallel_capacity_experts`): the per-expert buffers of the one-device path, filled
  with each device's kept copies, summed onto the experts' owners by a reduce-scatter and sent back by
  an all-gather; the same copies are kept and dropped as on one device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from theseus.base.axis import MeshAxis
from theseus.model.layers.experts import (
    Activation,
    Kernels,
    Routing,
    buffer_ffn,
    capacity_buffer,
    capacity_slots,
    combine_slots,
    grouped_ffn,
)

EXPERTS = PartitionSpec(MeshAxis.EXPERT)


def expert_axis_size() -> int:
    """Size of the ``expert`` axis of the mesh the model runs under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MeshAxis.EXPERT not in mesh.axis_names:
        return 1
    return int(dict(mesh.shape)[MeshAxis.EXPERT])


def _split(kernels: Kernels) -> tuple[tuple[jax.Array, ...], bool]:
    gate, up, down = kernels
    return ((up, down) if gate is None else (gate, up, down)), gate is not None


def _join(arrays: tuple[jax.Array, ...], gated: bool) -> Kernels:
    return (arrays[0], arrays[1], arrays[2]) if gated else (None, arrays[0], arrays[1])


def parallel_dropless_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, ep: int, blocked: bool = False
) -> jax.Array:
    """:func:`~theseus.model.layers.experts.dropless_experts` with the experts and token rows split over
    the ``expert`` axis (size ``ep``) and two ``all_to_all`` exchanges. ``[N, D]``."""
    arrays, gated = _split(kernels)

    def local(x: jax.Array, experts: jax.Array, weights: jax.Array, *local_kernels: jax.Array) -> jax.Array:
        n, k = experts.shape
        own = _join(local_kernels, gated)
        e_local = own[1].shape[0]
        width = n * min(k, e_local)  # copies one device can send another
        flat = experts.reshape(-1)
        destination = flat // e_local
        order = jnp.argsort(flat, stable=True)  # by expert, hence by destination
        sizes = jnp.bincount(destination, length=ep)
        sorted_destination = destination[order]
        sorted_slot = sorted_destination * width + jnp.arange(n * k) - (jnp.cumsum(sizes) - sizes)[sorted_destination]
        slot = jnp.zeros_like(sorted_slot).at[order].set(sorted_slot)
        send = jnp.zeros((ep * width, x.shape[-1]), x.dtype).at[slot].set(jnp.repeat(x, k, axis=0))
        send_groups = jnp.full((ep * width,), e_local, jnp.int32).at[slot].set(flat % e_local)
        received = jax.lax.all_to_all(send, MeshAxis.EXPERT, 0, 0, tiled=True)
        received_groups = jax.lax.all_to_all(send_groups, MeshAxis.EXPERT, 0, 0, tiled=True)
        out = grouped_ffn(received, received_groups, own, act, blocked, skip_empty=True)
        back = jax.lax.all_to_all(out, MeshAxis.EXPERT, 0, 0, tiled=True)
        rows = back[slot].reshape(n, k, -1)
        return jnp.einsum("nkd,nk->nd", rows, weights.astype(rows.dtype))

    run = jax.shard_map(
        local,
        in_specs=(EXPERTS, EXPERTS, EXPERTS, *(EXPERTS for _ in arrays)),
        out_specs=EXPERTS,
        axis_names={MeshAxis.EXPERT},
    )
    return run(tokens, routing.experts, routing.weights, *arrays)


def parallel_capacity_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, capacity: int, ep: int
) -> tuple[jax.Array, jax.Array]:
    """:func:`~theseus.model.layers.experts.capacity_experts` with the experts and token rows split over
    the ``expert`` axis (size ``ep``): the output ``[N, D]`` and which copies were kept ``[N, k]``."""
    arrays, gated = _split(kernels)
    n_experts = kernels[1].shape[0]
    position, kept = capacity_slots(routing.experts, n_experts, capacity)  # global priority, as on one device

    def local(
        x: jax.Array, experts: jax.Array, weights: jax.Array, where: jax.Array, fits: jax.Array, *own: jax.Array
    ) -> jax.Array:
        buffer, slot = capacity_buffer(x, experts, where, fits, n_experts, capacity)
        mine = jax.lax.psum_scatter(buffer.reshape(ep, -1, x.shape[-1]), MeshAxis.EXPERT, scatter_dimension=0)
        out = buffer_ffn(mine.reshape(n_experts // ep, capacity, -1), _join(own, gated), act)
        everyone = jax.lax.all_gather(out.reshape(-1, out.shape[-1]), MeshAxis.EXPERT, tiled=True)
        return combine_slots(everyone, slot, weights, fits)

    run = jax.shard_map(
        local,
        in_specs=(EXPERTS,) * (5 + len(arrays)),
        out_specs=EXPERTS,
        axis_names={MeshAxis.EXPERT},
    )
    return run(tokens, routing.experts, routing.weights, position, kept, *arrays), kept


__all__ = ["expert_axis_size", "parallel_capacity_experts", "parallel_dropless_experts"]
