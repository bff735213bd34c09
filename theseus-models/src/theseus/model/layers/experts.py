"""The experts of a mixture layer as pure functions of arrays: routed token copies through stacked
gated feed-forward experts (``gate`` / ``up`` ``[E, D, F]``, ``down`` ``[E, F, D]``).

:func:`grouped_ffn` is the core every dropless path shares: rows tagged with an expert (or padding),
sorted by expert and run as grouped matmuls (``jax.lax.ragged_dot``) or, on CPU, one matmul per block
of one expert's rows (XLA's CPU ``ragged_dot`` computes every group over all rows). The blocked
path's backward pass slices each block's weights again rather than keeping the slices
(:func:`recomputed`). On top of it:
:func:`dropless_experts` (every copy kept), :func:`capacity_experts` (per-expert buffers, overflow
dropped), and the references :func:`loop_over_experts` and :func:`dense_experts` that the tests and
``benchmarks/moe_layer.py`` compare against. :mod:`theseus.model.layers.expert_parallel` runs the same
functions with the experts split over devices.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from theseus.base.accelerator import accelerator
from theseus.model.layers.matmul import project

Kernels = tuple[jax.Array | None, jax.Array, jax.Array]  # gate (None: not gated), up, down
Activation = Callable[[jax.Array], jax.Array]


class Routing(NamedTuple):
    """A router's choice for ``N`` tokens: ``weights`` float32 ``[N, k]``, ``experts`` int32 ``[N, k]``
    and the per-expert probabilities ``probs`` ``[N, E]`` the load-balancing loss uses."""

    weights: jax.Array
    experts: jax.Array
    probs: jax.Array


class GatedActivation:
    """An expert activation of both hidden projections: :meth:`combine` replaces ``act(gate) * up``
    (GPT-OSS's clamped SwiGLU). Pass an instance where an :data:`Activation` is taken."""

    def combine(self, h_gate: jax.Array, h_up: jax.Array) -> jax.Array:
        raise NotImplementedError

    def __call__(self, x: jax.Array) -> jax.Array:
        raise TypeError(f"{type(self).__name__} needs both the gate and the up projection (a gated expert)")


def ffn(h_gate: jax.Array | None, h_up: jax.Array, act: Activation) -> jax.Array:
    """The expert's hidden activation: ``act(gate) * up`` (a :class:`GatedActivation`'s ``combine``),
    or ``act(up)`` without a gate."""
    if h_gate is None:
        return act(h_up)
    if isinstance(act, GatedActivation):
        return act.combine(h_gate, h_up)
    return act(h_gate) * h_up


def buffer_ffn(buffer: jax.Array, kernels: Kernels, act: Activation) -> jax.Array:
    """Per-expert buffers ``[E, C, D]`` through their experts, one batched matmul each: ``[E, C, D]``."""
    gate, up, down = kernels
    dtype = buffer.dtype
    h_gate = None if gate is None else project("ecd,edf->ecf", buffer, gate, dtype)
    hidden = ffn(h_gate, project("ecd,edf->ecf", buffer, up, dtype), act)
    return project("ecf,efd->ecd", hidden, down, dtype)


#: On GPUs the blocks' padding is bounded by this share of the copies (the compiled FLOPs of a
#: Mixtral-shaped layer pair fall from 1.37x to 1.2x the model's); CPUs keep fewer, larger blocks,
#: which run faster there even with more padding.
GPU_PADDING_SHARE = 0.25


def block_rows(copies: int, n_experts: int, padding_share: float | None = None) -> int:
    """Rows per block of the blocked path: a power of two near the mean copies per expert, 8 to 128.
    With ``padding_share``, no larger than keeps the worst-case padding (one partly filled block per
    expert) within that share of the copies."""
    mean = max(1, copies // n_experts)
    size = int(min(128, max(8, 1 << (mean - 1).bit_length())))
    if padding_share is not None:
        while size > 8 and n_experts * size > padding_share * copies:
            size //= 2
    return size


def _inverse(order: jax.Array) -> jax.Array:
    return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))


