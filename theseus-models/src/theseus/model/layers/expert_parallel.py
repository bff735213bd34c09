"""Expert parallelism: a mixture layer's experts split over the ``expert`` mesh axis.

With a mesh that has an ``expert`` axis of size ``ep`` (a layout with ``ep``), the stacked experts
``[E, ...]`` are sharded over it (``E / ep`` per device) and so are the token rows: the batch is split
over ``expert`` x ``data``, so the expert axis also carries data parallelism. Routing, the auxiliary
losses and the capacity slots are computed on the global arrays as on one device; only the expert
computation runs under ``shard_map``: over the token-splitting axes (``expert`` and ``data``) for the
dropless paths, over ``expert`` for the capacity path (``data`` and ``model`` stay automatic there).

* Dropless (:func:`parallel_dropless_experts`): each device sorts its token copies by destination
  device into fixed send buffers of ``n * min(k, E / ep)`` rows per destination (the most one device
  can send another, so nothing is ever dropped), exchanges them with one ``all_to_all``, runs the
  received rows through its local experts (:func:`~theseus.model.layers.experts.grouped_ffn`, padding
  rows skipped) and returns the results with a second ``all_to_all``. Static shapes cost buffer room:
  ``ep * min(k, E / ep) / k`` times the copies a device holds.
* Data parallelism alone (:func:`local_dropless_experts`): each device dispatches its own token rows
  through every expert, whose weights are gathered once per layer.
* Under tensor parallelism both dropless paths run each device's share of the experts' hidden width
  and sum the outputs over ``model`` once per layer (:func:`hidden_axis`).
* Capacity (:func:`parallel_capacity_experts`): the per-expert buffers of the one-device path, filled
  with each device's kept copies, summed onto the experts' owners by a reduce-scatter and sent back by
  an all-gather; the same copies are kept and dropped as on one device.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from theseus.base.axis import Axis, MeshAxis
from theseus.model.layers.experts import (
    Activation,
    Kernels,
    Routing,
    buffer_ffn,
    capacity_buffer,
    capacity_slots,
    combine_slots,
    dropless_experts,
    grouped_ffn,
)

EXPERTS = PartitionSpec(MeshAxis.EXPERT)


def expert_axis_size() -> int:
    """Size of the ``expert`` axis of the mesh the model runs under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MeshAxis.EXPERT not in mesh.axis_names:
        return 1
    return int(dict(mesh.shape)[MeshAxis.EXPERT])


def hidden_axis() -> str | None:
    """``model`` when the current rules split the experts' hidden width (``mlp``) over a model axis of
    more than one device (tensor parallelism), else None."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MeshAxis.MODEL not in mesh.axis_names or dict(mesh.shape)[MeshAxis.MODEL] == 1:
        return None
    mapped = nn.logical_to_mesh_axes((Axis.MLP,))
    return MeshAxis.MODEL if mapped is not None and tuple(mapped) == (MeshAxis.MODEL,) else None


def _kernel_specs(arrays: tuple[jax.Array, ...], experts: str | None, hidden: str | None) -> tuple[PartitionSpec, ...]:
    """In-specs of the stacked kernels: ``[E, D, F]`` projections in, ``[E, F, D]`` out (the last one),
    split over ``experts`` and, with tensor parallelism, their hidden width ``F`` over ``hidden``."""
    into = PartitionSpec(experts, None, hidden)
    return (*(into for _ in arrays[:-1]), PartitionSpec(experts, hidden, None))


def _varying(x: jax.Array, *axes: str | None) -> jax.Array:
    """``x`` marked as differing over ``axes`` before the per-block loop. An array the same on every device
    of an axis that meets one that differs inside the loop is otherwise cast there, once per block, and
    its gradient summed over the axis once per block too; cast here, the sum happens once per layer."""
    named = tuple(axis for axis in axes if axis is not None)
    return jax.lax.pcast(x, named, to="varying") if named else x


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
        x = _varying(x, hidden)
        local_kernels = tuple(_varying(kernel, *data_axes) for kernel in local_kernels)
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
        combined = jnp.einsum("nkd,nk->nd", rows, weights.astype(rows.dtype))
        return combined if hidden is None else jax.lax.psum(combined, hidden)

    rows, hidden = token_rows(), hidden_axis()
    data_axes = tuple(axis for axis in batch_axes() if axis != MeshAxis.EXPERT)
    run = jax.shard_map(
        local,
        in_specs=(rows, rows, rows, *_kernel_specs(arrays, MeshAxis.EXPERT, hidden)),
        out_specs=rows,
        axis_names=set(batch_axes()) | ({hidden} if hidden else set()),
    )
    return run(tokens, routing.experts, routing.weights, *arrays)


def batch_axes() -> tuple[str, ...]:
    """The axes of the current mesh that split token rows, major first: ``expert``, then ``data``, then
    ``context`` (a row's sequence split over it: flattened ``[B, T]`` rows are split over all three)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    return tuple(name for name in (MeshAxis.EXPERT, MeshAxis.DATA, MeshAxis.CONTEXT) if name in mesh.axis_names)


def token_rows() -> PartitionSpec:
    """Token rows split over every batch axis of the current mesh (expert-major, as the batch is)."""
    return PartitionSpec(batch_axes())


def data_parallel_size() -> int:
    """Devices the current mesh splits token rows over (its batch axes multiplied; 1 without a mesh)."""
    mesh = jax.sharding.get_abstract_mesh()
    sizes = dict(mesh.shape) if not mesh.empty else {}
    size = 1
    for name in batch_axes():
        size *= int(sizes[name])
    return size


def local_dropless_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, blocked: bool = False
) -> jax.Array:
    """:func:`~theseus.model.layers.experts.dropless_experts` on each device's own token rows, with every
    expert's weights gathered once per layer (FSDP's gather at use; their gradients are reduce-scattered).

    Under data parallelism the dispatch must not see the global rows: sorting them all makes every
    device run every token copy with the weights split, and the blocked matmuls then need one
    all-reduce per block (2,563 per step for a Qwen3-30B-A3B-shaped layer pair on 8 GPUs). With tensor
    parallelism each device runs its share of the hidden width and the outputs are summed once. ``[N, D]``."""
    arrays, gated = _split(kernels)

    def local(x: jax.Array, experts: jax.Array, weights: jax.Array, *own: jax.Array) -> jax.Array:
        x = _varying(x, hidden)
        own = tuple(_varying(kernel, *batch_axes()) for kernel in own)
        out = dropless_experts(x, Routing(weights, experts, weights), _join(own, gated), act, blocked)
        return out if hidden is None else jax.lax.psum(out, hidden)  # once per layer, not once per block

    rows, hidden = token_rows(), hidden_axis()
    run = jax.shard_map(
        local,
        in_specs=(rows, rows, rows, *_kernel_specs(arrays, None, hidden)),
        out_specs=rows,
        axis_names=set(batch_axes()) | ({hidden} if hidden else set()),
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


__all__ = [
    "data_parallel_size",
    "expert_axis_size",
    "hidden_axis",
    "local_dropless_experts",
    "parallel_capacity_experts",
    "parallel_dropless_experts",
]
