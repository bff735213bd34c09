"""``CausalSelfAttention``: multi-head / grouped-query causal attention with padding masks and a KV cache."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.accelerator import accelerator
from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers import lora, quantization
from theseus.model.layers._common import (
    INIT_STD,
    architecture_field,
    cast,
    child,
    constrain,
    layer_width,
    normal,
    param,
    require,
)
from theseus.model.layers.cache_view import cached_layer, visible_slots
from theseus.model.layers.context_parallel import context_parallel_attention, context_size, refuse
from theseus.model.layers.layer_call import LayerCall, StackLayer
from theseus.model.layers.matmul import project
from theseus.model.layers.norms import RMSNorm
from theseus.model.layers.rotary import PositionSpec, RotaryEmbedding, rotate
from theseus.model.layers.splash import notice_fallback, splash_attention, unsupported

ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")

#: The entries of a per-layer ``layer_types`` list (transformers' names).
SLIDING_ATTENTION, FULL_ATTENTION = "sliding_attention", "full_attention"
#: Llama 4's local layers (RoPE, attention within a chunk): only its own attention reads them.
CHUNKED_ATTENTION = "chunked_attention"
#: Qwen3-Next's Gated DeltaNet layers (no attention at all): only its own blocks read them.
LINEAR_ATTENTION = "linear_attention"
#: ``AttentionSpec.qk_norm_span`` values: a norm per head, or one over the whole projection (OLMo 2).
QK_NORM_SPANS = ("head", "projection")


@dataclass(frozen=True)
class AttentionSpec:
    """The grouped-query attention of every layer (the keys ``architecture/*`` of each field).

    ``n_kv_heads`` (None: ``n_heads``) must divide ``n_heads``; ``head_dim`` (None: ``n_embd /
    n_heads``) may differ from the width divided by the heads. ``qkv_bias`` / ``out_bias`` (None: as
    ``qkv_bias``): biases of the query/key/value and output projections. ``qk_norm``: RMSNorm
    (epsilon ``norm_eps``, ``1 + scale`` when ``qk_norm_zero_centred``) of each head's query and key
    before RoPE, or of the whole projections with ``qk_norm_span="projection"``.
    ``query_pre_attn_scalar``: scores scaled by its ``** -0.5`` instead of ``head_dim ** -0.5``;
    ``softcap``: scores capped as ``tanh(s / c) * c``; ``sliding_window``: a token attends to itself
    and the ``sliding_window - 1`` tokens before it; ``implementation``: auto | xla | cudnn | splash.
    """

    n_heads: int
    n_kv_heads: int | None = None
    head_dim: int | None = None
    qkv_bias: bool = True
    out_bias: bool | None = None
    qk_norm: bool = False
    qk_norm_span: str = "head"
    qk_norm_zero_centred: bool = False
    norm_eps: float = 1e-6
    query_pre_attn_scalar: float | None = None
    softcap: float | None = None
    sliding_window: int | None = None
    implementation: str = "auto"

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def has_out_bias(self) -> bool:
        return self.qkv_bias if self.out_bias is None else self.out_bias

    def width(self, n_embd: int) -> int:
        """Each head's width in a model of width ``n_embd``."""
        return n_embd // self.n_heads if self.head_dim is None else self.head_dim

    def score_scale(self) -> float | None:
        """What the scores are multiplied by (None: ``head_dim ** -0.5``)."""
        return None if self.query_pre_attn_scalar is None else float(self.query_pre_attn_scalar) ** -0.5

    def validate(self, n_embd: int, block_size: int) -> AttentionSpec:
        """Checks the heads against the width ``n_embd``, the window against ``block_size``."""
        for key, value in (("n_heads", self.n_heads), ("n_kv_heads", self.kv_heads)):
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"architecture/{key} must be a positive integer, got {value!r}")
        self._validate_heads(n_embd)
        self._validate_window(block_size)
        if self.qk_norm_span not in QK_NORM_SPANS:
            raise ConfigError(f"qk_norm_span {self.qk_norm_span!r}: use 'head' or 'projection'")
        for key, scalar in (("query_pre_attn_scalar", self.query_pre_attn_scalar), ("attn_softcap", self.softcap)):
            if scalar is not None and not scalar > 0:
                raise ConfigError(f"architecture/{key} must be positive or null, got {scalar!r}")
        if self.implementation not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(
                f"unknown architecture/attention_impl {self.implementation!r}; "
                f"choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
            )
        return self

    def _validate_heads(self, n_embd: int) -> None:
        if self.head_dim is not None and (not isinstance(self.head_dim, int) or self.head_dim < 1):
            raise ConfigError(f"architecture/head_dim must be a positive integer, got {self.head_dim!r}")
        if self.head_dim is None and n_embd % self.n_heads:
            raise ConfigError(
                f"architecture/n_embd={n_embd} is not divisible by architecture/n_heads={self.n_heads}; "
                "change one of them, or set architecture/head_dim"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"architecture/n_kv_heads={self.kv_heads} must divide architecture/n_heads={self.n_heads}"
            )

    def _validate_window(self, block_size: int) -> None:
        window = self.sliding_window
        if window is not None and (not isinstance(window, int) or window < 1):
            raise ConfigError(f"architecture/sliding_window must be a positive integer or null, got {window!r}")
        if window is not None and window > block_size:
            raise ConfigError(
                f"architecture/sliding_window={window} is longer than architecture/block_size={block_size}, "
                "so it never limits attention; "
                "set architecture/sliding_window=null (full attention) or a window up to the block size"
            )


def attention_mask(padding_mask: jax.Array | None) -> jax.Array | None:
    """The attention mask of a ``[B, S]`` padding mask or segment ids.

    A bool mask (True = real token) gives a ``[B, 1, 1, S]`` key mask. Integer segment ids
    (0 = padding, ``k > 0`` = the k-th example packed into the row) give a ``[B, 1, S, S]`` mask
    in which a token attends only to tokens of its own example, so attention never crosses an
    example boundary.
    """
    if padding_mask is None:
        return None
    if not is_segment_ids(padding_mask):
        return padding_mask.astype(jnp.bool_)[:, None, None, :]
    ids = jnp.asarray(padding_mask)
    same = ids[:, :, None] == ids[:, None, :]
    return (same & (ids[:, None, :] > 0))[:, None, :, :]


def is_segment_ids(padding_mask: jax.Array) -> bool:
    """Whether a padding mask holds integer segment ids (packed examples) rather than booleans."""
    return bool(jnp.issubdtype(jnp.asarray(padding_mask).dtype, jnp.integer))


def missing_cache_error() -> ConfigError:
    return ConfigError(
        "decode=True needs a KV cache: create it with theseus.model.models.init_cache(model, batch, max_len) "
        "and pass it in the 'cache' collection with mutable=['cache']"
    )


#: The widest head cuDNN's fused attention takes everywhere. Hopper allows 256, but jax checks that
#: against the host's backend, so a program compiled without the GPU would refuse it.
CUDNN_MAX_HEAD_DIM = 128


def _cudnn_eligible(q: jax.Array, v: jax.Array) -> bool:
    """Whether cuDNN's fused attention takes this call: an NVIDIA GPU target (the mesh's devices), half
    precision, equal query and value widths (not MLA's) that are a multiple of 8 up to 128, and not inside
    ``shard_map`` (the pipeline's stages): its partitioning rule needs the mesh's devices, which a manual
    region under an abstract mesh does not have."""
    head_dim = q.shape[-1]
    return (
        accelerator().platform == "gpu"
        and not jax.sharding.get_abstract_mesh().manual_axes
        and q.dtype in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0
        and head_dim <= CUDNN_MAX_HEAD_DIM
        and v.shape[-1] == head_dim
    )


def _cudnn_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    *,
    is_causal: bool,
    window: int | None,
    scale: float | None,
) -> jax.Array:
    """cuDNN's fused attention. A key padding mask (``[B, 1, 1, S]``) of causal self-attention is passed
    as sequence lengths, not as a dense ``[B, 1, T, S]`` bias: rows hold their real tokens first (as
    every theseus batch does), so the real queries see exactly the keys they would under the mask."""
    lengths = None
    if mask is not None and is_causal and mask.shape[-2] == 1:
        lengths = jnp.sum(jnp.broadcast_to(mask, (q.shape[0], 1, 1, k.shape[1]))[:, 0, 0, :], axis=-1, dtype=jnp.int32)
        mask = None
    elif mask is not None:  # a mask per query (packed rows): cuDNN takes it as a bias
        mask = jnp.broadcast_to(mask, (q.shape[0], 1, q.shape[1], k.shape[1]))
    return jax.nn.dot_product_attention(
        q,
        k,
        v,
        mask=mask,
        scale=scale,
        is_causal=is_causal,
        query_seq_lengths=lengths,
        key_value_seq_lengths=lengths,
        local_window_size=(window - 1, 0) if window is not None else None,
        implementation="cudnn",
    )


def window_mask(query_index: jax.Array, key_index: jax.Array, window: int | jax.Array | None) -> jax.Array:
    """``[T, S]`` bool: query ``t`` (at sequence index ``query_index[t]``) may attend to key ``s``:
    the key is not later and, with a ``window``, fewer than ``window`` places earlier (a token sees
    itself and the ``window - 1`` tokens before it, as Mistral's and transformers' windows do).
    ``window`` may be a traced scalar (a window chosen per layer inside a scan)."""
    causal = key_index[None, :] <= query_index[:, None]
    if window is None:
        return causal
    return causal & (query_index[:, None] - key_index[None, :] < window)


#: Causal attention over longer sequences is split into query blocks that skip the fully masked
#: part of the score matrix; blocks are at least this long.
MIN_CAUSAL_BLOCK = 128
MAX_CAUSAL_BLOCKS = 16

#: The window of a full-attention layer when windows are chosen per layer at run time (never binds).
NO_WINDOW = 2**30


def softcapped_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention with the scores capped as ``tanh(s / softcap) * softcap`` (after the
    ``scale``, before the mask, as Gemma 2 does) and ``sinks`` joining each row's softmax
    (:func:`attention_probabilities`); without either it is ``jax.nn.dot_product_attention``.
    ``mask``: bool broadcastable to ``[B, 1, T, S]``."""
    if softcap is None and sinks is None:
        return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, implementation="xla")
    batch, steps, n_heads, head_dim = q.shape
    n_kv = k.shape[2]
    grouped = q.reshape(batch, steps, n_kv, n_heads // n_kv, head_dim)
    scores = jnp.einsum("btkgh,bskh->bkgts", grouped, k, preferred_element_type=jnp.float32)
    probs = attention_probabilities(scores, mask, head_dim**-0.5 if scale is None else scale, softcap, sinks)
    out = jnp.einsum("bkgts,bskh->btkgh", probs.astype(v.dtype), v)
    return out.reshape(batch, steps, n_heads, head_dim)


def attention_probabilities(
    scores: jax.Array,
    mask: jax.Array | None,
    scale: float,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """The float32 softmax of grouped ``scores`` ``[B, kv_heads, group, T, S]``: scaled, capped
    (``softcap``), masked (``mask`` bool broadcastable to ``[B, 1, T, S]``), and with ``sinks``
    ``[heads]`` (a logit per head that joins each row's softmax, taking a share of the probability
    but adding no value: GPT-OSS)."""
    scores = scores * scale
    if softcap is not None:
        scores = jnp.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = jnp.where(mask[:, :, None], scores, jnp.finfo(jnp.float32).min)
    if sinks is None:
        return jax.nn.softmax(scores, axis=-1)
    sink = sinks.astype(jnp.float32).reshape(1, scores.shape[1], scores.shape[2], 1, 1)
    sink = jnp.broadcast_to(sink, (*scores.shape[:-1], 1))
    return jax.nn.softmax(jnp.concatenate([scores, sink], axis=-1), axis=-1)[..., :-1]


def blocked_causal_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    key_mask: jax.Array | None,
    block: int,
    window: int | jax.Array | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Causal attention computed per block of ``block`` queries against only the keys the block can
    see: up to the block's end, and with a ``window`` from ``window - 1`` places before its start, so
    the score matrix outside the diagonal band is never formed (about half of it for long sequences,
    all but ``window + block`` columns per block with a window). ``key_mask``: bool ``[B, S]``
    (True = real key), ``[B, 1, T, S]`` (a mask per query, as packed rows have), or None. A traced
    ``window`` (chosen per layer at run time) is masked but cannot skip keys."""
    steps = q.shape[1]
    outputs = []
    for start in range(0, steps, block):
        end = min(start + block, steps)
        first = max(0, start - window + 1) if isinstance(window, int) else 0
        allowed = window_mask(jnp.arange(start, end), jnp.arange(first, end), window)  # [block, end - first]
        mask = allowed[None, None]
        if key_mask is not None and key_mask.ndim == 4:  # [B, 1, T, S]: per-query masks (packed rows)
            mask = mask & key_mask[:, :, start:end, first:end]
        elif key_mask is not None:
            mask = mask & key_mask[:, None, None, first:end]
        keys, values = k[:, first:end], v[:, first:end]
        outputs.append(softcapped_attention(q[:, start:end], keys, values, mask, scale, softcap, sinks))
    return jnp.concatenate(outputs, axis=1)


def attention_backend(implementation: str, q: jax.Array, v: jax.Array) -> str:
    """The kernel ``implementation`` resolves to for these heads: ``splash`` (Pallas, TPUs), ``cudnn``
    (NVIDIA GPUs) or ``xla``. ``auto`` picks by the accelerator the program targets (the mesh's devices):
    splash on TPUs, cuDNN where eligible (:func:`_cudnn_eligible`), XLA elsewhere."""
    if implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError(
            f"unknown architecture/attention_impl {implementation!r}; "
            f"choose one of {', '.join(ATTENTION_IMPLEMENTATIONS)}"
        )
    if implementation == "splash" and accelerator().platform == "gpu":
        raise ConfigError(
            "architecture/attention_impl=splash is the TPU kernel (interpreted elsewhere, for tests); "
            "on GPUs use auto or cudnn"
        )
    if implementation != "auto":
        return implementation
    if accelerator().platform == "tpu":
        return "splash"
    return "cudnn" if _cudnn_eligible(q, v) else "xla"


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | None,
    is_causal: bool,
    implementation: str = "auto",
    window: int | jax.Array | None = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
    padding_mask: jax.Array | None = None,
    chunk: int | None = None,
) -> jax.Array:
    """Grouped-query attention ``[B, T, heads, head_dim]`` of ``q`` and ``k``/``v`` ``[B, S, kv_heads, head_dim]``
    with a backend choice (:func:`attention_backend`).

    ``padding_mask``: the rows' bool ``[B, S]`` padding mask (True = real token) or int segment ids of
    packed rows (:func:`attention_mask`); ``mask``: any further bool mask, broadcastable to ``[B, 1, T, S]``.
    ``window`` (causal self-attention only): each query sees itself and the ``window - 1`` keys before
    it (:func:`window_mask`); ``chunk``: only the keys of its own chunk of ``chunk`` positions (Llama 4's
    local layers). ``scale`` multiplies the scores (default ``head_dim ** -0.5``); ``softcap`` caps them
    (:func:`softcapped_attention`); ``sinks`` ``[heads]`` join each row's softmax.

    ``"splash"`` is the Pallas flash kernel for TPUs (:mod:`~theseus.model.layers.splash`; interpreted
    elsewhere, which is slow and meant for tests): every mask above, memory linear in the sequence. A call
    it cannot take (a further ``mask``, a traced ``window``, different head widths) says so in one line on
    stderr and uses XLA. ``"cudnn"`` is the fused flash kernel on NVIDIA GPUs (bf16/f16; no softcap, sinks
    or traced window); ``auto`` falls back to XLA if cuDNN rejects the call while tracing. A key padding
    mask reaches cuDNN as sequence lengths (:func:`_cudnn_attention`). ``"xla"`` works everywhere; causal
    sequences of 256 or more are computed in query blocks (:func:`blocked_causal_attention`), which skip
    the keys outside a window.
    """
    if window is not None and not is_causal:
        raise ValueError("a sliding window applies to causal self-attention only")
    backend = attention_backend(implementation, q, v)
    if backend == "splash":
        packed = padding_mask is not None and is_segment_ids(padding_mask)
        reason = unsupported(q, k, v, mask, is_causal, window=window, chunk=chunk, packed=packed)
        if reason is None:
            fixed_window = window if isinstance(window, int) else None
            return splash_attention(
                q, k, v, padding_mask, window=fixed_window, chunk=chunk, scale=scale, softcap=softcap, sinks=sinks
            )
        notice_fallback(reason)
    if chunk is not None:
        mask = _and(mask, _chunk_mask(q.shape[0], k.shape[1], chunk))
    mask = _and(mask, attention_mask(padding_mask))
    fusable = softcap is None and sinks is None and (window is None or isinstance(window, int))
    if backend == "cudnn" and fusable:
        try:
            fixed_window = window if isinstance(window, int) else None
            return _cudnn_attention(q, k, v, mask, is_causal=is_causal, window=fixed_window, scale=scale)
        except Exception:
            if implementation == "cudnn":
                raise
    return _xla_attention(q, k, v, mask, is_causal, window, scale, softcap, sinks)


def _and(mask: jax.Array | None, other: jax.Array | None) -> jax.Array | None:
    if mask is None or other is None:
        return other if mask is None else mask
    return mask & other


def _chunk_mask(batch: int, steps: int, chunk: int) -> jax.Array:
    """``[B, 1, T, T]``: query and key lie in one chunk of ``chunk`` positions."""
    blocks = jnp.arange(steps) // chunk
    return jnp.broadcast_to((blocks[:, None] == blocks[None, :])[None, None], (batch, 1, steps, steps))


def _xla_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    mask: jax.Array | None,
    is_causal: bool,
    window: int | jax.Array | None,
    scale: float | None,
    softcap: float | None,
    sinks: jax.Array | None,
) -> jax.Array:
    """XLA's attention: long causal sequences in query blocks (:func:`blocked_causal_attention`), caps and
    sinks through :func:`softcapped_attention`, else ``jax.nn.dot_product_attention``."""
    steps = q.shape[1]
    if is_causal and steps >= 2 * MIN_CAUSAL_BLOCK and k.shape[1] == steps:
        block = max(MIN_CAUSAL_BLOCK, -(-steps // MAX_CAUSAL_BLOCKS))
        if mask is None:
            key_mask = None
        elif mask.shape[-2] == 1:
            key_mask = jnp.broadcast_to(mask, (q.shape[0], 1, 1, steps))[:, 0, 0, :]
        else:
            key_mask = jnp.broadcast_to(mask, (q.shape[0], 1, steps, steps))
        return blocked_causal_attention(q, k, v, key_mask, block, window, scale, softcap, sinks)
    if window is not None or ((softcap is not None or sinks is not None) and is_causal):
        allowed = window_mask(jnp.arange(steps), jnp.arange(k.shape[1]), window)[None, None]
        mask = allowed if mask is None else mask & allowed
        return softcapped_attention(q, k, v, mask, scale, softcap, sinks)
    if softcap is not None or sinks is not None:
        return softcapped_attention(q, k, v, mask, scale, softcap, sinks)
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale, is_causal=is_causal, implementation="xla")


def heads_major(x: jax.Array, dtype: jnp.dtype | None = None) -> jax.Array:
    """``[B, T, heads, head_dim]`` as the KV cache holds it: ``[B, heads, T, head_dim]`` (in ``dtype``)."""
    x = jnp.swapaxes(x, 1, 2)
    return x if dtype is None else x.astype(dtype)


def append_to_cache(
    module: nn.Module,
    entries: Mapping[str, jax.Array],
    padding_mask: jax.Array | None,
    *,
    time_axis: int,
    dtype: jnp.dtype | None = None,
    size: int | None = None,
    window: int | jax.Array | None = None,
) -> tuple[jax.Array, ...] | None:
    """Write one step's ``entries`` into ``module``'s ``cache`` collection at its ``index``.

    Each entry is laid out as the cache holds it, ``[B, ...]`` with the step's ``T`` positions on
    ``time_axis``; the cache also keeps the padding ``mask`` ``[B, L]`` and the write ``index``.
    Returns each whole cached entry and the mask ``[B, 1, T, L]`` of the slots each query sees
    (causal, within ``window``), or None while the cache is being created: then each entry gets
    ``size`` slots (default ``T``) in ``dtype`` (default its own). Traced inside
    :func:`~theseus.model.layers.cache_view.cache_view`, entries and mask cover only the view's slots; inside
    :func:`~theseus.model.layers.cache_view.cache_layer`, the cache holds every layer's ``[n_layers, ...]``
    (``index`` ``[n_layers]``) and the step writes and reads its layer's entry.
    """
    first = next(iter(entries.values()))
    batch, steps = first.shape[0], first.shape[time_axis]
    exists = module.has_variable("cache", next(iter(entries)))
    if not exists and not module.is_initializing():
        raise missing_cache_error()
    length = steps if size is None else size
    cached = [
        module.variable(
            "cache",
            name,
            jnp.zeros,
            (*new.shape[:time_axis], length, *new.shape[time_axis + 1 :]),
            new.dtype if dtype is None else dtype,
        )
        for name, new in entries.items()
    ]
    cached_mask = module.variable("cache", "mask", jnp.zeros, (batch, length), jnp.bool_)
    index = module.variable("cache", "index", lambda: jnp.zeros((), jnp.int32))
    if not exists:
        return None
    layer = cached_layer()  # None: this layer's own cache; else entry `layer` of every layer's, stacked
    lead: tuple[jax.Array, ...] = () if layer is None else (layer,)

    def write(variable: Any, new: jax.Array, at: tuple[Any, ...]) -> None:
        new = new.astype(variable.value.dtype)
        variable.value = jax.lax.dynamic_update_slice(variable.value, new if layer is None else new[None], lead + at)

    slots = cached[0].value.shape[len(lead) + time_axis]
    view = visible_slots()
    view = slots if view is None else min(view, slots)  # the decoder's bound on what is filled: read only those

    def read(variable: Any, axis: int) -> jax.Array:
        if layer is None:
            return variable.value if view == slots else jax.lax.slice_in_dim(variable.value, 0, view, axis=axis)
        size = (1, *variable.value.shape[1:])
        size = tuple(view if i == axis + 1 else n for i, n in enumerate(size))
        return jax.lax.dynamic_slice(variable.value, (layer,) + (0,) * (len(size) - 1), size)[0]

    start = index.value if layer is None else index.value[layer]
    for variable, new in zip(cached, entries.values(), strict=True):
        write(variable, new, tuple(start if axis == time_axis else 0 for axis in range(new.ndim)))
    step_mask = jnp.ones((batch, steps), jnp.bool_) if padding_mask is None else padding_mask.astype(jnp.bool_)
    write(cached_mask, step_mask, (0, start))
    if layer is None:
        index.value = start + steps
    else:
        write(index, start + steps, ())
    held, held_mask, slots = [read(variable, time_axis) for variable in cached], read(cached_mask, 1), view
    visible = window_mask(start + jnp.arange(steps, dtype=jnp.int32), jnp.arange(slots, dtype=jnp.int32), window)
    mask = visible[None, None, :, :] & held_mask[:, None, None, :]  # [B, 1, T, L]
    return (*held, mask)


def cached_attention(
    q: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mask: jax.Array | None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: jax.Array | None = None,
) -> jax.Array:
    """Grouped-query attention of ``q`` ``[B, T, heads, head_dim]`` to a KV cache held heads-major,
    ``keys``/``values`` ``[B, kv_heads, S, head_dim]``; ``mask`` bool broadcastable to ``[B, 1, T, S]``.

    Both products read the cache in place. With the cache held ``[B, S, kv_heads, head_dim]`` XLA
    transposed all of it into a copy for each product, each layer and each generated token, which made
    decoding on CPU memory-bound (``benchmarks/rollout.py``). A group's queries (its heads at each step)
    are the rows of one plain matrix product per key/value head: written as a grouped einsum, XLA's CPU
    backend put the slots before the group in the scores and decoded a 4-query / 2-key-head Llama 1.36x
    slower. Scores are float32; ``scale`` and
    ``softcap`` as in :func:`softcapped_attention`. ``sinks`` ``[heads]``: a logit per head that joins
    each row's softmax, taking a share of the probability but adding no value (GPT-OSS).
    """
    batch, steps, n_heads, head_dim = q.shape
    n_kv, slots = keys.shape[1], keys.shape[2]
    group = n_heads // n_kv
    # a group's queries (heads x steps) as the rows of one matrix product per key/value head
    rows = q.reshape(batch, steps, n_kv, group, head_dim).transpose(0, 2, 3, 1, 4)
    rows = rows.reshape(batch, n_kv, group * steps, head_dim)
    scores = jnp.einsum("bkqh,bksh->bkqs", rows, keys, preferred_element_type=jnp.float32)
    scores = scores.reshape(batch, n_kv, group, steps, slots)
    probs = attention_probabilities(scores, mask, head_dim**-0.5 if scale is None else scale, softcap, sinks)
    probs = probs.astype(values.dtype).reshape(batch, n_kv, group * steps, slots)
    out = jnp.einsum("bkqs,bksh->bkqh", probs, values).reshape(batch, n_kv, group, steps, head_dim)
    return out.transpose(0, 3, 1, 2, 4).reshape(batch, steps, n_heads, head_dim)


def merged_heads(
    module: nn.Module, y: jax.Array, kernel: jax.Array, dtype: jnp.dtype, deterministic: bool
) -> jax.Array:
    """The heads' outputs ``y`` ``[B, T, heads, head_dim]`` through an attention layer's output projection
    ``out`` (``kernel`` ``[heads, head_dim, embed]``), plus its LoRA adapter when the layer adapts ``out``
    (the layer's ``_adapted``)."""
    out = project("btnh,nhe->bte", y, kernel, dtype)
    if module._adapted("out"):  # type: ignore[attr-defined]
        dims = ((Axis.HEADS, Axis.HEAD_DIM), (Axis.EMBED,))
        out = out + lora.layer_adapter(module, "out", y, y.shape[2:], out.shape[2:], dims, deterministic)
    return out


class CausalSelfAttention(lora.LoRAKeys, StackLayer):
    """Causal self-attention with grouped-query heads, optional RoPE, padding masks and a KV cache.

    Config keys: ``architecture/n_heads`` (query heads, required when used alone),
    ``architecture/n_kv_heads`` (key/value heads; ``None`` = ``n_heads``; must divide ``n_heads``),
    ``architecture/n_embd`` (``None``: the input width), ``architecture/dropout`` (on the output,
    training only; attention probabilities are not dropped: the fused kernel has no dropout),
    ``architecture/attention_impl`` (auto | xla | cudnn | splash, see :func:`dot_product_attention`), and the
    LoRA keys ``model/lora/*`` (adapters ``<name>_lora_a`` / ``<name>_lora_b`` on the projections
    named in ``model/lora/targets``; see :mod:`theseus.model.layers.lora`), and ``model/quantize``
    (the frozen projection kernels stored as nf4 / int8, with LoRA only; see
    :mod:`theseus.model.layers.quantization`).

    ``spec`` (:class:`AttentionSpec`, passed by the model's blocks) holds the heads, biases, query/key
    norms, score scale, softcap, window and implementation; without it the layer takes the configured
    heads and implementation, with biases. ``position`` (:class:`~theseus.model.layers.rotary.PositionSpec`;
    None: no positions) rotates queries and keys when its kind is ``"rope"``.

    Parameters: ``query`` ``[embed, heads, head_dim]``, ``key``/``value`` ``[embed, kv_heads, head_dim]``,
    ``out`` ``[heads, head_dim, embed]``; ``query_bias``/``key_bias``/``value_bias`` with the spec's
    ``qkv_bias``, ``out_bias`` with its ``out_bias`` (``None``: as ``qkv_bias``). ``qk_norm`` adds
    ``query_norm`` / ``key_norm`` (RMSNorm ``scale`` ``[head_dim]``) applied to each head's query and key
    before RoPE, as Qwen3 does; with ``qk_norm_span="projection"`` each norm spans the whole projection
    (``scale`` ``[heads * head_dim]``), as OLMo 2 does.
    ``sliding_window``: each token attends to itself and the ``sliding_window - 1`` tokens before it
    (:func:`window_mask`), in training and against the KV cache. ``layer_types`` (one
    ``"sliding_attention"`` / ``"full_attention"`` per layer) gives the window only to the sliding
    layers, which rotate with the position's ``local_theta`` and without its ``scaling`` (it scales the
    full layers only); the layer is the call's ``layer`` (a Python int, or a traced index inside a
    scan: then the window and base are selected at run time).

    Call: ``attn(x, padding_mask=None, positions=None, deterministic=False, decode=False, layer=None)``;
    ``x`` ``[B, T, E]``, ``padding_mask`` bool ``[B, T]`` (True = real token; padded keys are
    never attended to) or int segment ids ``[B, T]`` (packed examples; see :func:`attention_mask`),
    ``positions`` int ``[B, T]`` for rotary (default ``0..T-1``).
    With ``decode=True`` keys and values are appended to the ``cache`` collection
    (``key``/``value`` ``[B, kv_heads, L, head_dim]``, heads-major so that both products of a step
    read the cache as it lies: :func:`cached_attention`; ``mask`` ``[B, L]``, ``index``) and the
    queries attend to every cached real token before them; the cache is created by
    initialising with ``decode=True`` on a ``[B, L]`` input (see ``theseus.model.models.init_cache``).
    A layer whose window is a fixed number shorter than ``L`` keeps a ring buffer of ``window`` slots
    instead (``key``/``value`` ``[B, kv_heads, window, head_dim]``, plus ``slots`` ``[window]``: the
    sequence index each slot holds); a window chosen per layer at run time (a scanned model whose
    ``layer_types`` do not repeat) keeps the whole length, masked to the window, as stacked caches share
    one shape (repeating ones scan whole periods, each layer static: ``theseus.model.stack.scan``).
    """

    n_embd: int | None = architecture_field("n_embd")
    n_heads: int | None = architecture_field("n_heads")
    n_kv_heads: int | None = architecture_field("n_kv_heads")
    dropout: float = architecture_field("dropout")
    attention_impl: str = architecture_field("attention_impl")
    quantize: str = quantization.quantize_field()
    spec: AttentionSpec | None = None
    position: PositionSpec | None = None
    layer_types: tuple[str, ...] | None = None
    init_std: float = INIT_STD
    out_std: float | None = None

    @classmethod
    def components(cls) -> list[type]:
        return [RotaryEmbedding, RMSNorm]

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.EMBED: MeshAxis.DATA, Axis.HEADS: MeshAxis.MODEL, Axis.KV_HEADS: MeshAxis.MODEL})

    @property
    def attention_spec(self) -> AttentionSpec:
        """``spec``, or (the layer used alone) the configured heads and implementation, with biases."""
        if self.spec is not None:
            return self.spec
        n_heads = require(self.n_heads, "architecture/n_heads", "CausalSelfAttention")
        return AttentionSpec(n_heads=n_heads, n_kv_heads=self.n_kv_heads, implementation=self.attention_impl)

    @property
    def position_spec(self) -> PositionSpec:
        """``position``, or no positions at all."""
        return PositionSpec(kind="none") if self.position is None else self.position

    def _heads(self, n_embd: int) -> tuple[int, int, int]:
        spec = self.attention_spec
        n_heads, n_kv = spec.n_heads, spec.kv_heads
        if spec.head_dim is None and n_embd % n_heads:
            raise ConfigError(f"architecture/n_embd={n_embd} is not divisible by architecture/n_heads={n_heads}")
        if n_kv < 1 or n_heads % n_kv:
            raise ConfigError(f"architecture/n_kv_heads={n_kv} must divide architecture/n_heads={n_heads}")
        return n_heads, n_kv, spec.width(n_embd)

    def _width(self) -> int:
        return layer_width(self, lambda params: nn.unbox(params["out"]).shape[-1] if "out" in params else None)

    def matmul_params(self) -> int:
        """Weights of the query, key, value and output projections."""
        n_embd = self._width()
        n_heads, n_kv, head_dim = self._heads(n_embd)
        return 2 * n_embd * n_heads * head_dim + 2 * n_embd * n_kv * head_dim

    def attended(self, seq: int, layer: int | None = None) -> int:
        """Keys each of ``seq`` queries is counted against: ``seq`` (the full square, the usual MFU
        convention, with no causal saving), or the window of a windowed layer when it is shorter
        (``sliding_window``; with ``layer_types``, layer ``layer``'s window; without a layer, every
        layer counts as full)."""
        if self.layer_types is not None and layer is None:
            return seq
        window = self._layer_window(layer)
        return seq if window is None or isinstance(window, jax.Array) else min(seq, int(window))

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs of layer ``layer`` (its index, needed with ``layer_types``):
        projections ``6 * seq * matmul_params`` plus the score and value products
        ``3 * (2 + 2) * seq * attended * n_heads * head_dim`` (:meth:`attended`: the full square, or
        the window). Softmax, sinks and caps are elementwise and not counted."""
        n_embd = self._width()
        n_heads, _, head_dim = self._heads(n_embd)
        return 6 * seq * self.matmul_params() + 12 * seq * self.attended(seq, layer) * n_heads * head_dim

    def _adapted(self, name: str) -> bool:
        return self.lora_rank > 0 and name in lora.check_targets(self.lora_targets)

    def _kernel(
        self, name: str, init: nn.initializers.Initializer, shape: tuple[int, ...], axes: tuple[str, ...], n_in: int = 1
    ) -> jax.Array:
        """The projection kernel ``name``: a float parameter, or stored quantized (``model/quantize``)."""
        method = quantization.check(self.quantize, self.lora_rank)
        return quantization.kernel(self, name, init, shape, axes, method, n_in)

    def _project(
        self, x: jax.Array, name: str, heads: int, head_dim: int, axis: str, deterministic: bool = True
    ) -> jax.Array:
        dtype = self._activation_dtype
        kernel = self._kernel(
            name, normal(self.init_std), (x.shape[-1], heads, head_dim), (Axis.EMBED, axis, Axis.HEAD_DIM)
        )
        y = project("bte,enh->btnh", x, kernel, dtype)
        if self._adapted(name):
            dims = ((Axis.EMBED,), (axis, Axis.HEAD_DIM))
            y = y + lora.layer_adapter(self, name, x, (x.shape[-1],), (heads, head_dim), dims, deterministic)
        if self.attention_spec.qkv_bias:
            bias = param(self, f"{name}_bias", nn.initializers.zeros_init(), (heads, head_dim), (axis, Axis.HEAD_DIM))
            y = y + cast(bias, dtype)
        return constrain(y, (Axis.BATCH, Axis.SEQUENCE, axis, Axis.HEAD_DIM))

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        """This layer's attention window: static for a Python ``layer``, selected from ``layer_types`` at
        run time for a traced one (a full layer's window is then :data:`NO_WINDOW`)."""
        window = self.attention_spec.sliding_window
        if self.layer_types is None:
            return window
        if CHUNKED_ATTENTION in self.layer_types:
            raise ConfigError(f"{CHUNKED_ATTENTION} layers are Llama 4's (model/llama4_text); use sliding_attention")
        if LINEAR_ATTENTION in self.layer_types:
            raise ConfigError(f"{LINEAR_ATTENTION} layers are Qwen3-Next's (model/qwen3_next)")
        if layer is None:
            raise ConfigError("an attention layer with layer_types needs its layer index (layer=...)")
        if isinstance(layer, int):
            return window if self.layer_types[layer] == SLIDING_ATTENTION else None
        return jnp.where(self._sliding(layer), NO_WINDOW if window is None else window, NO_WINDOW)

    def _sliding(self, layer: jax.Array) -> jax.Array:
        return jnp.asarray([t == SLIDING_ATTENTION for t in self.layer_types or ()])[layer]

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        """RoPE of the queries and keys. With ``layer_types`` the sliding layers rotate with
        the position's ``local_theta`` and no ``scaling`` (which scales the full layers only, as Gemma 3's
        releases do); a traced ``layer`` selects at run time."""
        spec = self.position_spec
        scaling, theta, local_theta = spec.scaled, spec.theta, spec.local
        if self.layer_types is None:
            rope = child(self, RotaryEmbedding, theta=theta, scaling=scaling, name="rotary")
            return rope(q, positions), rope(k, positions)
        if isinstance(layer, int):
            sliding = self.layer_types[layer] == SLIDING_ATTENTION
            base, scaled = (local_theta, None) if sliding else (theta, scaling)
            return rotate(q, positions, base, scaled), rotate(k, positions, base, scaled)
        if layer is None:
            raise ConfigError("an attention layer with layer_types needs its layer index (layer=...)")
        local = self._sliding(layer)
        if scaling is None:
            chosen = jnp.where(local, local_theta, theta)
            return rotate(q, positions, chosen), rotate(k, positions, chosen)
        both = [(rotate(x, positions, local_theta), rotate(x, positions, theta, scaling)) for x in (q, k)]
        (q_local, q_full), (k_local, k_full) = both
        return jnp.where(local, q_local, q_full), jnp.where(local, k_local, k_full)

    def _cached(
        self, k: jax.Array, v: jax.Array, padding_mask: jax.Array | None, window: int | jax.Array | None = None
    ) -> tuple[jax.Array, ...] | None:
        """Append ``k``/``v`` to the cache (:func:`append_to_cache`); returns (keys, values, mask) over
        the whole cache, or None while the cache is being created. A fixed ``window`` shorter than the
        cache makes it a ring buffer of ``window`` slots (:meth:`_ring`)."""
        if self.has_variable("cache", "slots"):
            return self._ring(k, v, padding_mask, window)
        steps, size = k.shape[1], None
        creating = self.is_initializing() and not self.has_variable("cache", "key")
        if creating and isinstance(window, int) and window < steps:  # created: steps = the cache length
            self.variable("cache", "slots", jnp.zeros, (window,), jnp.int32)
            size = window
        entries = {"key": heads_major(k), "value": heads_major(v)}
        return append_to_cache(self, entries, padding_mask, time_axis=2, size=size, window=window)

    def _ring(
        self, k: jax.Array, v: jax.Array, padding_mask: jax.Array | None, window: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The ring-buffer cache of a windowed layer: the queries attend to the slots' keys and the
        step's own (by sequence index, within the window); then the step's last ``window`` keys
        overwrite the slots they fall on (``index % window``)."""
        batch, steps = k.shape[:2]
        cached_k: jax.Array = self.get_variable("cache", "key")
        cached_v: jax.Array = self.get_variable("cache", "value")
        cached_mask: jax.Array = self.get_variable("cache", "mask")
        slots: jax.Array = self.get_variable("cache", "slots")
        start: jax.Array = self.get_variable("cache", "index")
        size = cached_k.shape[2]
        step_mask = jnp.ones((batch, steps), jnp.bool_) if padding_mask is None else padding_mask.astype(jnp.bool_)
        query_slot = start + jnp.arange(steps, dtype=jnp.int32)
        keys = jnp.concatenate([cached_k, heads_major(k, cached_k.dtype)], axis=2)
        values = jnp.concatenate([cached_v, heads_major(v, cached_v.dtype)], axis=2)
        key_slot = jnp.concatenate([slots, query_slot])
        visible = window_mask(query_slot, key_slot, window)  # [T, size + T]
        mask = visible[None, None] & jnp.concatenate([cached_mask, step_mask], axis=1)[:, None, None, :]
        kept = min(steps, size)
        written = query_slot[-kept:] % size
        self.put_variable("cache", "key", cached_k.at[:, :, written].set(keys[:, :, -kept:]))
        self.put_variable("cache", "value", cached_v.at[:, :, written].set(values[:, :, -kept:]))
        self.put_variable("cache", "mask", cached_mask.at[:, written].set(step_mask[:, -kept:]))
        self.put_variable("cache", "slots", slots.at[written].set(query_slot[-kept:]))
        self.put_variable("cache", "index", start + steps)
        return keys, values, mask

    def _qk_norm(self, x: jax.Array, name: str) -> jax.Array:
        """RMSNorm of each head (``qk_norm_span="head"``) or of the whole projection."""
        spec = self.attention_spec
        norm = child(self, RMSNorm, eps=spec.norm_eps, zero_centred=spec.qk_norm_zero_centred, name=name)
        if spec.qk_norm_span == "head":
            return norm(x)
        if spec.qk_norm_span != "projection":
            raise ConfigError(f"qk_norm_span must be 'head' or 'projection', got {spec.qk_norm_span!r}")
        return norm(x.reshape(*x.shape[:-2], -1)).reshape(x.shape)

    def _scale(self) -> float | None:
        """What the scores are multiplied by (None: ``head_dim ** -0.5``)."""
        return self.attention_spec.score_scale()

    def _sinks(self, n_heads: int) -> jax.Array | None:
        """A logit per head that joins each row's softmax (:func:`attention_probabilities`), or None:
        a subclass with attention sinks (GPT-OSS) makes them its parameter here."""
        return None

    def _attend(
        self,
        q: jax.Array,
        k: jax.Array,
        v: jax.Array,
        padding_mask: jax.Array | None,
        window: int | jax.Array | None,
        decode: bool,
        selection: jax.Array | None = None,
    ) -> jax.Array:
        """The heads' outputs ``[B, T, heads, head_dim]`` of rotated ``q`` and ``k``, ``v`` (the step's,
        appended to the KV cache first when ``decode``), each query reading only the keys ``selection``
        ``[B, 1, T, L]`` keeps (None: all it may see; :meth:`_selection`). A subclass may compute them otherwise."""
        scale, softcap, sinks = self._scale(), self.attention_spec.softcap, self._sinks(q.shape[2])
        if context_size() > 1:  # the sequence is split over the context axis, in the balanced order
            if decode:
                refuse("decoding with a KV cache")
            if selection is not None:
                refuse("block-selected attention")
            return context_parallel_attention(
                q, k, v, padding_mask, window=window, scale=scale, softcap=softcap, sinks=sinks
            )
        cached = self._cached(k, v, padding_mask, window) if decode else None
        if cached is not None:
            keys, values, mask = cached
            mask = mask if selection is None else mask & selection
            return cached_attention(q, keys, values, mask, scale=scale, softcap=softcap, sinks=sinks)
        implementation = self.attention_spec.implementation

        def attend(window: int | jax.Array | None) -> jax.Array:
            return dot_product_attention(
                q,
                k,
                v,
                mask=selection,
                padding_mask=padding_mask,
                is_causal=True,
                implementation=implementation,
                window=window,
                scale=scale,
                softcap=softcap,
                sinks=sinks,
            )

        if isinstance(window, jax.Array) and attention_backend(implementation, q, v) == "splash":
            # a window chosen per layer at run time (scanned layer types): one kernel per kind of layer
            fixed = self.attention_spec.sliding_window
            return jax.lax.cond(window < NO_WINDOW, lambda: attend(fixed), lambda: attend(None))
        return attend(window)

    def _selection(
        self, x: jax.Array, positions: jax.Array | None, padding_mask: jax.Array | None, decode: bool
    ) -> jax.Array | None:
        """Which keys each query of input ``x`` reads, ``[B, 1, T, L]`` (True: read), or None for all it may
        see: None here; a layer with an indexer chooses (Qwen4-Exp's block selection)."""
        return None

    def _values(self, x: jax.Array, k: jax.Array, n_kv: int, head_dim: int, deterministic: bool) -> jax.Array:
        """The values ``[B, T, kv_heads, head_dim]`` of input ``x`` (``k``: the keys as projected, before any
        norm or RoPE): the ``value`` projection here; a subclass may derive them otherwise (Gemma 4)."""
        return self._project(x, "value", n_kv, head_dim, Axis.KV_HEADS, deterministic)

    def _gate_output(self, x: jax.Array, y: jax.Array, n_heads: int, head_dim: int, deterministic: bool) -> jax.Array:
        """The heads' outputs ``y`` ``[B, T, heads, head_dim]`` before the output projection, of input ``x``:
        unchanged here; a subclass may gate them (Qwen3-Next's sigmoid of a projection of ``x``)."""
        return y

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, positions, deterministic, decode = call
        n_embd = x.shape[-1]
        if self.n_embd is not None and self.n_embd != n_embd:
            raise ConfigError(f"attention input width {n_embd} does not match architecture/n_embd={self.n_embd}")
        n_heads, n_kv, head_dim = self._heads(n_embd)
        dtype = self._activation_dtype
        x = cast(x, dtype)
        q = self._project(x, "query", n_heads, head_dim, Axis.HEADS, deterministic)
        k = self._project(x, "key", n_kv, head_dim, Axis.KV_HEADS, deterministic)
        v = self._values(x, k, n_kv, head_dim, deterministic)
        if self.attention_spec.qk_norm:
            q = self._qk_norm(q, "query_norm")
            k = self._qk_norm(k, "key_norm")
        window = self._layer_window(layer)
        if self.position_spec.rotary:
            q, k = self._rotate(q, k, positions, layer)

        selection = self._selection(x, positions, padding_mask, decode)
        if selection is None:
            y = self._attend(q, k, v, padding_mask, window, decode)
        else:
            y = self._attend(q, k, v, padding_mask, window, decode, selection=selection)
        y = self._gate_output(x, y, n_heads, head_dim, deterministic)
        y = constrain(y, (Axis.BATCH, Axis.SEQUENCE, Axis.HEADS, Axis.HEAD_DIM))

        out_std = self.init_std if self.out_std is None else self.out_std
        kernel = self._kernel(
            "out", normal(out_std), (n_heads, head_dim, n_embd), (Axis.HEADS, Axis.HEAD_DIM, Axis.EMBED), n_in=2
        )
        out = merged_heads(self, y, kernel, dtype, deterministic)
        if self.attention_spec.has_out_bias:
            out = out + cast(param(self, "out_bias", nn.initializers.zeros_init(), (n_embd,), (Axis.EMBED,)), dtype)
        if self.dropout > 0.0 and not deterministic:
            out = nn.Dropout(rate=self.dropout)(out, deterministic=False)
        return out


def rotary_fraction_field(default: float) -> Any:
    """The ``architecture/partial_rotary_factor`` field of a family's :class:`PartialRotaryAttention`, with
    the default of the family's releases."""
    return field(
        "architecture/partial_rotary_factor",
        default=default,
        above=0.0,
        max=1.0,
        help="the fraction of each query/key head that RoPE rotates (the leading dimensions)",
    )


class PartialRotaryAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` whose RoPE turns only the leading ``partial_rotary_factor`` of each
    query/key head (with frequencies over those dimensions, half-split as :func:`rotate`); the rest pass
    unrotated. Every layer rotates with the position's ``theta`` and ``scaling``. A family's subclass
    declares ``architecture/partial_rotary_factor`` with its releases' default
    (:func:`rotary_fraction_field`: Qwen3-Next 0.25, GLM-4.5 and MiniMax-M2 0.5)."""

    partial_rotary_factor: float = 1.0

    def _rotary_dim(self, head_dim: int) -> int:
        """The rotated dimensions of a head: an even number from 2 to ``head_dim``, or one line."""
        rotated = int(head_dim * self.partial_rotary_factor)
        if rotated < 2 or rotated % 2 or rotated > head_dim:
            raise ConfigError(
                f"architecture/partial_rotary_factor={self.partial_rotary_factor} rotates {rotated} of "
                f"{head_dim} dimensions; it must give an even number from 2 to {head_dim}"
            )
        return rotated

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        rotated = self._rotary_dim(q.shape[-1])
        spec = self.position_spec

        def turn(x: jax.Array) -> jax.Array:
            head = rotate(x[..., :rotated], positions, spec.theta, spec.scaled)
            return jnp.concatenate([head, x[..., rotated:]], axis=-1)

        return turn(q), turn(k)
