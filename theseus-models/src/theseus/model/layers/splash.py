"""Splash attention: the Pallas flash-attention kernel for TPUs that ships with jax.

It never forms the ``[T, S]`` score matrix: it walks blocks of queries and keys, skips the blocks the
mask hides entirely (the upper triangle of a causal mask, everything outside a sliding window or a
chunk) and keeps a float32 online softmax. Its memory is linear in the sequence, where XLA's
attention on a TPU materialises the scores and their gradient (8.6 GB at 4k tokens, 16 heads).

:func:`splash_attention` takes the layout the attention layers use, ``q`` ``[B, T, heads, head_dim]``
and ``k``/``v`` ``[B, S, kv_heads, head_dim]`` (grouped heads are read in place, never repeated), and
covers every mask the families use: causal, a sliding ``window``, Llama 4's ``chunk``, a key padding
mask or packed rows' segment ids, Gemma 2's logit ``softcap`` and GPT-OSS's ``sinks``. Under a mesh it
runs per device inside ``shard_map`` over the axes that split the batch and the heads. Away from a TPU
the kernel runs in Pallas' interpret mode (how the tests check it against XLA on a CPU).

:func:`unsupported` says in one line why a call cannot use the kernel (the caller then falls back to
XLA attention and prints that line once: :func:`notice_fallback`).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from theseus.base.accelerator import accelerator
from theseus.base.axis import Axis
from theseus.model.layers.context_parallel import spec_of

#: Queries and keys per kernel block (forward and backward), a power of two. Sequences are padded to a
#: multiple of :data:`MIN_BLOCK`; a block is the largest power of two up to this that divides the padded
#: sequence. On a v5e, 16 heads of 64, forward and backward of 16k tokens: blocks of 1024 took 9.3 ms at
#: T=2048 and 20.9 ms at 8192, of 512 9.8 and 24.7 ms, of 256 16.6 and 52.1 ms (benchmarks/tpu_attention.py).
BLOCK = 1024
#: One backward kernel computing dq beside dk and dv (one pass over the blocks instead of two).
FUSED_BACKWARD = True
MIN_BLOCK = 128
#: The name of the kernel's residuals (its output and log-sum-exp): a remat policy that saves it keeps
#: the backward pass from running the forward kernel again (``model/remat=dots`` does).
RESIDUALS = "splash_residuals"

_NOTICED: set[str] = set()


def unsupported(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    is_causal: bool,
    *,
    window: int | jax.Array | None = None,
    chunk: int | None = None,
    packed: bool = False,
) -> str | None:
    """Why splash attention cannot take this call (None: it can). ``mask`` is a further dense mask beside
    the padding: splash takes key padding and segment ids separately (:func:`splash_attention`), so a
    caller passes here only a mask it could not express otherwise. ``window`` must be a Python int, and
    ``chunk`` counts from each row's first slot, so it cannot apply to ``packed`` rows (segment ids)."""
    if not is_causal:
        return "non-causal attention"
    if mask is not None:
        return "a mask per query beyond padding and packed rows (Llama 4's chunks chosen per layer at run time)"
    if k.shape[1] != q.shape[1]:
        return "queries and keys of different lengths"
    if q.shape[-1] != v.shape[-1] or k.shape[-1] != q.shape[-1]:
        return "query, key and value heads of different widths"
    if q.shape[2] % k.shape[2]:
        return "query heads that are not a multiple of the key heads"
    if jax.sharding.get_abstract_mesh().manual_axes:  # a Pallas call carries no per-axis variance there
        return "attention inside a pipeline stage"
    if isinstance(window, jax.Array):
        return "a window chosen per layer at run time"
    if chunk is not None and packed:
        return "chunked attention over packed rows"
    return None


def notice_fallback(reason: str) -> None:
    """Print once per process and reason that attention falls back to XLA's, and why."""
    if reason in _NOTICED:
        return
    _NOTICED.add(reason)
    print(f"notice: splash attention does not take {reason}; this layer uses XLA attention", file=sys.stderr)