@jax.custom_vjp
def permute_rows(x: jax.Array, to: jax.Array, back: jax.Array) -> jax.Array:
    """Rows ``x[to]`` (``to == len(x)``: a zero row), where ``back`` is the inverse placement: row ``i``
    of ``x`` lands at ``back[i]`` alone (``len(to)``: nowhere). Both directions are gathers: the
    backward pass reads the cotangent at ``back`` instead of scatter-adding it (slow on CPU)."""
    return jnp.concatenate([x, jnp.zeros((1, x.shape[-1]), x.dtype)])[to]


def _permute_forward(x: jax.Array, to: jax.Array, back: jax.Array) -> tuple[jax.Array, jax.Array]:
    return permute_rows(x, to, back), back


def _permute_backward(back: jax.Array, g: jax.Array) -> tuple[jax.Array, None, None]:
    return jnp.concatenate([g, jnp.zeros((1, g.shape[-1]), g.dtype)])[back], None, None


permute_rows.defvjp(_permute_forward, _permute_backward)


#: What the backward pass of an expert computation keeps from its forward pass (:func:`recomputed`): the
#: products (matmuls, grouped matmuls) and what the devices exchanged. The rest is redone: the cheap
#: elementwise and row-placement steps between the products, and the experts' weights as the products
#: read them (gathered to whole width, cast per device, sliced per block, FP8-quantized). Kept, the
#: weights sliced per block grew a scanned model by 28 GB a layer (Mixtral-8x7B, 8 x 4,096 tokens on 8
#: H100s under FSDP; a dense Llama layer of its width keeps 1.4 GB).
KEPT = frozenset(
    {"dot_general", "ragged_dot_general", "all_to_all", "ragged_all_to_all", "all_gather", "reduce_scatter", "psum"}
)


def keep_products(primitive: Any, *_: Any, **__: Any) -> bool:
    """Checkpoint policy of the expert computations: save the results of :data:`KEPT` only."""
    return primitive.name in KEPT


def recomputed(fn: Callable[..., Any], prevent_cse: bool = True) -> Callable[..., Any]:
    """``fn`` whose backward pass keeps only its products and exchanges (:data:`KEPT`); the same
    policy on a loop's body (``prevent_cse=False``) redoes its weights' reads in each backward iteration
    instead of stacking them over the iterations."""
    return jax.checkpoint(fn, policy=keep_products, prevent_cse=prevent_cse)


def _ragged_rows(rows: jax.Array, sizes: jax.Array, kernels: Kernels, act: Activation) -> jax.Array:
    """Rows sorted by expert (``sizes`` per expert; rows past their sum are padding) as grouped matmuls."""
    gate, up, down = kernels
    h_gate = None if gate is None else jax.lax.ragged_dot(rows, gate, sizes)
    hidden = ffn(h_gate, jax.lax.ragged_dot(rows, up, sizes), act)
    return jax.lax.ragged_dot(hidden, down, sizes)


