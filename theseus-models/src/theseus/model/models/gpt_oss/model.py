"""``GptOss``: OpenAI's GPT-OSS: Llama's attention with biases and a learned sink per head, sliding and
full layers alternating, and a mixture of biased experts with a clamped SwiGLU.

The mechanisms only this family has live here as subclasses of the shared layers:
:class:`GptOssAttention` (every row's softmax also holds the head's ``sinks`` logit, which takes its
share of the probability and adds no value; every layer rotates with the one RoPE, YaRN in the
releases), :class:`GptOssMoE` (a router with a bias, experts with biases, the activation
:class:`ClampedSwiGLU`) and :class:`GptOssBlock`, which builds the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import cast, normal, param
from theseus.model.layers.attention import (
    CausalSelfAttention,
)
from theseus.model.layers.experts import GatedActivation, Kernels, Routing
from theseus.model.layers.moe import MoE, MoESpec
from theseus.model.layers.rotary import rotate
from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset
from theseus.model.stack.mixture import MixtureLM, MoEBlock, MoEPreset
from theseus.model.stack.windows import InterleavedWindows

GPT_OSS_PRESETS: dict[str, Preset] = {
    "tiny": MoEPreset(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=1.0,
        n_experts=4,
        description="2 layers of 4 experts (top 2) of width 64, 64 wide; tests and demos",
    ),
    # openai/gpt-oss-20b's config.json: 24 layers, 64 query and 8 key/value heads of 64, 2880 wide,
    # 32 experts of intermediate 2880 with 4 per token, untied head; 20.9B parameters at vocab 201088.
    "gpt-oss-20b": MoEPreset(
        n_layers=24,
        n_heads=64,
        n_kv_heads=8,
        n_embd=2880,
        head_dim=64,
        mlp_ratio=1.0,
        n_experts=32,
        top_k=4,
        description="gpt-oss-20b's shape: 20.9B parameters at vocab 201088",
    ),
}

#: The releases' clamped SwiGLU: the sigmoid's gain and the clamp.
DEFAULT_ALPHA, DEFAULT_LIMIT = 1.702, 7.0


@dataclass(frozen=True)
class ClampedSwiGLU(GatedActivation):
    """GPT-OSS's expert activation: the gate clamped above at ``limit``, the up projection to
    ``[-limit, limit]``, then ``(up + 1) * gate * sigmoid(alpha * gate)``."""

    alpha: float = DEFAULT_ALPHA
    limit: float = DEFAULT_LIMIT

    def combine(self, h_gate: jax.Array, h_up: jax.Array) -> jax.Array:
        gate = jnp.minimum(h_gate, self.limit)
        up = jnp.clip(h_up, -self.limit, self.limit)
        return (up + 1.0) * gate * jax.nn.sigmoid(self.alpha * gate)


class GptOssAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` with a learned logit per head, ``sinks`` ``[heads]``, joining every
    row's softmax (in training and against the KV cache); the sliding layers rotate as the full ones do
    (``rope_scaling`` on every layer). XLA's attention computes it (no fused kernel takes the sink), in
    query blocks against the keys each block sees, as for any attention off cuDNN."""

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        theta, scaling = self.position_spec.theta, self.position_spec.scaled
        return rotate(q, positions, theta, scaling), rotate(k, positions, theta, scaling)

    def _sinks(self, n_heads: int) -> jax.Array:
        """``sinks`` ``[heads]``: a learned logit per head in each row's softmax."""
        sink: jax.Array = param(self, "sinks", normal(self.init_std), (n_heads,), (Axis.HEADS,))
        return sink


