"""Hyper-connections: a residual scheme of ``n`` streams in place of the one residual sum.

The stack carries ``[B, T, n * n_embd]``: the token embedding repeated ``n`` times (:func:`widen`). Each
branch of a layer (the token mixer, the feed-forward) *reads* one ``n_embd``-wide input from the streams
and *writes* its output back into all of them, with weights a small learned projection computes from
the streams themselves, per token. The model's head *narrows* the streams to one before the output
projection (:class:`HyperHead`). The stack (:class:`~theseus.model.stack.block.Block`,
:class:`~theseus.model.stack.transformer.TransformerLM`) composes them for any family whose
architecture has a :class:`HyperSpec`.

:class:`GatedHyperConnection` is Qwen4-Exp's kind: the streams, each RMS-normalised on its own (one
scale over all of them, ``1 + scale``), are gated by ``sigmoid(up(silu(down(normed) / n)))`` (a low-rank
projection of ``rank``) and averaged into the branch's input; the branch's output is added to stream
``i`` times ``2 sigmoid(inject(normed)_i / n)``. The streams pass on unmixed. A kind with a mixing matrix
between the streams (DeepSeek-V4's Sinkhorn-normalised one) is another :class:`HyperConnection` with the
same two calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, cast, normal, param
from theseus.model.module import Module

#: :attr:`HyperSpec.kind` values.
HYPER_KINDS = ("gated",)


@dataclass(frozen=True)
class HyperSpec:
    """An architecture's hyper-connections: ``streams`` residual streams of ``n_embd`` each, the
    connection ``kind`` (:data:`HYPER_KINDS`), the rank of its input gate's projection and the epsilon of
    its per-stream norm; ``final_norm``: the model's final norm follows the narrowing head (False: the
    head's own per-stream norm is the last one, Qwen4-Exp)."""

    streams: int = 4
    rank: int = 320
    eps: float = 1e-6
    kind: str = "gated"
    final_norm: bool = False

    def validate(self) -> HyperSpec:
        if self.streams < 2:
            raise ConfigError(f"architecture/hc_count={self.streams}: hyper-connections need at least 2 streams")
        if self.rank < 1:
            raise ConfigError(f"architecture/hc_lowrank={self.rank} must be at least 1")
        if self.kind not in HYPER_KINDS:
            raise ConfigError(f"hyper-connection kind {self.kind!r}: use one of {', '.join(HYPER_KINDS)}")
        return self


def widen(h: jax.Array, streams: int) -> jax.Array:
    """The streams of embedded tokens ``h`` ``[..., n_embd]``: each a copy, ``[..., streams * n_embd]``."""
    return jnp.tile(h, (1,) * (h.ndim - 1) + (streams,))


def stream_norm(x: jax.Array, scale: jax.Array, streams: int, eps: float) -> jax.Array:
    """``x`` ``[..., streams * n_embd]`` RMS-normalised per stream (float32), times ``1 + scale``."""
    x32 = x.astype(jnp.float32)
    split = x32.reshape(*x.shape[:-1], streams, -1)
    normed = split * jax.lax.rsqrt(jnp.mean(jnp.square(split), axis=-1, keepdims=True) + eps)
    return normed.reshape(x.shape) * (1.0 + scale.astype(jnp.float32))


class HyperConnection(Module):
    """One branch's connection to the streams: :meth:`read` gives the branch's input and what
    :meth:`write` needs; :meth:`write` adds the branch's output to the streams. ``combine=False`` builds
    the read alone (the model's narrowing head)."""

    streams: int = 4
    rank: int = 320
    eps: float = 1e-6
    combine: bool = True

    def read(self, x: jax.Array) -> tuple[jax.Array, Any]:
        raise NotImplementedError

    def write(self, x: jax.Array, out: jax.Array, weights: Any) -> jax.Array:
        raise NotImplementedError

    def __call__(self, x: jax.Array) -> jax.Array:
        """The read alone: one ``n_embd``-wide tensor of the streams ``x``."""
        return self.read(x)[0]


class GatedHyperConnection(HyperConnection):
    """Qwen4-Exp's hyper-connection (the module docstring's formula). Parameters: ``norm`` ``[n * n_embd]``
    (zeros: ``1 + scale``), ``down`` ``[n * n_embd, rank]``, ``up`` ``[rank, n * n_embd]`` and, with
    ``combine``, ``inject`` ``[n * n_embd, n]``. The weights are computed in float32; the branch's input
    and the streams keep the activation dtype."""

    @nn.compact
    def read(self, x: jax.Array) -> tuple[jax.Array, Any]:
        width, n = x.shape[-1], self.streams
        scale = param(self, "norm", nn.initializers.zeros_init(), (width,), (Axis.NORM,))
        down = param(self, "down", normal(INIT_STD), (width, self.rank), (Axis.EMBED, None))
        up = param(self, "up", normal(INIT_STD), (self.rank, width), (None, Axis.EMBED))
        normed = stream_norm(x, scale, n, self.eps)
        low = jax.nn.silu(jnp.einsum("...w,wr->...r", normed, down.astype(jnp.float32)) / n)
        gate = jax.nn.sigmoid(jnp.einsum("...r,rw->...w", low, up.astype(jnp.float32)))
        split = (gate * normed).reshape(*x.shape[:-1], n, width // n)
        mixed = cast(jnp.mean(split, axis=-2), self._activation_dtype)
        if not self.combine:
            return mixed, None
        inject = param(self, "inject", normal(INIT_STD), (width, n), (Axis.EMBED, None))
        weights = 2.0 * jax.nn.sigmoid(jnp.einsum("...w,wn->...n", normed, inject.astype(jnp.float32)) / n)
        return mixed, weights

    def write(self, x: jax.Array, out: jax.Array, weights: Any) -> jax.Array:
        added = out.astype(jnp.float32)[..., None, :] * weights[..., :, None]
        return x + cast(added.reshape(x.shape), x.dtype)


def hyper_class(spec: HyperSpec) -> type[HyperConnection]:
    """The connection class of ``spec.kind``."""
    return {"gated": GatedHyperConnection}[spec.validate().kind]


__all__ = [
    "HYPER_KINDS",
    "GatedHyperConnection",
    "HyperConnection",
    "HyperSpec",
    "hyper_class",
    "stream_norm",
    "widen",
]