def _blocked_rows(
    rows: jax.Array,
    groups: jax.Array,
    order: jax.Array,
    sizes: jax.Array,
    kernels: Kernels,
    act: Activation,
    skip_empty: bool,
) -> jax.Array:
    """Rows (in their own order; ``order`` sorts them by expert ``groups``, padding marked ``>= E``)
    placed in whole blocks of :func:`block_rows` per expert, each block one matmul with its expert's
    weights. Each row is placed straight at its block slot and read back from it, both as row
    permutations (:func:`permute_rows`: gathers both ways). With ``skip_empty``, blocks holding no row
    are skipped by a ``lax.cond`` (worth it where most rows are padding, as in the expert-parallel
    receive buffers; otherwise the conditional costs more in the backward pass than the few empty
    blocks: 2.4x the step at E=64, k=8)."""
    gate, up, down = kernels
    n_experts, m = up.shape[0], rows.shape[0]
    size = block_rows(m, n_experts, GPU_PADDING_SHARE if accelerator().platform == "gpu" else None)
    n_blocks = -(-m // size) + n_experts  # enough for any split of the rows
    padded = -(-sizes // size) * size
    padded_ends = jnp.cumsum(padded)
    sorted_groups = groups[order]
    expert = jnp.minimum(sorted_groups, n_experts - 1)
    rank = jnp.arange(m) - (jnp.cumsum(sizes) - sizes)[expert]
    trash = n_blocks * size
    slot_sorted = jnp.where(sorted_groups < n_experts, (padded_ends - padded)[expert] + rank, trash)
    slot = slot_sorted[_inverse(order)]  # each row's slot, in the rows' own order
    source = jnp.full((trash + 1,), m, jnp.int32).at[slot].set(jnp.arange(m, dtype=jnp.int32))[:trash]
    buffer = permute_rows(rows, source, slot)
    starts = jnp.arange(n_blocks) * size
    # the expert whose padded rows hold each block (a comparison count: searchsorted fails inside shard_map)
    owner = jnp.minimum(jnp.sum(padded_ends[None, :] <= starts[:, None], axis=1), n_experts - 1)

    def block(args: tuple[jax.Array, jax.Array, jax.Array]) -> jax.Array:
        x, e, used = args

        def compute(x: jax.Array) -> jax.Array:
            dtype = x.dtype
            h_gate = None if gate is None else project("md,df->mf", x, gate[e], dtype)
            hidden = ffn(h_gate, project("md,df->mf", x, up[e], dtype), act)
            return project("mf,fd->md", hidden, down[e], dtype)

        checkpointed = recomputed(compute, prevent_cse=False)  # one block's weights are sliced again
        return jax.lax.cond(used, checkpointed, jnp.zeros_like, x) if skip_empty else checkpointed(x)

    used = starts < padded_ends[-1]
    out = jax.lax.map(block, (buffer.reshape(n_blocks, size, -1), owner, used)).reshape(trash, -1)
    return permute_rows(out, slot, source)


def grouped_ffn(
    rows: jax.Array, groups: jax.Array, kernels: Kernels, act: Activation, blocked: bool, skip_empty: bool = False
) -> jax.Array:
    """Each row of ``rows`` ``[M, D]`` through expert ``groups[m]`` (``[M]`` int32; ``>= E`` marks
    padding, whose output row is zero): ``[M, D]``. The rows are sorted by expert and run as grouped
    matmuls, or with ``blocked`` as one matmul per block of one expert's rows (``skip_empty``: blocks
    of padding only are skipped)."""
    n_experts = kernels[1].shape[0]
    order = jnp.argsort(groups, stable=True)
    sizes = jnp.bincount(groups, length=n_experts).astype(jnp.int32)  # padding (>= E) is not counted
    if blocked:
        return _blocked_rows(rows, groups, order, sizes, kernels, act, skip_empty)
    return _ragged_rows(rows[order], sizes, kernels, act)[_inverse(order)]


def dropless_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, blocked: bool = False
) -> jax.Array:
    """Every token copy through its expert (:func:`grouped_ffn`), summed with the routing weights. ``[N, D]``."""
    n, k = routing.experts.shape
    copies = jnp.repeat(tokens, k, axis=0)
    out = grouped_ffn(copies, routing.experts.reshape(-1), kernels, act, blocked).reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", out, routing.weights.astype(out.dtype))


def blocked_experts(tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation) -> jax.Array:
    """:func:`dropless_experts` on the blocked path (the CPU one)."""
    return dropless_experts(tokens, routing, kernels, act, blocked=True)


def capacity_slots(experts: jax.Array, n_experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """For ``experts`` ``[N, k]``: each copy's position in its expert's buffer and whether it fits
    (``< capacity``), both ``[N, k]``. First choices of all tokens come before second choices; within
    a choice rank, earlier tokens first."""
    n, k = experts.shape
    flat = experts.T.reshape(-1)  # rank-major priority
    order = jnp.argsort(flat, stable=True)
    sizes = jnp.bincount(flat, length=n_experts)
    starts = jnp.cumsum(sizes) - sizes
    position_sorted = jnp.arange(flat.shape[0]) - starts[flat[order]]
    position = jnp.zeros_like(position_sorted).at[order].set(position_sorted)
    position = position.reshape(k, n).T
    return position, position < capacity


def capacity_buffer(
    tokens: jax.Array, experts: jax.Array, position: jax.Array, kept: jax.Array, n_experts: int, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """The kept copies of ``tokens`` in per-expert buffers ``[E * capacity, D]`` (zeros elsewhere), and
    each copy's slot ``[N * k]`` (``E * capacity`` for a dropped one)."""
    k = experts.shape[1]
    trash = n_experts * capacity
    slot = jnp.where(kept, experts * capacity + position, trash).reshape(-1)
    copies = jnp.repeat(tokens, k, axis=0)
    buffer = jnp.zeros((trash + 1, tokens.shape[-1]), tokens.dtype).at[slot].set(copies)
    return buffer[:trash], slot


def combine_slots(out: jax.Array, slot: jax.Array, weights: jax.Array, kept: jax.Array) -> jax.Array:
    """Each token's kept copies read from the expert outputs ``out`` ``[E * capacity, D]`` at ``slot``
    and summed with the routing ``weights`` (dropped copies count zero): ``[N, D]``."""
    n, k = weights.shape
    rows = jnp.concatenate([out, jnp.zeros((1, out.shape[-1]), out.dtype)])[slot].reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", rows, jnp.where(kept, weights, 0.0).astype(rows.dtype))


def capacity_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """Token copies placed in per-expert buffers ``[E, capacity, D]`` (overflow dropped), each expert
    one batched matmul; returns the output ``[N, D]`` and which copies were kept ``[N, k]``."""
    n_experts = kernels[1].shape[0]
    position, kept = capacity_slots(routing.experts, n_experts, capacity)
    buffer, slot = capacity_buffer(tokens, routing.experts, position, kept, n_experts, capacity)
    out = buffer_ffn(buffer.reshape(n_experts, capacity, -1), kernels, act).reshape(n_experts * capacity, -1)
    return combine_slots(out, slot, routing.weights, kept), kept


def loop_over_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, kept: jax.Array | None = None
) -> jax.Array:
    """Reference: each expert applied to every token in a Python loop, weighted by the tokens that chose
    it (and were ``kept``). ``[N, D]``."""
    gate, up, down = kernels
    combine = routing.weights if kept is None else jnp.where(kept, routing.weights, 0.0)
    out = jnp.zeros(tokens.shape, jnp.result_type(tokens, up))
    for e in range(up.shape[0]):
        share = jnp.sum(jnp.where(routing.experts == e, combine, 0.0), axis=-1)
        h = ffn(None if gate is None else tokens @ gate[e], tokens @ up[e], act)
        out = out + share[:, None].astype(out.dtype) * (h @ down[e])
    return out


def dense_experts(tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation) -> jax.Array:
    """Every expert on every token in one einsum, combined with a one-hot weight matrix ``[N, E]``
    (``n_experts / top_k`` times the work of the routed layer; a baseline)."""
    gate, up, down = kernels
    combine = jnp.sum(jax.nn.one_hot(routing.experts, up.shape[0]) * routing.weights[..., None], axis=1)
    dtype = tokens.dtype
    h_gate = None if gate is None else project("nd,edf->enf", tokens, gate, dtype)
    hidden = ffn(h_gate, project("nd,edf->enf", tokens, up, dtype), act)
    out = project("enf,efd->end", hidden, down, dtype)
    return jnp.einsum("end,ne->nd", out, combine.astype(out.dtype))


__all__ = [
    "GatedActivation",
    "Kernels",
    "Routing",
    "block_rows",
    "blocked_experts",
    "buffer_ffn",
    "capacity_buffer",
    "capacity_experts",
    "capacity_slots",
    "combine_slots",
    "dense_experts",
    "dropless_experts",
    "ffn",
    "grouped_ffn",
    "keep_products",
    "loop_over_experts",
    "permute_rows",
    "recomputed",
]
