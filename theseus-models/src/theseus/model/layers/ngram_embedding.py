"""Hashed n-gram embeddings: tables indexed by hashes of each token's id and the ids before it.

For every order ``g`` in ``2..order`` and each of ``heads_per_ngram`` heads, the ids of a token and the
``g - 1`` before it (:func:`ngram_history`: within the token's document, the ids before it or before a
document's start read as ``eos``) are hashed as ``(id_0 m_0) xor (id_1 m_1) xor ...`` in wrapping
64-bit integers, then taken modulo the head's prime (Python's sign rule), plus the head's offset: a row
of one table of ``head_dim = dim / heads`` columns. The heads' rows, side by side, are the token's
``dim``-wide embedding. Multipliers and primes are derived from a seed and the layer's index among the
layers that have such a table (:func:`hash_multipliers`, :func:`head_primes`), as transformers' Qwen4-Exp
derives them. The arithmetic runs on pairs of ``uint32`` (JAX without 64-bit types), exactly.

:class:`NGramInjection` is how Qwen4-Exp's layers use them (transformers' "PLE" layers): the embedding is
projected to one value and one key per hyper-connection stream; the key's agreement with the stream
gates the value, and a dilated depthwise convolution adds local context; the result is added to the
streams. In decoding, :class:`NGramContext` keeps each row's last ``order - 1`` ids and every
:class:`NGramInjection` the last inputs of its convolution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, cast, normal, param
from theseus.model.layers.attention import missing_cache_error
from theseus.model.layers.hyper_connections import stream_norm
from theseus.model.module import Module

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
_LAYER_PRIME = 10007
#: The largest prime a head may have: the modulo runs on 32-bit integers, four bits at a time.
MAX_PRIME = 1 << 27


@dataclass(frozen=True)
class NGramSpec:
    """The n-gram embeddings of an architecture: ``order`` (the longest n-gram), ``heads_per_ngram``
    heads per order, each a prime number of rows just above ``vocab_base`` (the tables' rows padded to a
    multiple of ``vocab_multiple``), ``dim`` columns in all, the hash ``seed``, the token vocabulary the
    multipliers are bounded by, the id that separates documents (``eos``), the taps of the injection's
    convolution, and the (0-based) ``layers`` that have a table."""

    order: int = 3
    heads_per_ngram: int = 8
    vocab_base: int = 20_000_000
    vocab_multiple: int = 128
    seed: int = 1234
    dim: int = 2048
    conv_kernel: int = 4
    token_vocab: int = 248320
    eos: int = 0
    layers: tuple[int, ...] = ()

    @property
    def heads(self) -> int:
        return (self.order - 1) * self.heads_per_ngram

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads

    def validate(self) -> NGramSpec:
        if self.order < 2 or self.heads_per_ngram < 1:
            raise ConfigError(
                f"architecture/ngram_size={self.order} and heads_per_ngram={self.heads_per_ngram}: "
                "n-gram embeddings need ngram_size >= 2 and at least one head"
            )
        if self.conv_kernel < 2:
            raise ConfigError(f"architecture/ple_conv_kernel_size={self.conv_kernel} must be at least 2")
        if self.dim <= 0 or self.dim % self.heads:
            raise ConfigError(
                f"architecture/ple_embed_dim={self.dim} must be a positive multiple of the {self.heads} n-gram heads"
            )
        largest = head_primes(self.vocab_base, self.heads, max(0, len(self.layers) - 1))[-1]
        if largest >= MAX_PRIME:
            raise ConfigError(
                f"architecture/ngram_vocab_size_base={self.vocab_base}: the tables' primes must stay below 2^27"
            )
        return self

    def table_rows(self, index: int) -> int:
        """Rows of the table of the ``index``-th layer with one: its heads' primes, padded."""
        total = sum(head_primes(self.vocab_base, self.heads, index))
        return -(-total // self.vocab_multiple) * self.vocab_multiple


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * _MIX1) & _MASK64
    value = ((value ^ (value >> 27)) * _MIX2) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def hash_multipliers(token_vocab: int, order: int, index: int, seed: int) -> tuple[int, ...]:
    """The odd multiplier of each of the ``order`` ids a hash reads, for the ``index``-th layer with a table:
    below ``2^63 / token_vocab``, so a product never reaches the sign bit."""
    half = max(1, ((1 << 63) - 1) // max(token_vocab, 1) // 2)
    base = seed + _LAYER_PRIME * index
    return tuple(2 * (_splitmix64((base + _GAMMA * (i + 1)) & _MASK64) % half) + 1 for i in range(order))


def _is_prime(value: int) -> bool:
    if value < 2 or value % 2 == 0:
        return value == 2
    return all(value % d for d in range(3, math.isqrt(value) + 1, 2))


def head_primes(vocab_base: int, heads: int, index: int) -> tuple[int, ...]:
    """The rows of each head of the ``index``-th layer with a table: the primes from ``vocab_base`` on,
    the heads of all such layers in turn (layer 0's first head the first prime)."""
    primes, value = [], vocab_base - 1
    for _ in range((index + 1) * heads):
        value += 1
        while not _is_prime(value):
            value += 1
        primes.append(value)
    return tuple(primes[index * heads :])


def _mul64(a: jax.Array, multiplier: int) -> tuple[jax.Array, jax.Array]:
    """``a * multiplier`` modulo ``2^64`` as ``(high, low)`` ``uint32`` words (``a`` ``uint32``)."""
    m_hi, m_lo = jnp.uint32(multiplier >> 32), multiplier & 0xFFFFFFFF
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = jnp.uint32(m_lo & 0xFFFF), jnp.uint32(m_lo >> 16)
    p0, p1, p2, p3 = a_lo * b_lo, a_lo * b_hi, a_hi * b_lo, a_hi * b_hi
    mid = (p0 >> 16) + (p1 & 0xFFFF) + (p2 & 0xFFFF)
    low = (p0 & 0xFFFF) | ((mid & 0xFFFF) << 16)
    high = p3 + (p1 >> 16) + (p2 >> 16) + (mid >> 16) + a * m_hi
    return high, low


def _signed_mod(high: jax.Array, low: jax.Array, primes: jax.Array, wrap: jax.Array) -> jax.Array:
    """The 64-bit two's-complement value ``(high, low)`` ``[...]`` modulo each of ``primes`` ``[heads]``
    (``[..., heads]``, in ``[0, p)``); ``wrap``: ``2^64 mod p`` of each, for the negative values."""
    rest = jnp.zeros((*high.shape, primes.shape[0]), jnp.uint32)
    for word in (high, low):
        for shift in range(28, -1, -4):
            nibble = ((word >> shift) & 15)[..., None]
            rest = (rest * 16 + nibble) % primes
    negative = (high >> 31)[..., None] == 1
    return jnp.where(negative, (rest + primes - wrap) % primes, rest)


def ngram_history(ids: jax.Array, context: jax.Array, order: int, eos: int) -> jax.Array:
    """``[B, T, order]``: for each token of ``ids`` ``[B, T]`` its id and the ``order - 1`` before it, read
    after ``context`` ``[B, order - 1]`` (the ids before the first; ``eos`` at a sequence's start); an id
    before the token's document (the last ``eos`` before it) reads as ``eos``."""
    history = jnp.concatenate([context, ids], axis=1).astype(jnp.int32)
    length = history.shape[1]
    index = jnp.arange(length, dtype=jnp.int32)
    ends = jax.lax.cummax(jnp.where(history == eos, index, -1), axis=1)
    starts = jnp.concatenate([jnp.full_like(ends[:, :1], -1), ends[:, :-1]], axis=1) + 1
    within = index - starts
    shifted = []
    for shift in range(order):
        source = jnp.maximum(index - shift, 0)
        valid = (within >= shift) & (index - shift >= 0)
        shifted.append(jnp.where(valid, history[:, source], eos))
    return jnp.stack(shifted, axis=-1)[:, -ids.shape[1] :]


def ngram_rows(history: jax.Array, spec: NGramSpec, index: int) -> jax.Array:
    """The table rows ``[B, T, heads]`` of the n-grams ``history`` ``[B, T, order]`` (:func:`ngram_history`)
    for the ``index``-th layer with a table."""
    multipliers = hash_multipliers(spec.token_vocab, spec.order, index, spec.seed)
    primes = head_primes(spec.vocab_base, spec.heads, index)
    offsets = [sum(primes[:h]) for h in range(len(primes))]
    ids = history.astype(jnp.uint32)
    blocks = []
    high, low = _mul64(ids[..., 0], multipliers[0])
    for g in range(2, spec.order + 1):
        more_high, more_low = _mul64(ids[..., g - 1], multipliers[g - 1])
        high, low = high ^ more_high, low ^ more_low
        heads = slice((g - 2) * spec.heads_per_ngram, (g - 1) * spec.heads_per_ngram)
        p = jnp.asarray(primes[heads], jnp.uint32)
        wrap = jnp.asarray([(1 << 64) % q for q in primes[heads]], jnp.uint32)
        rows = _signed_mod(high, low, p, wrap).astype(jnp.int32)
        blocks.append(rows + jnp.asarray(offsets[heads], jnp.int32))
    return jnp.concatenate(blocks, axis=-1)


class NGramContext(nn.Module):
    """The n-grams ``[B, T, order]`` of a step's ids (:func:`ngram_history`): the first step reads ``eos``
    before them; in decoding the ``cache`` collection's ``ids`` ``[B, order - 1]`` keeps each row's last
    ids for the next step (each plus one: a zero, as a new cache holds, reads as ``eos``). Padded positions
    (``mask`` False) read as ``eos``."""

    order: int = 3
    eos: int = 0

    @nn.compact
    def __call__(self, ids: jax.Array, mask: jax.Array | None, decode: bool) -> jax.Array:
        ids = jnp.asarray(ids, jnp.int32)
        if mask is not None:
            ids = jnp.where(mask.astype(jnp.bool_), ids, self.eos)
        fresh = jnp.full((ids.shape[0], self.order - 1), self.eos, jnp.int32)
        if not decode:
            return ngram_history(ids, fresh, self.order, self.eos)
        exists = self.has_variable("cache", "ids")
        if not exists and not self.is_initializing():
            raise missing_cache_error()
        # kept as id + 1: a cache of zeros (as decoding creates it) reads as eos, the start of a sequence
        kept = self.variable("cache", "ids", jnp.zeros, fresh.shape, jnp.int32)
        context = jnp.where(kept.value == 0, self.eos, kept.value - 1)
        kept.value = jnp.concatenate([kept.value, ids + 1], axis=1)[:, -(self.order - 1) :]
        return ngram_history(ids, context, self.order, self.eos)


class NGramInjection(Module):
    """Qwen4-Exp's n-gram branch of a layer (the module docstring), added to the hyper-connection streams
    ``x`` ``[B, T, streams * n_embd]``: ``e`` the table rows of the step's n-grams (``table`` ``[rows,
    head_dim]``), ``k = norm_key(e @ key)`` per stream, ``v = e @ value``, ``g = k . norm_query(x) /
    sqrt(n_embd)`` per stream, signed square root, ``u = sigmoid(g) v`` per stream; the output is ``u +
    silu(conv(norm_conv(u)))``, ``conv`` depthwise of ``conv_kernel`` taps ``order`` positions apart.
    Norms per stream, zero-centred. Padded positions contribute zeros. In decoding the ``cache``
    collection's ``conv`` keeps the convolution's last ``(taps - 1) * order`` inputs."""

    spec: NGramSpec | None = None
    index: int = 0
    streams: int = 4
    eps: float = 1e-6
    #: The model width, for :meth:`flops` on an unbound layer.
    n_embd: int | None = None

    def _spec(self) -> NGramSpec:
        if self.spec is None:
            raise ConfigError("NGramInjection needs an NGramSpec; it is built by a model with n-gram embeddings")
        return self.spec

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs of the key and value projections (the gathers and gates not counted)."""
        spec = self._spec()
        return 6 * seq * spec.dim * (self.streams + 1) * (spec.dim if self.n_embd is None else self.n_embd)

    @nn.compact
    def __call__(self, x: jax.Array, history: jax.Array, mask: jax.Array | None, decode: bool) -> jax.Array:
        spec, n = self._spec(), self.streams
        width = x.shape[-1]
        embd = width // n
        dtype = self._activation_dtype
        table = param(self, "table", normal(INIT_STD), (spec.table_rows(self.index), spec.head_dim), (Axis.VOCAB, None))
        rows = ngram_rows(history, spec, self.index)
        e = jnp.take(table, rows, axis=0).reshape(*rows.shape[:2], spec.dim).astype(jnp.float32)
        key = param(self, "key", normal(INIT_STD), (spec.dim, width), (None, Axis.EMBED))
        value = param(self, "value", normal(INIT_STD), (spec.dim, embd), (None, Axis.EMBED))
        scales = [
            param(self, f"norm_{name}", nn.initializers.zeros_init(), (width,), (Axis.NORM,))
            for name in ("key", "query", "conv")
        ]
        k = stream_norm(e @ key.astype(jnp.float32), scales[0], n, self.eps).reshape(*x.shape[:2], n, embd)
        q = stream_norm(x, scales[1], n, self.eps).reshape(*x.shape[:2], n, embd)
        v = e @ value.astype(jnp.float32)
        gate = jnp.sum(k * q, axis=-1, keepdims=True) / math.sqrt(embd)
        gate = jnp.sqrt(jnp.maximum(jnp.abs(gate), 1e-6)) * jnp.sign(gate)
        gated = (jax.nn.sigmoid(gate) * v[..., None, :]).reshape(x.shape)
        normed = stream_norm(gated, scales[2], n, self.eps)
        if mask is not None:
            keep = mask.astype(jnp.bool_)[..., None]
            gated, normed = jnp.where(keep, gated, 0.0), jnp.where(keep, normed, 0.0)
        taps, gap = spec.conv_kernel, spec.order
        kernel = param(self, "conv", nn.initializers.zeros_init(), (taps, width), (None, Axis.EMBED))
        span = (taps - 1) * gap
        past = jnp.zeros((x.shape[0], span, width), jnp.float32)
        if decode:
            exists = self.has_variable("cache", "conv")
            if not exists and not self.is_initializing():
                raise missing_cache_error()
            kept = self.variable("cache", "conv", jnp.zeros, (x.shape[0], span, width), jnp.float32)
            past = kept.value
            kept.value = jnp.concatenate([past, normed], axis=1)[:, -span:]
        full = jnp.concatenate([past, normed], axis=1)
        steps = x.shape[1]
        conv = sum(full[:, j * gap : j * gap + steps] * kernel[j].astype(jnp.float32) for j in range(taps))
        out = gated + jax.nn.silu(conv)
        return cast(out, dtype)


__all__ = [
    "MAX_PRIME",
    "NGramContext",
    "NGramInjection",
    "NGramSpec",
    "hash_multipliers",
    "head_primes",
    "ngram_history",
    "ngram_rows",
]
