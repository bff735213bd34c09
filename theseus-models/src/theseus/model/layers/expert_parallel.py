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

import functools
import math

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
    expert_counts,
    gather_rows,
    grouped_ffn,
    permute_rows,
    place,
    sources,
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


def width_axes(kernels: Kernels, exclude: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The mesh axes the current rules split the experts' model width (``embed``) over (FSDP), where
    the expert ``shard_map`` can take the weights so split and gather them itself: every such axis
    splits token rows (and is not in ``exclude``), and together they divide the width. Else ``()``:
    the weights enter whole width (:func:`~theseus.model.layers.moe.whole_width`)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return ()
    mapped = nn.logical_to_mesh_axes((Axis.EMBED,))
    entry = None if mapped is None else next(iter(mapped), None)
    axes = () if entry is None else ((entry,) if isinstance(entry, str) else tuple(entry))
    sizes = dict(mesh.shape)
    split = math.prod(int(sizes[axis]) for axis in axes)
    if not axes or split == 1 or not set(axes) <= set(batch_axes()) - set(exclude):
        return ()
    return axes if kernels[1].shape[1] % split == 0 else ()


def _kernel_specs(
    arrays: tuple[jax.Array, ...], experts: str | None, hidden: str | None, width: tuple[str, ...] = ()
) -> tuple[PartitionSpec, ...]:
    """In-specs of the stacked kernels: ``[E, D, F]`` projections in, ``[E, F, D]`` out (the last one),
    split over ``experts``, with tensor parallelism their hidden width ``F`` over ``hidden``, and with
    ``width`` their model width ``D`` over those axes (gathered inside: :func:`_gather_width`)."""
    model = width or None
    into = PartitionSpec(experts, model, hidden)
    return (*(into for _ in arrays[:-1]), PartitionSpec(experts, hidden, model))


def _gather_width(arrays: tuple[jax.Array, ...], width: tuple[str, ...]) -> tuple[jax.Array, ...]:
    """The kernels' model width gathered over ``width`` inside the ``shard_map`` (FSDP's gather before
    use, in the activations' dtype; the last kernel ``[E, F, D]``, the others ``[E, D, F]``). A gather
    whose backward pass is the reduce-scatter of the gradient and keeps nothing: the backward pass
    gathers the weights again rather than holding a whole layer's experts until it runs."""
    if not width:
        return arrays
    dims = (*(1 for _ in arrays[:-1]), 2)
    return tuple(_gathered(kernel, width, dim) for kernel, dim in zip(arrays, dims, strict=True))


@functools.partial(jax.custom_vjp, nondiff_argnums=(1, 2))
def _gathered(kernel: jax.Array, width: tuple[str, ...], dim: int) -> jax.Array:
    return jax.lax.all_gather(kernel, width, axis=dim, tiled=True)


def _gathered_forward(kernel: jax.Array, width: tuple[str, ...], dim: int) -> tuple[jax.Array, None]:
    return _gathered(kernel, width, dim), None


def _gathered_backward(width: tuple[str, ...], dim: int, _: None, g: jax.Array) -> tuple[jax.Array]:
    # the barrier keeps XLA from pipelining the reduce-scatter into the next layer of a scanned stack,
    # which would hold this layer's whole-width gradients (3 x 0.94 GB for Mixtral-8x7B) across it
    return (jax.lax.optimization_barrier(jax.lax.psum_scatter(g, width, scatter_dimension=dim, tiled=True)),)


_gathered.defvjp(_gathered_forward, _gathered_backward)


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
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, ep: int, path: str = "ragged_dot"
) -> jax.Array:
    """:func:`~theseus.model.layers.experts.dropless_experts` with the experts and token rows split over
    the ``expert`` axis (size ``ep``) and two ``all_to_all`` exchanges. ``[N, D]``."""
    arrays, gated = _split(kernels)

    def local(x: jax.Array, experts: jax.Array, weights: jax.Array, *local_kernels: jax.Array) -> jax.Array:
        x = _varying(x, hidden)
        local_kernels = _gather_width(local_kernels, width)
        local_kernels = tuple(_varying(kernel, *(a for a in data_axes if a not in width)) for kernel in local_kernels)
        n, k = experts.shape
        own = _join(local_kernels, gated)
        e_local = own[1].shape[0]
        width_rows = n * min(k, e_local)  # copies one device can send another
        flat = experts.reshape(-1)
        destination = flat // e_local
        placed = place(flat, e_local * ep)  # by expert, hence by destination
        sizes = expert_counts(destination, ep)
        sorted_destination = destination[placed.order]
        starts = jnp.cumsum(sizes) - sizes
        sorted_slot = sorted_destination * width_rows + jnp.arange(n * k) - starts[sorted_destination]
        slot = sorted_slot[placed.slot]
        source = sources(slot, ep * width_rows)
        send = gather_rows(x, source, slot, k)
        send_groups = jnp.take(flat % e_local, source, mode="fill", fill_value=e_local)
        received = jax.lax.all_to_all(send, MeshAxis.EXPERT, 0, 0, tiled=True)
        received_groups = jax.lax.all_to_all(send_groups, MeshAxis.EXPERT, 0, 0, tiled=True)
        out = grouped_ffn(received, received_groups, own, act, path, skip_empty=True)
        back = jax.lax.all_to_all(out, MeshAxis.EXPERT, 0, 0, tiled=True)
        rows = permute_rows(back, slot, source).reshape(n, k, -1)
        combined = jnp.einsum("nkd,nk->nd", rows, weights.astype(rows.dtype))
        return combined if hidden is None else jax.lax.psum(combined, hidden)

    rows, hidden = token_rows(), hidden_axis()
    data_axes = tuple(axis for axis in batch_axes() if axis != MeshAxis.EXPERT)
    width = width_axes(kernels, exclude=(MeshAxis.EXPERT,))
    run = jax.shard_map(
        local,
        in_specs=(rows, rows, rows, *_kernel_specs(arrays, MeshAxis.EXPERT, hidden, width)),
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
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, path: str = "ragged_dot"
) -> jax.Array:
    """:func:`~theseus.model.layers.experts.dropless_experts` on each device's own token rows, with every
    expert's weights gathered once per layer (FSDP's gather at use, inside where :func:`width_axes` allows:
    again in the backward pass; their gradients are reduce-scattered).

    Under data parallelism the dispatch must not see the global rows: sorting them all makes every
    device run every token copy with the weights split, and the blocked matmuls then need one
    all-reduce per block (2,563 per step for a Qwen3-30B-A3B-shaped layer pair on 8 GPUs). With tensor
    parallelism each device runs its share of the hidden width and the outputs are summed once. ``[N, D]``."""
    arrays, gated = _split(kernels)

    def local(x: jax.Array, experts: jax.Array, weights: jax.Array, *own: jax.Array) -> jax.Array:
        x = _varying(x, hidden)
        own = _gather_width(own, width)
        own = tuple(_varying(kernel, *(a for a in batch_axes() if a not in width)) for kernel in own)
        out = dropless_experts(x, Routing(weights, experts, weights), _join(own, gated), act, path)
        return out if hidden is None else jax.lax.psum(out, hidden)  # once per layer, not once per block

    rows, hidden, width = token_rows(), hidden_axis(), width_axes(kernels)
    run = jax.shard_map(
        local,
        in_specs=(rows, rows, rows, *_kernel_specs(arrays, None, hidden, width)),
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
    "width_axes",
]
