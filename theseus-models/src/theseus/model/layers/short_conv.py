"""The gated short convolution (:class:`ShortConv`): a token mixer with no attention, of LFM2's ``conv``
layers. Per position ``t``, with ``B``, ``C`` and ``h`` three projections of the input::

    u_t = B_t * h_t
    y_t = out(C_t * sum_j kernel[j] * u_{t - K + 1 + j})

a depthwise causal convolution of ``K`` taps over the gated inputs ``u``, gated again. It reads only the
``K - 1`` positions before each token, so decoding keeps those gated inputs as its state.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.model.layers._common import INIT_STD, cast, constrain, layer_width, normal, param
from theseus.model.layers.attention import is_segment_ids, missing_cache_error
from theseus.model.layers.context_parallel import refuse
from theseus.model.layers.layer_call import LayerCall, StackLayer

#: The ``layer_types`` entry of a short-convolution layer (transformers' name in LFM2's ``config.json``).
SHORT_CONV = "conv"
#: The three input projections, in the order of their rows in LFM2's ``in_proj``.
GATES = ("b", "c", "x")


def segment_taps(padding_mask: jax.Array, taps: int) -> jax.Array:
    """``[B, T, K]``: whether tap ``j`` of position ``t`` (the input at ``t - K + 1 + j``) lies in ``t``'s
    own example, for integer segment ids ``[B, T]`` (0: padding, which no tap reads)."""
    ids = jnp.asarray(padding_mask)
    steps = ids.shape[1]
    shifted = [jnp.pad(ids, ((0, 0), (taps - 1 - j, 0)))[:, :steps] for j in range(taps)]
    return jnp.stack([(s == ids) & (s > 0) for s in shifted], axis=-1)


def causal_conv(
    u: jax.Array, kernel: jax.Array, history: jax.Array | None = None, taps_mask: jax.Array | None = None
) -> jax.Array:
    """Depthwise causal convolution of ``u`` ``[B, T, C]`` with ``kernel`` ``[K, C]`` (the last tap on the
    current position) after ``history`` ``[B, K - 1, C]`` (None: zeros); ``taps_mask`` ``[B, T, K]``
    leaves out the taps it marks False (:func:`segment_taps`). float32 out."""
    taps, steps = kernel.shape[0], u.shape[1]
    if history is None:
        history = jnp.zeros((u.shape[0], taps - 1, u.shape[-1]), u.dtype)
    full = jnp.concatenate([history.astype(jnp.float32), u.astype(jnp.float32)], axis=1)
    out = jnp.zeros(u.shape, jnp.float32)
    for j in range(taps):
        term = full[:, j : j + steps] * kernel[j].astype(jnp.float32)
        out = out + (term if taps_mask is None else term * taps_mask[..., j : j + 1])
    return out


class ShortConv(StackLayer):
    """The gated short convolution, called as the stack calls its layers (a :class:`StackLayer`, as an
    attention layer is): ``(x, *call, layer) -> [B, T, E]`` (the call's positions and ``layer`` unused).

    Parameters: ``in_proj`` ``[embed, 3, embed]`` (the gates ``B``, ``C`` and the input ``h``, in that order),
    ``conv`` ``[conv_kernel, embed]`` (depthwise: one filter per channel) and ``out_proj`` ``[embed, embed]``;
    with ``use_bias``, ``in_proj_bias`` ``[3, embed]``, ``conv_bias`` and ``out_proj_bias`` ``[embed]``.
    The projections are computed in the activation dtype, the convolution in float32.

    Padding: a boolean ``padding_mask`` zeroes the convolution's input at padded positions, so a left-padded
    row starts from an empty state; integer segment ids (packed examples) keep each tap within its
    position's example. With ``decode`` the ``cache`` collection holds ``conv`` (``[B, conv_kernel - 1,
    embed]``: the last gated inputs ``B * h``), which a step reads before its own tokens and rolls forward.
    """

    conv_kernel: int = 3
    use_bias: bool = False
    init_std: float = INIT_STD
    out_std: float | None = None
    #: The model width, for :meth:`flops` on an unbound layer (None: read from a bound layer's ``out_proj``).
    n_embd: int | None = None

    def _width(self) -> int:
        return layer_width(
            self, lambda params: nn.unbox(params["out_proj"]).shape[-1] if "out_proj" in params else None
        )

    def matmul_params(self) -> int:
        """Projection weights: ``in_proj`` (three of ``embed x embed``) and ``out_proj``."""
        return 4 * self._width() ** 2

    def flops(self, seq: int, layer: int | None = None) -> int:
        """Forward + backward FLOPs: ``6 * seq`` times the projection weights and the convolution's taps
        (``conv_kernel`` multiply-adds per channel and position); the gates are elementwise and not
        counted. ``layer`` is accepted as attention layers take it."""
        return 6 * seq * (self.matmul_params() + self.conv_kernel * self._width())

    def _bias(self, name: str, shape: tuple[int, ...], axes: tuple[str | None, ...]) -> jax.Array | None:
        if not self.use_bias:
            return None
        return param(self, name, nn.initializers.zeros_init(), shape, axes)

    @nn.compact
    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        padding_mask, _positions, _deterministic, decode = call
        refuse("the gated short convolution (LFM2's conv layers)")
        dtype, width, taps = self._activation_dtype, x.shape[-1], self.conv_kernel
        x = cast(x, dtype)
        kernel = param(self, "in_proj", normal(self.init_std), (width, len(GATES), width), (Axis.EMBED, None, Axis.MLP))
        projected = jnp.einsum("bte,egc->btgc", x, cast(kernel, dtype))
        in_bias = self._bias("in_proj_bias", (len(GATES), width), (None, Axis.MLP))
        if in_bias is not None:
            projected = projected + cast(in_bias, dtype)
        b, c, h = (projected[:, :, i] for i in range(len(GATES)))
        u = b * h
        taps_mask = None
        if padding_mask is not None and is_segment_ids(padding_mask):
            taps_mask = segment_taps(padding_mask, taps)
        elif padding_mask is not None:
            u = u * padding_mask.astype(dtype)[..., None]
        conv = param(self, "conv", normal(self.init_std), (taps, width), (None, Axis.MLP))
        history = None
        if decode:
            if not self.has_variable("cache", "conv") and not self.is_initializing():
                raise missing_cache_error()
            state = self.variable("cache", "conv", jnp.zeros, (x.shape[0], taps - 1, width), dtype)
            history = state.value
            state.value = jnp.concatenate([history, u.astype(dtype)], axis=1)[:, u.shape[1] :]
        mixed = causal_conv(u, conv, history, taps_mask)
        conv_bias = self._bias("conv_bias", (width,), (Axis.MLP,))
        if conv_bias is not None:
            mixed = mixed + conv_bias.astype(jnp.float32)
        y = constrain(c * mixed.astype(dtype), (Axis.BATCH, Axis.SEQUENCE, Axis.MLP))
        out_std = self.init_std if self.out_std is None else self.out_std
        out_kernel = param(self, "out_proj", normal(out_std), (width, width), (Axis.MLP, Axis.EMBED))
        out = jnp.einsum("btc,ce->bte", y, cast(out_kernel, dtype))
        out_bias = self._bias("out_proj_bias", (width,), (Axis.EMBED,))
        return out if out_bias is None else out + cast(out_bias, dtype)


__all__ = ["GATES", "SHORT_CONV", "ShortConv", "causal_conv", "segment_taps"]
