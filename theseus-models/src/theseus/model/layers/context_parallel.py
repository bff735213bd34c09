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

    def windowed(self, window: Any) -> _Spec:
        """This spec with ``window`` (None: causal only)."""
        spec = _Spec(self.n, self.size, self.scale, self.softcap, self.per_query)
        spec.window = window
        return spec

    def chunks(self, device: Any) -> tuple[Any, Any]:
        """The two chunk numbers ``device`` holds."""
        return device, 2 * self.n - 1 - device

    def index(self, chunk: Any) -> jax.Array:
        """Sequence indices of ``chunk``."""
        return chunk * self.size + jnp.arange(self.size, dtype=jnp.int32)

    def visible(self, query_chunk: Any, key_chunk: Any) -> Any:
        """Whether any query of ``query_chunk`` sees any key of ``key_chunk`` (causal, within the window)."""
        seen = key_chunk <= query_chunk
        if self.window is None:
            return seen
        nearest = (query_chunk - key_chunk) * self.size - (self.size - 1)
        return seen & (nearest < self.window)

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


def _halves(x: jax.Array | None, size: int) -> tuple[Any, Any]:
    if x is None:
        return None, None
    return x[:, :size], x[:, size:]


def _pairs(
    spec: _Spec, q_chunks: tuple, seg_halves: tuple, source: Any, kb: jax.Array, vb: jax.Array, kseg: Any
) -> Any:
    """Yield ``(query half, key half, keys, values, mask, visible)`` for the four pairs of half-chunks of
    this device's queries and the key block of device ``source``."""
    k_chunks = spec.chunks(source)
    halves = zip(_halves(kb, spec.size), _halves(vb, spec.size), _halves(kseg, spec.size), strict=True)
    for half_k, (kh, vh, ksh) in enumerate(halves):
        for half_q in range(2):
            mask = spec.mask(spec.index(q_chunks[half_q]), spec.index(k_chunks[half_k]), seg_halves[half_q], ksh)
            yield half_q, half_k, kh, vh, mask, spec.visible(q_chunks[half_q], k_chunks[half_k])