class GptOssMoE(MoE):
    """:class:`MoE` whose router adds a bias to its logits (``router_logit_bias`` ``[expert]``; the
    softmax over the top-k logits is the softmax router with ``norm_topk_prob``) and whose experts
    have biases (``gate_bias`` / ``up_bias`` ``[expert, mlp]``, ``down_bias`` ``[expert, embed]``)
    and the activation :class:`ClampedSwiGLU` (``architecture/moe/swiglu_alpha``, ``swiglu_limit``).

    The gate and up biases ride on the shared expert paths as one more input row of their kernels
    (each token gains a constant 1), so every dispatch (dropless, capacity, expert-parallel) runs
    them; the down bias is added after, weighted as its expert's output is.
    """

    swiglu_alpha: float = field(
        "architecture/moe/swiglu_alpha", default=DEFAULT_ALPHA, help="GPT-OSS experts: the SwiGLU sigmoid's gain"
    )
    swiglu_limit: float = field(
        "architecture/moe/swiglu_limit",
        default=DEFAULT_LIMIT,
        help="GPT-OSS experts: the gate is clamped above, the up projection on both sides, at this",
    )

    def _expert_activation(self, activation: str) -> Any:
        if activation != "swiglu":
            raise ConfigError(f"GPT-OSS experts use the clamped SwiGLU; architecture/activation={activation!r}")
        return ClampedSwiGLU(float(self.swiglu_alpha), float(self.swiglu_limit))

    def _router_logits(self, tokens: jax.Array, spec: MoESpec) -> jax.Array:
        bias = param(self, "router_logit_bias", normal(self.init_std), (spec.n_experts,), (Axis.EXPERT,))
        return super()._router_logits(tokens, spec) + bias.astype(jnp.float32)

    def _experts(
        self, tokens: jax.Array, routing: Routing, kernels: Kernels, act: Any, spec: MoESpec
    ) -> tuple[jax.Array, jax.Array | None]:
        gate, up, down = kernels
        if gate is None:
            raise ConfigError("GPT-OSS experts are gated (architecture/activation=swiglu)")
        e, f, d, dtype = spec.n_experts, spec.expert_hidden, tokens.shape[-1], self._activation_dtype
        zeros = nn.initializers.zeros_init()
        gate_bias, up_bias = (
            cast(param(self, f"{name}_bias", zeros, (e, f), (Axis.EXPERT, Axis.MLP)), dtype) for name in ("gate", "up")
        )
        down_bias = cast(param(self, "down_bias", zeros, (e, d), (Axis.EXPERT, Axis.EMBED)), dtype)
        biased = (jnp.concatenate([gate, gate_bias[:, None]], 1), jnp.concatenate([up, up_bias[:, None]], 1), down)
        ones = jnp.ones((tokens.shape[0], 1), tokens.dtype)
        out, kept = super()._experts(jnp.concatenate([tokens, ones], 1), routing, biased, act, spec)
        weights = routing.weights if kept is None else jnp.where(kept, routing.weights, 0.0)
        return out + jnp.einsum("nk,nkd->nd", weights.astype(out.dtype), down_bias[routing.experts]), kept


class GptOssBlock(MoEBlock):
    """:class:`MoEBlock` of :class:`GptOssAttention` and :class:`GptOssMoE`."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = GptOssAttention
    MOE: ClassVar[type[MoE]] = GptOssMoE


class GptOss(InterleavedWindows, MixtureLM, Llama):
    """GPT-OSS: :class:`Llama`'s pre-norm blocks (RMSNorm, grouped-query attention with RoPE, untied
    head) with biases on the query/key/value/output projections, a learned attention sink per head,
    ``architecture/layer_types`` (None: sliding and full layers alternating, the first sliding) giving
    ``architecture/sliding_window`` (None: 128, at most the block size) to the sliding layers, and
    feed-forwards that are softmax-routed mixtures (top-k logits of a biased router, softmaxed) of
    biased experts with the clamped SwiGLU (``architecture/moe/swiglu_alpha``, default 1.702, and
    ``architecture/moe/swiglu_limit``, default 7: keys of the mixture layers). Every layer rotates
    with the same RoPE; the releases use ``architecture/rope_theta=150000`` with YaRN (factor 32 over
    4096 positions, ramp ends not rounded), which ``hf/import`` reads from ``config.json``.

    Presets (``architecture/preset``): ``tiny`` (2 layers, 4 experts, top 2) and ``gpt-oss-20b``
    (the published shape; 20.9B parameters at ``architecture/vocab_size=201088``). ``hf/import`` of a
    ``model_type: gpt_oss`` checkpoint (unquantized: the MXFP4 releases need dequantizing) builds
    this model. See :class:`Llama` and :class:`~theseus.model.models.mixtral.model.Mixtral` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GPT_OSS_PRESETS
    FAMILY: ClassVar[str] = "GptOss"
    BLOCK = GptOssBlock
    USE_BIAS: ClassVar[bool] = True
    DEFAULT_WINDOW: ClassVar[int] = 128
    FULL_EVERY: ClassVar[int] = 2


__all__ = ["GPT_OSS_PRESETS", "ClampedSwiGLU", "GptOss", "GptOssAttention", "GptOssBlock", "GptOssMoE"]
