"""Context parallelism: each row's sequence split over the ``context`` mesh axis.

**Layout.** With ``n`` devices on the axis a sequence is cut into ``2n`` chunks and device ``d``
holds chunks ``d`` and ``2n - 1 - d`` (:func:`balanced_order`): under a causal mask every device then
has the same share of visible query-key pairs. ``TransformerLM.hidden`` puts its tokens into this
order before the layers and takes the last layer's output back out of it, so the per-token layers,
the head and the loss never see it; each token's position travels with it (RoPE reads global
positions).

**Attention** (:func:`context_parallel_attention`). Each device holds its own queries, keys and
values. ``allgather`` gathers every device's keys and values, then attends to them chunk by chunk;
its backward reduce-scatters their gradients. ``ring`` passes key/value blocks round the axis with
``ppermute``, one step per device, and its backward passes them round again together with their
gradients, so no device ever holds more than two blocks. Both accumulate a float32 online softmax,
skip the pairs of half-chunks that the causal mask or a sliding window hides entirely, and keep only
the queries, keys, values, output and log-sum-exp for the backward (their own ``custom_vjp``).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from theseus.base.axis import Axis, MeshAxis, context_attention
from theseus.errors import ConfigError

#: The longest part of a device's queries or keys whose scores are formed at once: a block of scores is
#: ``[B, heads, MAX_BLOCK, MAX_BLOCK]`` float32 at most.
MAX_BLOCK = 1024

#: The score given to a masked query-key pair (as the single-device attention masks).
_MASKED = float(jnp.finfo(jnp.float32).min)


def context_size() -> int:
    """Size of the ``context`` axis of the mesh the model runs under (1 without one)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or MeshAxis.CONTEXT not in mesh.axis_names:
        return 1
    return int(dict(mesh.shape)[MeshAxis.CONTEXT])


def refuse(what: str) -> None:
    """Raise a one-line error when ``what`` (a layer or feature) runs with its sequence split over
    ``mesh/context``, which it does not support."""
    if context_size() > 1:
        raise ConfigError(f"{what} cannot split its sequence over mesh/context; set mesh/context=1 for this model")


def balanced_order(steps: int, n: int) -> np.ndarray:
    """Sequence indices in the order the ``context`` axis of size ``n`` holds them: ``2n`` equal chunks,
    device ``d`` holding chunks ``d`` then ``2n - 1 - d``."""
    if steps % (2 * n):
        raise ConfigError(
            f"a sequence of {steps} tokens cannot be cut into 2 x mesh/context = {2 * n} equal chunks; "
            f"use a sequence length (training/sequence_length) that is a multiple of {2 * n}"
        )
    size = steps // (2 * n)
    chunks = [chunk for device in range(n) for chunk in (device, 2 * n - 1 - device)]
    return np.concatenate([np.arange(chunk * size, (chunk + 1) * size) for chunk in chunks]).astype(np.int32)


def to_balanced(x: jax.Array, order: np.ndarray) -> jax.Array:
    """``x`` ``[B, T, ...]`` with its sequence in ``order`` (:func:`balanced_order`)."""
    return jnp.take(x, jnp.asarray(order), axis=1)


def from_balanced(x: jax.Array, order: np.ndarray) -> jax.Array:
    """The inverse of :func:`to_balanced`: ``x`` back in sequence order."""
    return jnp.take(x, jnp.asarray(np.argsort(order).astype(np.int32)), axis=1)


# ---------------------------------------------------------------------------------------------------
# The attention of one device's queries (inside shard_map)
# ---------------------------------------------------------------------------------------------------