def _accumulate(spec: _Spec, state: tuple, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> tuple:
    """The online softmax ``(out, max, sum)`` after one more block of keys."""
    out, top, total = state
    s = jnp.where(mask, spec.scores(q, k), _MASKED)
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
    mask: jax.Array,
    lse: jax.Array,
    dout: jax.Array,
    delta: jax.Array,
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """``(dq, dk, dv)`` of one block of grouped queries against one block of keys and values."""
    s = spec.scores(q, k)
    p = jnp.exp(jnp.where(mask, s, _MASKED) - lse[..., None])
    dv = jnp.einsum("bkgts,bkgth->bskh", p, dout)
    dp = jnp.einsum("bkgth,bskh->bkgts", dout, v.astype(jnp.float32))
    ds = p * (dp - delta[..., None])
    if spec.softcap is not None:
        ds = ds * (1.0 - jnp.square(s / spec.softcap))
    ds = ds * spec.scale
    dq = jnp.einsum("bkgts,bskh->btkgh", ds, k.astype(jnp.float32))
    dk = jnp.einsum("bkgts,btkgh->bskh", ds, q.astype(jnp.float32))
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


def _key_blocks(form: str, spec: _Spec, device: Any, arrays: Sequence[jax.Array | None]) -> Any:
    """Yield ``(source device, arrays of its block)`` for every device's key block: gathered
    (``allgather``) or passed round the ring (``ring``, the arrays moved on after each block)."""
    n = spec.n
    if form == "allgather":
        gathered = [None if a is None else jax.lax.all_gather(a, MeshAxis.CONTEXT, axis=1, tiled=True) for a in arrays]
        width = 2 * spec.size
        for source in range(n):
            yield source, [None if a is None else a[:, source * width : (source + 1) * width] for a in gathered]
        return
    ring = [(j, (j + 1) % n) for j in range(n)]
    current = list(arrays)
    for step in range(n):
        yield (device - step) % n, current
        if step < n - 1:
            current = [None if a is None else jax.lax.ppermute(a, MeshAxis.CONTEXT, ring) for a in current]


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
    device = jax.lax.axis_index(MeshAxis.CONTEXT)
    n_kv = k.shape[2]
    grouped = _group(q, n_kv)
    b, _, _, g, d = grouped.shape
    size = spec.size
    q_chunks = spec.chunks(device)
    q_halves = _halves(grouped, size)
    seg_halves = _halves(seg, size)
    init = (
        jnp.zeros((b, n_kv, g, size, d), jnp.float32),
        jnp.full((b, n_kv, g, size), _MASKED, jnp.float32),
        jnp.zeros((b, n_kv, g, size), jnp.float32),
    )
    states = [tuple(_vary(x, q) for x in init) for _ in range(2)]
    for source, (kb, vb, kseg) in _key_blocks(form, spec, device, (k, v, seg)):
        for half_q, _, kh, vh, mask, visible in _pairs(spec, q_chunks, seg_halves, source, kb, vb, kseg):
            step = functools.partial(_accumulate, spec, q=q_halves[half_q], k=kh, v=vh, mask=mask)
            states[half_q] = jax.lax.cond(visible, lambda st, step=step: step(st), lambda st: st, states[half_q])
    finished = [_finish(spec, state, sinks) for state in states]
    out = jnp.concatenate([f[0] for f in finished], axis=3)  # [b, kv, g, 2 size, d]
    lse = jnp.concatenate([f[1] for f in finished], axis=3)
    y = jnp.transpose(out, (0, 3, 1, 2, 4)).reshape(q.shape).astype(q.dtype)
    return y, (q, k, v, seg, sinks, out, lse)


def _local_backward(spec: _Spec, form: str, residuals: tuple, dy: jax.Array) -> tuple:
    q, k, v, seg, sinks, out, lse = residuals
    device = jax.lax.axis_index(MeshAxis.CONTEXT)
    n_kv, size, n = k.shape[2], spec.size, spec.n
    grouped = _group(q, n_kv)
    dout = jnp.transpose(_group(dy, n_kv), (0, 2, 3, 1, 4)).astype(jnp.float32)  # [b, kv, g, T, d]
    delta = jnp.sum(dout * out, axis=-1)
    q_chunks = spec.chunks(device)
    q_halves, seg_halves = _halves(grouped, size), _halves(seg, size)
    dout_halves = (dout[:, :, :, :size], dout[:, :, :, size:])
    lse_halves = (lse[..., :size], lse[..., size:])
    delta_halves = (delta[..., :size], delta[..., size:])
    dq = [_vary(jnp.zeros(h.shape, jnp.float32), q) for h in q_halves]

    def block(kb: jax.Array, vb: jax.Array, kseg: Any, source: Any, dkv: list) -> list:
        for half_q, half_k, kh, vh, mask, visible in _pairs(spec, q_chunks, seg_halves, source, kb, vb, kseg):
            args = (q_halves[half_q], kh, vh, mask, lse_halves[half_q], dout_halves[half_q], delta_halves[half_q])

            def grads(acc: tuple, args: tuple = args) -> tuple:
                gq, gk, gv = _block_grads(spec, *args)
                return acc[0] + gq, acc[1] + gk, acc[2] + gv

            acc = jax.lax.cond(visible, grads, lambda a: a, (dq[half_q], dkv[0][half_k], dkv[1][half_k]))
            dq[half_q], dkv[0][half_k], dkv[1][half_k] = acc
        return dkv

    def zeros_kv() -> list:
        return [
            [_vary(jnp.zeros((*kh.shape[:-1], kh.shape[-1]), jnp.float32), q) for kh in _halves(x, size)]
            for x in (k, v)
        ]

    if form == "allgather":
        blocks = []
        for source, (kb, vb, kseg) in _key_blocks(form, spec, device, (k, v, seg)):
            dkv = block(kb, vb, kseg, source, zeros_kv())
            blocks.append([jnp.concatenate(halves, axis=1) for halves in dkv])
        dk_all = jnp.concatenate([blk[0] for blk in blocks], axis=1)
        dv_all = jnp.concatenate([blk[1] for blk in blocks], axis=1)
        dk = jax.lax.psum_scatter(dk_all, MeshAxis.CONTEXT, scatter_dimension=1, tiled=True)
        dv = jax.lax.psum_scatter(dv_all, MeshAxis.CONTEXT, scatter_dimension=1, tiled=True)
    else:
        ring = [(j, (j + 1) % n) for j in range(n)]
        kb, vb, kseg = k, v, seg
        dkv = zeros_kv()
        for step in range(n):
            dkv = block(kb, vb, kseg, (device - step) % n, dkv)
            flat = [jnp.concatenate(halves, axis=1) for halves in dkv]
            flat = [jax.lax.ppermute(x, MeshAxis.CONTEXT, ring) for x in flat]  # after n moves: home again
            dkv = [list(_halves(x, size)) for x in flat]
            if step < n - 1:
                kb, vb = (jax.lax.ppermute(x, MeshAxis.CONTEXT, ring) for x in (kb, vb))
                kseg = None if kseg is None else jax.lax.ppermute(kseg, MeshAxis.CONTEXT, ring)
        dk, dv = (jnp.concatenate(halves, axis=1) for halves in dkv)
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


def _spec_of(shape: tuple[int, ...], *logical: str) -> PartitionSpec:
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
    q_spec = _spec_of(q.shape, Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM)
    kv_spec = _spec_of(k.shape, Axis.BATCH, Axis.SEQUENCE, Axis.KV_HEADS, Axis.HEAD_DIM)
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