def splash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    padding_mask: jax.Array | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Causal grouped-query attention ``[B, T, heads, head_dim]`` by the splash kernel.

    ``padding_mask``: bool ``[B, T]`` (True = real token, anywhere in the row) or int segment
    ids (0 = padding, ``k > 0`` = the k-th example packed into the row). ``window``: a query sees itself
    and the ``window - 1`` keys before it; ``chunk``: only keys of its own chunk of ``chunk`` positions
    (Llama 4's local layers). ``scale`` multiplies the scores (default ``head_dim ** -0.5``), ``softcap``
    caps them as ``tanh(s / c) * c``; ``sinks`` ``[heads]`` join each row's softmax. Positions that are
    padding get some output the loss never reads. ``interpret`` (default: off a TPU) runs the kernel in
    Pallas' interpreter."""
    batch, steps, n_heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else float(scale)
    padded = -(-steps // MIN_BLOCK) * MIN_BLOCK
    segments = _segments(padding_mask, batch, steps)
    q = (q.astype(jnp.float32) * scale).astype(q.dtype)
    if padded != steps:  # padding at the end: causal masking keeps real queries off it
        q, k, v = (_pad_time(x, padded) for x in (q, k, v))
        segments = None if segments is None else _pad_time(segments, padded)
    run_interpreted = accelerator().platform != "tpu" if interpret is None else interpret
    key = _KernelKey(padded, n_heads, k.shape[2], window, chunk, softcap, run_interpreted)
    out = _sharded(key, q, k, v, segments, sinks)
    return out[:, :steps]


def _segments(padding_mask: jax.Array | None, batch: int, steps: int) -> jax.Array | None:
    """Int32 segment ids ``[B, T]`` of a padding mask (real tokens 1, padding 0) or of packed rows."""
    if padding_mask is None:
        return None
    ids = jnp.asarray(padding_mask)
    return jnp.broadcast_to(ids.astype(jnp.int32), (batch, steps))


def _pad_time(x: jax.Array, length: int) -> jax.Array:
    widths = [(0, 0)] * x.ndim
    widths[1] = (0, length - x.shape[1])
    return jnp.pad(x, widths)


@functools.cache
def _mask(steps: int, window: int | None, chunk: int | None) -> Any:
    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks

    shape = (steps, steps)
    if chunk is not None:
        return masks.ChunkedCausalMask(shape, chunk_size=chunk)
    if window is not None:
        return masks.LocalMask(shape, window_size=(window - 1, 0), offset=0)
    return masks.CausalMask(shape)


class _KernelKey(tuple):  # type: ignore[type-arg]
    """What a kernel depends on: (steps, heads, kv heads, window, chunk, softcap, interpret)."""

    def __new__(cls, *fields: Any) -> _KernelKey:
        return super().__new__(cls, fields)


def _kernel(key: _KernelKey, local_heads: int) -> Any:
    """The splash kernel of ``key`` for ``local_heads`` query heads (a device's share of them)."""
    from jax.experimental.pallas.ops.tpu import splash_attention as splash

    steps, _, _, window, chunk, softcap, interpret = key
    block = math.gcd(steps, BLOCK)  # blocks must divide the (padded) sequence: 1536 tokens run in blocks of 512
    sizes = splash.BlockSizes(
        block_q=block,
        block_kv=block,
        block_kv_compute=block,
        block_q_dkv=block,
        block_kv_dkv=block,
        block_kv_dkv_compute=block,
        **({"use_fused_bwd_kernel": True} if FUSED_BACKWARD else {"block_q_dq": block, "block_kv_dq": block}),
    )
    mask = splash.MultiHeadMask([_mask(steps, window, chunk)] * local_heads)
    # made in each trace: its block tables become constants of that program (a kernel kept from an earlier
    # trace would hold that trace's values)
    return splash.make_splash_mha(
        mask,
        block_sizes=sizes,
        head_shards=1,
        q_seq_shards=1,
        attn_logits_soft_cap=softcap,
        residual_checkpoint_name=RESIDUALS,
        interpret=interpret,
    )


def _local(
    key: _KernelKey, q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None, sinks: jax.Array | None
) -> jax.Array:
    """One device's attention: the kernel mapped over its rows, heads-major inside."""
    from jax.experimental.pallas.ops.tpu.splash_attention import SegmentIds

    kernel = _kernel(key, q.shape[2])
    qh, kh, vh = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))  # [B, heads, T, head_dim]
    sink = None if sinks is None else sinks.astype(jnp.float32)

    def row(qr: jax.Array, kr: jax.Array, vr: jax.Array, seg: jax.Array | None) -> jax.Array:
        ids = None if seg is None else SegmentIds(q=seg, kv=seg)
        return kernel(qr, kr, vr, segment_ids=ids, sinks=sink)

    if segments is None:
        out = jax.vmap(lambda a, b, c: row(a, b, c, None))(qh, kh, vh)
    else:
        out = jax.vmap(row)(qh, kh, vh, segments)
    return jnp.swapaxes(out, 1, 2)


def _sharded(
    key: _KernelKey, q: jax.Array, k: jax.Array, v: jax.Array, segments: jax.Array | None, sinks: jax.Array | None
) -> jax.Array:
    """:func:`_local` on each device's rows and heads (``shard_map`` over the axes the current rules put
    on the batch and the heads), or directly without a mesh. Key heads that the mesh cannot split as
    it splits the query heads are repeated to one per query head first."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return _local(key, q, k, v, segments, sinks)
    q_spec = spec_of(q.shape, Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM)
    q_spec = PartitionSpec(*tuple(q_spec)[:1], None, *tuple(q_spec)[2:3], None)  # the kernel needs whole rows
    kv_spec = spec_of(k.shape, Axis.BATCH, Axis.SEQUENCE, Axis.KV_HEADS, Axis.HEAD_DIM)
    kv_spec = PartitionSpec(*tuple(q_spec)[:1], None, *tuple(kv_spec)[2:3], None)
    heads_axis = _entry(q_spec, 2)
    if heads_axis != _entry(kv_spec, 2):
        group = q.shape[2] // k.shape[2]
        k, v = (jnp.repeat(x, group, axis=2) for x in (k, v))
        kv_spec = q_spec
        key = _KernelKey(*key[:2], q.shape[2], *key[3:])
    manual = set(mesh.axis_names)  # a Mosaic kernel is never partitioned by XLA
    arrays: list[jax.Array] = [q, k, v]
    specs: list[PartitionSpec] = [q_spec, kv_spec, kv_spec]
    if segments is not None:
        arrays.append(segments)
        specs.append(PartitionSpec(_entry(q_spec, 0), None))
    if sinks is not None:
        arrays.append(sinks)
        specs.append(PartitionSpec(heads_axis))
    has_segments, has_sinks = segments is not None, sinks is not None

    def local(q: jax.Array, k: jax.Array, v: jax.Array, *rest: jax.Array) -> jax.Array:
        extra = list(rest)
        local_sinks = extra.pop() if has_sinks else None
        local_segments = extra.pop() if has_segments else None
        return _local(key, q, k, v, local_segments, local_sinks)

    run = jax.shard_map(local, in_specs=tuple(specs), out_specs=q_spec, axis_names=manual, check_vma=False)
    return run(*arrays)


def _entry(spec: PartitionSpec, index: int) -> Any:
    entries = tuple(spec)
    return entries[index] if index < len(entries) else None


__all__ = ["BLOCK", "MIN_BLOCK", "notice_fallback", "splash_attention", "unsupported"]