class _Spec:
    """What every block of one attention call shares: static, but for a ``window`` that may be traced
    (chosen per layer inside a scan)."""

    def __init__(self, n: int, size: int, scale: float, softcap: float | None, per_query: bool) -> None:
        self.n, self.size = n, size
        self.scale, self.softcap, self.per_query = scale, softcap, per_query
        self.window: Any = None
        self.pieces = next(m for m in range(-(-size // MAX_BLOCK), size + 1) if size % m == 0)
        self.length = size // self.pieces  # tokens of one part: a chunk is cut into ``pieces`` parts

    @property
    def parts(self) -> int:
        """Parts of one device's tokens (two chunks of ``pieces`` parts each)."""
        return 2 * self.pieces

    def windowed(self, window: Any) -> _Spec:
        """This spec with ``window`` (None: causal only)."""
        spec = _Spec(self.n, self.size, self.scale, self.softcap, self.per_query)
        spec.window = window
        return spec

    def starts(self, device: Any) -> list[Any]:
        """Sequence index of the first token of each part ``device`` holds (chunks ``d`` and ``2n - 1 - d``)."""
        chunks = (device, 2 * self.n - 1 - device)
        return [chunks[j // self.pieces] * self.size + (j % self.pieces) * self.length for j in range(self.parts)]

    def index(self, start: Any) -> jax.Array:
        """Sequence indices of the part beginning at ``start``."""
        return start + jnp.arange(self.length, dtype=jnp.int32)

    def visible(self, query_start: Any, key_start: Any) -> Any:
        """Whether any query of one part sees any key of another (causal, within the window)."""
        seen = key_start <= query_start + self.length - 1
        if self.window is None:
            return seen
        return seen & (query_start - (key_start + self.length - 1) < self.window)

    def scores(self, q: jax.Array, k: jax.Array) -> jax.Array:
        """Scaled (and capped) scores ``[B, kv, group, Tq, Tk]`` of grouped ``q`` and ``k``."""
        s = jnp.einsum("btkgh,bskh->bkgts", q, k, preferred_element_type=jnp.float32) * self.scale
        return jnp.tanh(s / self.softcap) * self.softcap if self.softcap is not None else s

    def mask(self, qi: jax.Array, ki: jax.Array, qseg: jax.Array | None, kseg: jax.Array | None) -> jax.Array:
        """Which pairs of a block are attended: causal and windowed by sequence index, real keys only
        (``kseg > 0``), and with packed rows keys of the query's own example."""
        allowed = ki[None, :] <= qi[:, None]
        if self.window is not None:
            allowed = allowed & (qi[:, None] - ki[None, :] < self.window)
        mask = allowed[None, None, None]
        if kseg is not None:
            mask = mask & (kseg > 0)[:, None, None, None, :]
            if self.per_query and qseg is not None:
                mask = mask & (qseg[:, :, None] == kseg[:, None, :])[:, None, None]
        return mask


def _parts(x: jax.Array | None, spec: _Spec, axis: int = 1) -> list[Any]:
    """``x`` cut into the :attr:`_Spec.parts` parts of one device's tokens along ``axis``."""
    if x is None:
        return [None] * spec.parts
    return [jax.lax.slice_in_dim(x, j * spec.length, (j + 1) * spec.length, axis=axis) for j in range(spec.parts)]


def _pairs(spec: _Spec, q_starts: list, q_segs: list, source: Any, kb: jax.Array, vb: jax.Array, kseg: Any) -> Any:
    """Yield ``(query part, key part, keys, values, where, visible)`` for every pair of a part of this
    device's queries and a part of the key block of device ``source``; ``where`` (sequence indices and
    segment ids of the queries and keys) gives the mask inside the computation that reads it, so that no
    ``[queries, keys]`` mask is formed outside it."""
    k_starts = spec.starts(source)
    keyed = zip(_parts(kb, spec), _parts(vb, spec), _parts(kseg, spec), strict=True)
    for part_k, (kp, vp, ksp) in enumerate(keyed):
        for part_q in range(spec.parts):
            where = (spec.index(q_starts[part_q]), spec.index(k_starts[part_k]), q_segs[part_q], ksp)
            yield part_q, part_k, kp, vp, where, spec.visible(q_starts[part_q], k_starts[part_k])


def _accumulate(spec: _Spec, state: tuple, q: jax.Array, k: jax.Array, v: jax.Array, where: tuple) -> tuple:
    """The online softmax ``(out, max, sum)`` after one more block of keys."""
    out, top, total = state
    s = jnp.where(spec.mask(*where), spec.scores(q, k), _MASKED)
    new_top = jnp.maximum(top, jnp.max(s, axis=-1))
    shrink = jnp.exp(top - new_top)
    p = jnp.exp(s - new_top[..., None])
    total = total * shrink + jnp.sum(p, axis=-1)
    out = out * shrink[..., None] + jnp.einsum(
        "bkgts,bskh->bkgth", p.astype(v.dtype), v, preferred_element_type=jnp.float32
    )
    return out, new_top, total


def _block_grads(
    spec: _Spec,
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    where: tuple,
    lse: jax.Array,
    dout: jax.Array,
    delta: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dq, dk, dv)`` of one block of grouped queries against one block of keys and values."""
    f32, dtype = jnp.float32, q.dtype  # products in the inputs' precision, accumulated in float32
    s = spec.scores(q, k)
    p = jnp.exp(jnp.where(spec.mask(*where), s, _MASKED) - lse[..., None])
    dv = jnp.einsum("bkgts,bkgth->bskh", p.astype(dtype), dout.astype(dtype), preferred_element_type=f32)
    dp = jnp.einsum("bkgth,bskh->bkgts", dout.astype(dtype), v, preferred_element_type=f32)
    ds = p * (dp - delta[..., None])
    if spec.softcap is not None:
        ds = ds * (1.0 - jnp.square(s / spec.softcap))
    ds = (ds * spec.scale).astype(dtype)
    dq = jnp.einsum("bkgts,bskh->btkgh", ds, k, preferred_element_type=f32)
    dk = jnp.einsum("bkgts,btkgh->bskh", ds, q, preferred_element_type=f32)
    return dq, dk, dv


def _varying_axes(x: jax.Array) -> frozenset[str]:
    """The manual mesh axes ``x`` differs over inside ``shard_map``."""
    aval = jax.typeof(x)
    manual = getattr(aval, "manual_axis_type", None)
    return frozenset(manual.varying) if manual is not None else frozenset(getattr(aval, "vma", ()))


def _vary(x: jax.Array, like: jax.Array) -> jax.Array:
    """``x`` marked as differing over the manual axes ``like`` differs over (the branches of a
    ``cond`` must agree, and a cotangent differs where its input does)."""
    missing = tuple(sorted(_varying_axes(like) - _varying_axes(x)))
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _sweep(
    form: str,
    spec: _Spec,
    device: Any,
    blocks: Sequence[jax.Array | None],
    visit: Any,
    carry: Any,
    grads: list[jax.Array] | None = None,
) -> Any:
    """Visit every device's key block (``blocks`` = this device's keys, values, segment ids) in a loop:
    ``visit(carry, source, blocks) -> carry``. ``allgather`` gathers the blocks first and slices them;
    ``ring`` passes them on with ``ppermute`` after each visit. With ``grads`` (zeros like the blocks'
    gradients) ``visit`` returns ``(carry, block gradients)`` as well, and the result is ``(carry, this
    device's key gradients)``: reduce-scattered from the gathered form, or passed round the ring with the
    blocks (after ``n`` moves each is home again)."""
    n = spec.n
    if form == "allgather":
        gathered = [None if a is None else jax.lax.all_gather(a, MeshAxis.CONTEXT, axis=1, tiled=True) for a in blocks]
        width = 2 * spec.size
        sums = (
            None
            if grads is None
            else [_vary(jnp.zeros((g.shape[0], n * width, *g.shape[2:]), g.dtype), g) for g in grads]
        )

        def gathered_body(state: tuple, source: jax.Array) -> tuple[tuple, None]:
            carry, sums = state
            own = [
                None if a is None else jax.lax.dynamic_slice_in_dim(a, source * width, width, axis=1) for a in gathered
            ]
            if sums is None:
                return (visit(carry, source, own), None), None
            carry, new = visit(carry, source, own)
            sums = [
                jax.lax.dynamic_update_slice_in_dim(a, g, source * width, axis=1)
                for a, g in zip(sums, new, strict=True)
            ]
            return (carry, sums), None

        (carry, sums), _ = jax.lax.scan(gathered_body, (carry, sums), jnp.arange(n))
        if sums is None:
            return carry
        return carry, [jax.lax.psum_scatter(a, MeshAxis.CONTEXT, scatter_dimension=1, tiled=True) for a in sums]
    ring = [(j, (j + 1) % n) for j in range(n)]

    def move(a: jax.Array | None) -> jax.Array | None:
        return None if a is None else jax.lax.ppermute(a, MeshAxis.CONTEXT, ring)

    def ring_step(state: tuple, index: Any, last: bool) -> tuple:
        carry, moving, travelling = state
        source = (device - index) % n
        if travelling is None:
            carry = visit(carry, source, moving)
        else:
            carry, new = visit(carry, source, moving)
            travelling = [move(t + g) for t, g in zip(travelling, new, strict=True)]
        return carry, (moving if last else [move(a) for a in moving]), travelling

    state = (carry, list(blocks), grads)
    state, _ = jax.lax.scan(lambda st, i: (ring_step(st, i, False), None), state, jnp.arange(n - 1))
    carry, _, travelling = ring_step(state, n - 1, True)
    return carry if travelling is None else (carry, travelling)


def _device(q: jax.Array) -> jax.Array:
    """This device's place on the context axis, tied to ``q`` so that what is computed from it alone (the
    masks of each block) is not loop-invariant in a loop over layers: such values are hoisted out of the
    loop and kept, one per block, for the whole step."""
    device, _ = jax.lax.optimization_barrier((jax.lax.axis_index(MeshAxis.CONTEXT), q))
    return device


def _group(x: jax.Array, n_kv: int) -> jax.Array:
    b, t, h, d = x.shape
    return x.reshape(b, t, n_kv, h // n_kv, d)


def _finish(spec: _Spec, state: tuple, sinks: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """``(out, lse)`` of the accumulated ``state``; ``sinks`` ``[kv, group]`` join the softmax."""
    out, top, total = state
    if sinks is not None:
        sink = jnp.broadcast_to(sinks.astype(jnp.float32)[None, :, :, None], top.shape)
        new_top = jnp.maximum(top, sink)
        total = total * jnp.exp(top - new_top) + jnp.exp(sink - new_top)
        out = out * jnp.exp(top - new_top)[..., None]
        top = new_top
    return out / total[..., None], top + jnp.log(total)


def _local_forward(
    spec: _Spec, form: str, q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None, sinks: Any
) -> tuple[jax.Array, tuple]:
    device = _device(q)
    n_kv = k.shape[2]
    grouped = _group(q, n_kv)
    b, _, _, g, d = grouped.shape
    length = spec.length
    q_starts, q_parts, q_segs = spec.starts(device), _parts(grouped, spec), _parts(seg, spec)
    init = (
        jnp.zeros((b, n_kv, g, length, d), jnp.float32),
        jnp.full((b, n_kv, g, length), _MASKED, jnp.float32),
        jnp.zeros((b, n_kv, g, length), jnp.float32),
    )
    states = tuple(tuple(_vary(x, q) for x in init) for _ in range(spec.parts))

    def visit(states: tuple, source: Any, block: list) -> tuple:
        updated = list(states)
        for part_q, _, kp, vp, where, visible in _pairs(spec, q_starts, q_segs, source, *block):
            step = functools.partial(_accumulate, spec, q=q_parts[part_q], k=kp, v=vp, where=where)
            updated[part_q] = jax.lax.cond(visible, lambda st, step=step: step(st), lambda st: st, updated[part_q])
        return tuple(updated)

    states = _sweep(form, spec, device, (k, v, seg), visit, states)
    finished = [_finish(spec, state, sinks) for state in states]
    out = jnp.concatenate([f[0] for f in finished], axis=3)  # [b, kv, g, 2 size, d]
    lse = jnp.concatenate([f[1] for f in finished], axis=3)
    y = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(q.shape).astype(q.dtype)
    return y, (q, k, v, seg, sinks, out, lse)


def _local_backward(spec: _Spec, form: str, residuals: tuple, dy: jax.Array) -> tuple:
    q, k, v, seg, sinks, out, lse = residuals
    device = _device(q)
    n_kv = k.shape[2]
    grouped = _group(q, n_kv)
    dout = jnp.transpose(_group(dy, n_kv), (0, 2, 3, 1, 4)).astype(jnp.float32)  # [b, kv, g, T, d]
    delta = jnp.sum(dout * out, axis=-1)
    q_starts, q_parts, q_segs = spec.starts(device), _parts(grouped, spec), _parts(seg, spec)
    dout_parts, lse_parts, delta_parts = _parts(dout, spec, 3), _parts(lse, spec, 3), _parts(delta, spec, 3)
    dq = tuple(_vary(jnp.zeros(part.shape, jnp.float32), q) for part in q_parts)

    def visit(dq: tuple, source: Any, block: list) -> tuple[tuple, list]:
        dq_list = list(dq)
        dkv = [[_vary(jnp.zeros(part.shape, jnp.float32), q) for part in _parts(x, spec)] for x in block[:2]]
        for part_q, part_k, kp, vp, where, visible in _pairs(spec, q_starts, q_segs, source, *block):
            args = (q_parts[part_q], kp, vp, where, lse_parts[part_q], dout_parts[part_q], delta_parts[part_q])

            def grads(acc: tuple, args: tuple = args) -> tuple:
                gq, gk, gv = _block_grads(spec, *args)
                return acc[0] + gq, acc[1] + gk, acc[2] + gv

            acc = jax.lax.cond(visible, grads, lambda a: a, (dq_list[part_q], dkv[0][part_k], dkv[1][part_k]))
            dq_list[part_q], dkv[0][part_k], dkv[1][part_k] = acc
        return tuple(dq_list), [jnp.concatenate(parts, axis=1) for parts in dkv]

    zeros = [_vary(jnp.zeros(x.shape, jnp.float32), q) for x in (k, v)]
    dq, (dk, dv) = _sweep(form, spec, device, (k, v, seg), visit, dq, zeros)
    dq_full = jnp.concatenate(dq, axis=1).reshape(q.shape)
    dsinks = None
    if sinks is not None:
        p_sink = jnp.exp(sinks.astype(jnp.float32)[None, :, :, None] - lse)
        dsinks = (-jnp.sum(p_sink * delta, axis=(0, 3))).astype(sinks.dtype)
    return dq_full.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, dsinks


@functools.lru_cache(maxsize=64)
def _local_attention(spec_key: tuple, form: str) -> Any:
    """The per-device attention with its own backward, for one static configuration."""
    spec = _Spec(*spec_key)

    @jax.custom_vjp
    def attend(q: jax.Array, k: jax.Array, v: jax.Array, seg: Any, sinks: Any, window: Any) -> jax.Array:
        return _local_forward(spec.windowed(window), form, q, k, v, seg, sinks)[0]

    def forward(q: jax.Array, k: jax.Array, v: jax.Array, seg: Any, sinks: Any, window: Any) -> tuple:
        y, residuals = _local_forward(spec.windowed(window), form, q, k, v, seg, sinks)
        return y, (*residuals, window)

    def backward(residuals: tuple, dy: jax.Array) -> tuple:
        *saved, window = residuals
        return (*_local_backward(spec.windowed(window), form, tuple(saved), dy), None)

    attend.defvjp(forward, backward)
    return attend


# ---------------------------------------------------------------------------------------------------
# The global call
# ---------------------------------------------------------------------------------------------------


def spec_of(shape: tuple[int, ...], *logical: str) -> PartitionSpec:
    """The mesh axes the current rules give ``logical``, less those a dimension of ``shape`` does not divide
    over (a model initialised on one row)."""
    mapped = nn.logical_to_mesh_axes(logical)
    entries = tuple(mapped) if mapped is not None else (None,) * len(logical)
    sizes = dict(jax.sharding.get_abstract_mesh().shape)
    fitted = []
    for size, entry in zip(shape, entries, strict=False):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        fitted.append(entry if size % int(np.prod([sizes[name] for name in names])) == 0 else None)
    return PartitionSpec(*fitted)


def _axes(spec: PartitionSpec) -> set[str]:
    names: set[str] = set()
    for entry in spec:
        if entry is None:
            continue
        names.update((entry,) if isinstance(entry, str) else entry)
    return names


def context_parallel_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    padding_mask: jax.Array | None,
    *,
    window: int | jax.Array | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Causal grouped-query attention of ``q`` ``[B, T, heads, head_dim]`` and ``k``/``v``
    ``[B, T, kv_heads, head_dim]`` whose sequences are in the balanced order and split over the
    ``context`` axis, in the form the trainer chose (``mesh/context_attention``).

    ``padding_mask``: bool ``[B, T]`` (True = real token; only keys are masked) or int segment ids
    (packed examples: a token sees its own example's tokens), in the same order. ``window``, ``scale``,
    ``softcap`` and ``sinks`` as single-device attention takes them. Equal to it up to float rounding.
    """
    n = context_size()
    form = context_attention()
    steps = q.shape[1]
    if steps % (2 * n):
        balanced_order(steps, n)  # raises the one-line error
    per_query = padding_mask is not None and bool(jnp.issubdtype(padding_mask.dtype, jnp.integer))
    seg = None if padding_mask is None else padding_mask.astype(jnp.int32)
    head_dim, n_kv = q.shape[-1], k.shape[2]
    spec_key = (
        n,
        steps // (2 * n),
        head_dim**-0.5 if scale is None else float(scale),
        softcap,
        per_query,
    )
    attend = _local_attention(spec_key, form)
    q_spec = spec_of(q.shape, Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM)
    kv_spec = spec_of(k.shape, Axis.BATCH, Axis.SEQUENCE, Axis.KV_HEADS, Axis.HEAD_DIM)
    seg_spec = PartitionSpec(*tuple(q_spec)[:2])
    heads_axis = tuple(q_spec)[2] if len(tuple(q_spec)) > 2 else None
    manual = _axes(q_spec) | _axes(kv_spec) | {MeshAxis.CONTEXT}
    arrays: list[jax.Array] = [q, k, v]
    specs: list[PartitionSpec] = [q_spec, kv_spec, kv_spec]
    if seg is not None:
        arrays.append(seg)
        specs.append(seg_spec)
    if sinks is not None:
        arrays.append(sinks.reshape(n_kv, -1))
        specs.append(PartitionSpec(heads_axis))
    if window is not None:
        arrays.append(jnp.asarray(window, jnp.int32))
        specs.append(PartitionSpec())
    has_seg, has_sinks, has_window = seg is not None, sinks is not None, window is not None

    def local(q: jax.Array, k: jax.Array, v: jax.Array, *rest: jax.Array) -> jax.Array:
        rest_list = list(rest)
        window = rest_list.pop() if has_window else None
        sinks = _vary(rest_list.pop(), q) if has_sinks else None
        seg = rest_list.pop() if has_seg else None
        return attend(q, k, v, seg, sinks, window)

    run = jax.shard_map(local, in_specs=tuple(specs), out_specs=q_spec, axis_names=manual)
    return run(*arrays)
