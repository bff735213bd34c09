"""The experts of a mixture layer as pure functions of arrays: routed token copies through stacked
gated feed-forward experts (``gate`` / ``up`` ``[E, D, F]``, ``down`` ``[E, F, D]``).

:func:`grouped_ffn` is the core every dropless path shares: rows tagged with an expert (or padding),
sorted by expert and run as grouped matmuls (``jax.lax.ragged_dot``, or on TPU the megablox Pallas
kernels) or, on CPU and GPU, one matmul per block
of one expert's rows (XLA's CPU ``ragged_dot`` computes every group over all rows). The blocked
path's backward pass slices each block's weights again rather than keeping the slices
(:func:`recomputed`). On top of it:
:func:`dropless_experts` (every copy kept), :func:`capacity_experts` (per-expert buffers, overflow
dropped), and the references :func:`loop_over_experts` and :func:`dense_experts` that the tests and
``benchmarks/moe_layer.py`` compare against. :mod:`theseus.model.layers.expert_parallel` runs the same
functions with the experts split over devices.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

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


def sources(slot: jax.Array, length: int) -> jax.Array:
    """The inverse of a placement ``slot`` ``[M]`` (row -> slot, ``>= length``: none): for each of
    ``length`` slots the row placed there, ``M`` where none is (an integer scatter of unique slots)."""
    m = slot.shape[0]
    return (
        jnp.full((length + 1,), m, jnp.int32).at[jnp.minimum(slot, length)].set(jnp.arange(m, dtype=jnp.int32))[:length]
    )


def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    """Rows ``x[index]``, a zero row where ``index`` is out of range (no padded copy of ``x``)."""
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def gather_rows(x: jax.Array, to: jax.Array, back: jax.Array, copies: int = 1) -> jax.Array:
    """Rows of ``x`` ``[N, D]`` repeated ``copies`` times (copy ``c`` of row ``c // copies``), placed by
    ``to`` ``[M]``: row ``j`` is copy ``to[j]`` (out of range: a zero row). ``back`` ``[N * copies]`` is
    the inverse placement: copy ``c`` lands at ``back[c]`` alone (out of range: nowhere). Both directions
    are gathers: the backward pass reads the cotangent at ``back`` and sums each row's copies (a reshape),
    where a gather's own gradient scatter-adds (slow on every backend, serial on TPU)."""
    return _take(x, to // copies)


def _gather_forward(x: jax.Array, to: jax.Array, back: jax.Array, copies: int) -> tuple[jax.Array, jax.Array]:
    return gather_rows(x, to, back, copies), back


def _gather_backward(copies: int, back: jax.Array, g: jax.Array) -> tuple[jax.Array, None, None]:
    rows = _take(g, back)
    return rows.reshape(-1, copies, g.shape[-1]).sum(axis=1) if copies > 1 else rows, None, None


gather_rows.defvjp(_gather_forward, _gather_backward)


def permute_rows(x: jax.Array, to: jax.Array, back: jax.Array) -> jax.Array:
    """Rows ``x[to]`` (out of range: a zero row), ``back`` the inverse placement (:func:`gather_rows`
    of one copy): both directions gathers."""
    return gather_rows(x, to, back, 1)


#: Names of the integer placements the backward pass keeps rather than sorting again (:func:`recomputed`).
PLACEMENT = "expert_placement"

#: Name of the blocked experts' hidden projections, kept like a product (:func:`keep_products`): the
#: loop over the blocks is one custom-gradient call whose products the policy would not see otherwise.
PRODUCT = "expert_product"


class Placement(NamedTuple):
    """Rows sorted by expert: ``order`` ``[M]`` (sorted position -> row), ``slot`` ``[M]`` (its inverse:
    row -> sorted position) and the rows per expert ``sizes`` ``[E]`` (padding, ``>= E``, sorts last
    and is not counted)."""

    order: jax.Array
    slot: jax.Array
    sizes: jax.Array


def expert_counts(groups: jax.Array, n_experts: int) -> jax.Array:
    """Rows per expert of ``groups`` (any shape; values ``>= E`` not counted), int32 ``[E]``: a
    comparison sum, where ``bincount`` scatter-adds (serial on TPU)."""
    flat = groups.reshape(-1, 1)
    return jnp.sum(flat == jnp.arange(n_experts, dtype=flat.dtype), axis=0, dtype=jnp.int32)


def place(groups: jax.Array, n_experts: int) -> Placement:
    """Sort ``groups`` ``[M]`` once (a stable argsort) and invert the order once; the backward pass
    keeps the three integer arrays (:data:`PLACEMENT`) instead of sorting again."""
    order = jnp.argsort(groups, stable=True).astype(jnp.int32)
    placed = Placement(order, _inverse(order), expert_counts(groups, n_experts))
    return Placement(*(checkpoint_name(a, PLACEMENT) for a in placed))


#: What the backward pass of an expert computation keeps from its forward pass (:func:`recomputed`): the
#: products (matmuls, grouped matmuls) and what the devices exchanged. The rest is redone: the cheap
#: elementwise and row-placement steps between the products, and the experts' weights as the products
#: read them (gathered to whole width, cast per device, sliced per block, FP8-quantized). Kept, the
#: weights sliced per block grew a scanned model by 28 GB a layer (Mixtral-8x7B, 8 x 4,096 tokens on 8
#: H100s under FSDP; a dense Llama layer of its width keeps 1.4 GB).
KEPT = frozenset(
    {"dot_general", "ragged_dot_general", "all_to_all", "ragged_all_to_all", "all_gather", "reduce_scatter", "psum"}
)


def keep_products(primitive: Any, *_: Any, **params: Any) -> bool:
    """Checkpoint policy of the expert computations: save the results of :data:`KEPT` and the integer
    row placements (:data:`PLACEMENT`) and the blocked experts' hidden projections (:data:`PRODUCT`) only."""
    if primitive.name == "name":  # checkpoint_name
        return params.get("name") in (PLACEMENT, PRODUCT)
    return primitive.name in KEPT


def recomputed(fn: Callable[..., Any], prevent_cse: bool = True) -> Callable[..., Any]:
    """``fn`` whose backward pass keeps only its products, exchanges (:data:`KEPT`) and row placements; the same
    policy on a loop's body (``prevent_cse=False``) redoes its weights' reads in each backward iteration
    instead of stacking them over the iterations."""
    return jax.checkpoint(fn, policy=keep_products, prevent_cse=prevent_cse)


#: The dropless paths of :func:`grouped_ffn`: XLA's grouped matmul (``jax.lax.ragged_dot``), the same
#: products as the megablox Pallas kernels (``gmm`` for the products, ``tgmm`` for the weights' gradient;
#: a TPU kernel, interpreted elsewhere), or one matmul per block of one expert's rows (``blocks``).
PATHS = ("ragged_dot", "gmm", "blocks")
#: The megablox tiles (rows, contraction, output columns), each clipped to its operand. On a v5e, for the
#: Mixtral-shaped layer of ``benchmarks/tpu_mfu.py`` (32k token copies, width 768, 8 experts of 2,688),
#: 1,024 x 768 x 768 tiles ran the three products forward and backward in 10.5 ms, 512-wide ones in 15.9 ms,
#: 128-wide ones in 102 ms and ``ragged_dot`` in 14.2 ms (the dense products of the same FLOPs: 7.0 ms).
#: Those are the kernels alone; the contraction and column tiles need not divide their dimension (the kernel
#: masks the last tile). Through :func:`grouped_matmul` (its masks included), tiles that divide each dimension
#: (896 or 384 for 2,688) took 12.0-12.2 ms, and in the whole model step they and these tiles ran alike
#: (238.2 against 237.5 ms).
GMM_TILES = (1024, 768, 768)


def gmm_tiling(m: int, k: int, n: int) -> tuple[int, int, int]:
    """Tiles of a megablox product of ``[m, k]`` rows and ``[G, k, n]`` weights: :data:`GMM_TILES` clipped to
    the operands, the row tile the largest multiple of 8 within it that divides ``m`` (the kernel needs one;
    ``m`` itself where it is within the tile)."""
    rows = m
    if m > GMM_TILES[0]:
        rows = next((tile for tile in range(GMM_TILES[0], 0, -8) if m % tile == 0), m)
    return rows, min(GMM_TILES[1], k), min(GMM_TILES[2], n)


#: Rows a megablox product pads its operand to a multiple of when no row tile divides it.
ROW_MULTIPLE = 256


def grouped_matmul(rows: jax.Array, kernel: jax.Array, sizes: jax.Array, path: str, exact: bool = False) -> jax.Array:
    """``rows`` ``[M, K]`` sorted by group (``sizes`` ``[G]`` rows each; rows past their sum are padding
    and give zero rows) times each group's ``kernel`` ``[G, K, N]``: ``[M, N]`` by ``path``
    (:data:`PATHS`: ``ragged_dot`` or ``gmm``). The megablox kernel leaves padding rows unwritten in both
    directions, so they are masked on the way in (which masks their gradient) and out; ``exact``: the sizes
    add up to ``M`` (every row in a group, as every copy of a dropless dispatch is), so no row needs a mask
    (the rows added to reach a row tile are cut off after the kernel, in both directions)."""
    if path == "ragged_dot":
        return jax.lax.ragged_dot(rows, kernel, sizes)
    from jax.experimental.pallas.ops.tpu.megablox import ops as megablox

    m = rows.shape[0]
    extra = 0 if m <= GMM_TILES[0] or m % ROW_MULTIPLE == 0 else -m % ROW_MULTIPLE  # a row tile of 256 or more
    padded = jnp.pad(rows, ((0, extra), (0, 0)))
    valid = None if exact else (jnp.arange(m + extra, dtype=jnp.int32) < jnp.sum(sizes))[:, None]
    if valid is not None:
        padded = jnp.where(valid, padded, 0)
    kernel = kernel.astype(rows.dtype)
    tiling = gmm_tiling(m + extra, rows.shape[1], kernel.shape[2])
    interpret = accelerator().platform != "tpu"
    out = megablox.gmm(padded, kernel, sizes, rows.dtype, tiling, None, None, False, interpret)
    if valid is not None:
        out = jnp.where(valid, out, 0)
    # the policy of :func:`recomputed` keeps a product by name: the kernel is not a dot primitive
    return checkpoint_name(out[:m], PRODUCT)


def _grouped_rows(
    rows: jax.Array, sizes: jax.Array, kernels: Kernels, act: Activation, path: str, exact: bool = False
) -> jax.Array:
    """Rows sorted by expert (``sizes`` per expert; rows past their sum are padding, none where ``exact``) as
    grouped matmuls (:func:`grouped_matmul`): a gated expert's gate and up projections are one, over the two
    concatenated along the hidden width (``[E, D, 2F]``, at call time: the parameters keep their layout)."""
    gate, up, down = kernels
    if gate is None:
        hidden = ffn(None, grouped_matmul(rows, up, sizes, path, exact), act)
    else:
        both = grouped_matmul(rows, jnp.concatenate([gate, up], axis=-1), sizes, path, exact)
        hidden = ffn(both[:, : up.shape[-1]], both[:, up.shape[-1] :], act)
    return grouped_matmul(hidden, down, sizes, path, exact)


def _blocked_rows(
    rows: jax.Array,
    groups: jax.Array,
    placed: Placement,
    kernels: Kernels,
    act: Activation,
    skip_empty: bool,
    copies: int,
) -> jax.Array:
    """Rows (``copies`` of each of ``rows``, in their own order; ``placed`` sorts them by expert
    ``groups``, padding marked ``>= E``) placed in whole blocks of :func:`block_rows` per expert, each
    block one matmul with its expert's weights. Each copy is placed straight at its block slot and read
    back from it, both gathers both ways (:func:`gather_rows`). With ``skip_empty``, blocks holding no row
    are skipped by a ``lax.cond`` (worth it where most rows are padding, as in the expert-parallel
    receive buffers; otherwise the conditional costs more in the backward pass than the few empty
    blocks: 2.4x the step at E=64, k=8)."""
    n_experts, m = kernels[1].shape[0], groups.shape[0]
    sizes = placed.sizes
    size = block_rows(m, n_experts, GPU_PADDING_SHARE if accelerator().platform == "gpu" else None)
    n_blocks = -(-m // size) + n_experts  # enough for any split of the rows
    padded = -(-sizes // size) * size
    padded_ends = jnp.cumsum(padded)
    sorted_groups = groups[placed.order]
    expert = jnp.minimum(sorted_groups, n_experts - 1)
    rank = jnp.arange(m) - (jnp.cumsum(sizes) - sizes)[expert]
    trash = n_blocks * size
    slot_sorted = jnp.where(sorted_groups < n_experts, (padded_ends - padded)[expert] + rank, trash)
    slot = checkpoint_name(slot_sorted[placed.slot], PLACEMENT)  # each copy's block slot, in copy order
    source = checkpoint_name(sources(slot, trash), PLACEMENT)
    buffer = gather_rows(rows, source, slot, copies)
    starts = jnp.arange(n_blocks) * size
    # the expert whose padded rows hold each block (a comparison count: searchsorted fails inside shard_map)
    owner = jnp.minimum(jnp.sum(padded_ends[None, :] <= starts[:, None], axis=1), n_experts - 1)

    def hidden(x: jax.Array, g: jax.Array | None, u: jax.Array) -> tuple[jax.Array | None, jax.Array]:
        return None if g is None else project("md,df->mf", x, g, x.dtype), project("md,df->mf", x, u, x.dtype)

    def output(h_gate: jax.Array | None, h_up: jax.Array, d: jax.Array) -> jax.Array:
        return project("mf,fd->md", ffn(h_gate, h_up, act), d, h_up.dtype)

    used = starts < padded_ends[-1] if skip_empty else None
    blocks = buffer.reshape(n_blocks, size, -1)
    out = _mapped((hidden, output), blocks, owner, used, kernels).reshape(trash, -1)
    return permute_rows(out, slot, source)


#: A block's two steps: its hidden projections ``(x, gate, up) -> (h_gate, h_up)`` and its output
#: ``(h_gate, h_up, down) -> y``, one expert's weights each.
BlockSteps = tuple[Callable[..., tuple[jax.Array | None, jax.Array]], Callable[..., jax.Array]]


def _block_weights(kernels: Kernels, e: jax.Array) -> Kernels:
    """Expert ``e``'s weights of each kernel."""
    gate, up, down = kernels
    return (None if gate is None else gate[e]), up[e], down[e]


def _add_at(total: jax.Array, e: jax.Array, part: jax.Array) -> jax.Array:
    """``total`` with ``part`` added to its slice ``e`` (a slice update: no scatter)."""
    return jax.lax.dynamic_update_index_in_dim(total, jax.lax.dynamic_index_in_dim(total, e, 0, False) + part, e, 0)


def _map_forward(
    steps: BlockSteps, blocks: jax.Array, owner: jax.Array, used: jax.Array | None, kernels: Kernels
) -> tuple[jax.Array, tuple[jax.Array | None, jax.Array]]:
    """Each block ``[B, S, D]`` through its owner's weights (``used``: which hold rows, the others zero
    and skipped by a ``lax.cond``): the outputs and the hidden projections, ``[B, S, *]`` each."""
    hidden, output = steps

    def block(args: tuple[jax.Array, jax.Array, jax.Array | None]) -> tuple[jax.Array, tuple[Any, Any]]:
        x, e, u = args
        g, up, d = _block_weights(kernels, e)

        def run(x: jax.Array) -> tuple[jax.Array, tuple[Any, Any]]:
            h = hidden(x, g, up)
            return output(*h, d), h

        def skip(x: jax.Array) -> tuple[jax.Array, tuple[Any, Any]]:
            h = jnp.zeros_like(x, shape=(x.shape[0], up.shape[-1]))
            return jnp.zeros_like(x), (None if g is None else h, h)

        return run(x) if u is None else jax.lax.cond(u, run, skip, x)

    return jax.lax.map(block, (blocks, owner, used))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _mapped(
    steps: BlockSteps, blocks: jax.Array, owner: jax.Array, used: jax.Array | None, kernels: Kernels
) -> jax.Array:
    """The blocked experts' loop (:func:`_map_forward`) with its own backward loop (:func:`_mapped_backward`)."""
    return _map_forward(steps, blocks, owner, used, kernels)[0]


def _mapped_forward(
    steps: BlockSteps, blocks: jax.Array, owner: jax.Array, used: jax.Array | None, kernels: Kernels
) -> tuple[jax.Array, tuple[Any, ...]]:
    out, hidden = _map_forward(steps, blocks, owner, used, kernels)
    return out, (blocks, owner, used, kernels, *(None if h is None else checkpoint_name(h, PRODUCT) for h in hidden))


def _mapped_backward(
    steps: BlockSteps, residuals: tuple[Any, ...], g: jax.Array
) -> tuple[jax.Array, None, None, Kernels]:
    """One loop over the blocks again, each block's hidden projections kept from the forward pass
    (:data:`PRODUCT`), the weights' gradients summed into per-expert accumulators. Those start from
    zeros that depend on ``g`` (through an optimization barrier): constant zeros of every layer of an
    unrolled stack are fused into one buffer set made before the first layer's backward pass, each layer
    then holding its whole-width weight gradients (3 x 0.94 GB for Mixtral-8x7B) from there on."""
    hidden, output = steps
    blocks, owner, used, kernels, h_gate, h_up = residuals
    zero = jax.lax.optimization_barrier((jnp.zeros((), g.dtype), g))[0]
    start: tuple[Any, ...] = tuple(None if k is None else jnp.zeros_like(k) + zero.astype(k.dtype) for k in kernels)

    def grads(x: jax.Array, g_: Any, up: jax.Array, d: jax.Array, h: tuple[Any, Any], dy: jax.Array) -> tuple[Any, ...]:
        dh_gate, dh_up, dd = jax.vjp(output, *h, d)[1](dy)
        dx, dg, du = jax.vjp(hidden, x, g_, up)[1]((dh_gate, dh_up))
        return dx, (dg, du, dd)

    def step(sums: tuple[Any, ...], args: tuple[Any, ...]) -> tuple[tuple[Any, ...], jax.Array]:
        x, e, u, hg, hu, dy = args
        g_, up, d = _block_weights(kernels, e)
        run = functools.partial(grads, g_=g_, up=up, d=d)
        if u is None:
            dx, dw = run(x, h=(hg, hu), dy=dy)
        else:
            dx, dw = jax.lax.cond(
                u,
                lambda x, h, dy: run(x, h=h, dy=dy),
                lambda x, h, dy: (
                    jnp.zeros_like(x),
                    tuple(None if w is None else jnp.zeros_like(w) for w in (g_, up, d)),
                ),
                x,
                (hg, hu),
                dy,
            )
        sums = tuple(None if s is None else _add_at(s, e, w) for s, w in zip(sums, dw, strict=True))
        return sums, dx

    sums, dx = jax.lax.scan(step, start, (blocks, owner, used, h_gate, h_up, g))
    gate_sum, up_sum, down_sum = sums
    return dx, None, None, (gate_sum, up_sum, down_sum)


_mapped.defvjp(_mapped_forward, _mapped_backward)


def grouped_ffn(
    rows: jax.Array,
    groups: jax.Array,
    kernels: Kernels,
    act: Activation,
    path: str,
    skip_empty: bool = False,
    copies: int = 1,
    padded: bool = True,
) -> jax.Array:
    """Each copy of ``rows`` ``[M / copies, D]`` (``copies`` consecutive copies of each row) through
    expert ``groups[m]`` (``[M]`` int32; ``>= E`` marks padding, whose output row is zero; ``padded=False``:
    the caller's groups are all experts, so the grouped products mask nothing): ``[M, D]``
    in copy order. The copies are sorted by expert once (:func:`place`) and run as grouped matmuls
    (``path`` ``ragged_dot`` or ``gmm``, :func:`grouped_matmul`), or with ``path="blocks"`` as one matmul
    per block of one expert's rows (``skip_empty``: blocks of padding only are skipped). Placing the
    copies and reading them back are gathers in both directions (:func:`gather_rows`): no scatter-add in
    the backward pass."""
    placed = place(groups, kernels[1].shape[0])
    if path == "blocks":
        return _blocked_rows(rows, groups, placed, kernels, act, skip_empty, copies)
    gathered = gather_rows(rows, placed.order, placed.slot, copies)
    out = _grouped_rows(gathered, placed.sizes, kernels, act, path, exact=not padded)
    return permute_rows(out, placed.slot, placed.order)


def dropless_experts(
    tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation, path: str = "ragged_dot"
) -> jax.Array:
    """Every token copy through its expert (:func:`grouped_ffn`, the copies read straight from
    ``tokens``), summed with the routing weights (a reshape and a weighted sum). ``[N, D]``."""
    n, k = routing.experts.shape
    groups = routing.experts.reshape(-1)  # every copy routed to an expert: no padding rows
    out = grouped_ffn(tokens, groups, kernels, act, path, copies=k, padded=False).reshape(n, k, -1)
    return jnp.einsum("nkd,nk->nd", out, routing.weights.astype(out.dtype))


def blocked_experts(tokens: jax.Array, routing: Routing, kernels: Kernels, act: Activation) -> jax.Array:
    """:func:`dropless_experts` on the blocked path (the CPU one)."""
    return dropless_experts(tokens, routing, kernels, act, path="blocks")


def capacity_slots(experts: jax.Array, n_experts: int, capacity: int) -> tuple[jax.Array, jax.Array]:
    """For ``experts`` ``[N, k]``: each copy's position in its expert's buffer and whether it fits
    (``< capacity``), both ``[N, k]``. First choices of all tokens come before second choices; within
    a choice rank, earlier tokens first."""
    n, k = experts.shape
    flat = experts.T.reshape(-1)  # rank-major priority
    order = jnp.argsort(flat, stable=True)
    sizes = expert_counts(flat, n_experts)
    starts = jnp.cumsum(sizes) - sizes
    position_sorted = jnp.arange(flat.shape[0]) - starts[flat[order]]
    position = position_sorted[_inverse(order)]
    position = position.reshape(k, n).T
    return position, position < capacity


def capacity_buffer(
    tokens: jax.Array, experts: jax.Array, position: jax.Array, kept: jax.Array, n_experts: int, capacity: int
) -> tuple[jax.Array, jax.Array]:
    """The kept copies of ``tokens`` in per-expert buffers ``[E * capacity, D]`` (zeros elsewhere), and
    each copy's slot ``[N * k]`` (``E * capacity`` for a dropped one). The buffer is a gather of the
    copies both ways (:func:`gather_rows`)."""
    k = experts.shape[1]
    trash = n_experts * capacity
    slot = jnp.where(kept, experts * capacity + position, trash).reshape(-1).astype(jnp.int32)
    return gather_rows(tokens, sources(slot, trash), slot, k), slot


def combine_slots(out: jax.Array, slot: jax.Array, weights: jax.Array, kept: jax.Array) -> jax.Array:
    """Each token's kept copies read from the expert outputs ``out`` ``[E * capacity, D]`` at ``slot``
    and summed with the routing ``weights`` (dropped copies count zero): ``[N, D]``."""
    n, k = weights.shape
    rows = permute_rows(out, slot, sources(slot, out.shape[0])).reshape(n, k, -1)
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
    "expert_counts",
    "ffn",
    "gather_rows",
    "gmm_tiling",
    "grouped_ffn",
    "grouped_matmul",
    "keep_products",
    "loop_over_experts",
    "permute_rows",
    "place",
    "recomputed",
]
