"""``Glm4Moe``: GLM-4.5, 4.6 and 4.7: grouped-query attention with query/key/value biases, partial RoPE and
optional per-head query/key norms, leading dense layers, then DeepSeek-V3's sigmoid-routed mixture with
shared experts.

The attention is :class:`Glm4MoeAttention` (the shared
:class:`~theseus.model.layers.attention.PartialRotaryAttention` with GLM's default fraction, 0.5); the
mixture is the shared :class:`~theseus.model.layers.moe.MoE` with its sigmoid router (a per-expert
selection bias, groups, ``routed_scaling_factor``) and ``n_shared`` shared experts.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from theseus.config import field
from theseus.model.layers.attention import CausalSelfAttention, PartialRotaryAttention, rotary_fraction_field
from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Architecture, Preset
from theseus.model.stack.mixture import MixtureLM, MoEBlock, SigmoidRoutingPreset


@dataclass(frozen=True)
class Glm4MoePreset(SigmoidRoutingPreset):
    """A :class:`SigmoidRoutingPreset`: GLM-4.5 routes as DeepSeek-V3 (the sigmoid router, one shared expert,
    the first layer dense)."""


GLM4_MOE_PRESETS: dict[str, Preset] = {
    "tiny": Glm4MoePreset(
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=3.0,
        expert_hidden=32,
        n_group=2,
        description="3 layers (1 dense) of 8 experts (top 2 of 1 group of 2, 1 shared) of 32, 64 wide; tests",
    ),
    # zai-org/GLM-4.5-Air's config.json: 46 layers (the first dense, intermediate 10944), 96 query and 8
    # key/value heads of 128 with query/key/value biases, half of each head rotated, 4096 wide, 128 routed
    # experts of moe_intermediate 1408 (8 per token, one group, unscaled) and 1 shared, no query/key norms,
    # untied head; 106.9B parameters (13.4B active, 12.2B without the embedding and the head) at vocab
    # 151552 (transformers' count with the router biases, the multi-token-prediction layer not counted).
    "glm-4.5-air": Glm4MoePreset(
        n_layers=46,
        n_heads=96,
        n_kv_heads=8,
        n_embd=4096,
        head_dim=128,
        mlp_ratio=10944 / 4096,
        n_experts=128,
        top_k=8,
        expert_hidden=1408,
        description="GLM-4.5-Air's shape: 106.9B parameters (13.4B active) at vocab 151552",
    ),
}


class Glm4MoeAttention(PartialRotaryAttention):
    """:class:`CausalSelfAttention` whose RoPE turns the leading ``architecture/partial_rotary_factor``
    of each query/key head (GLM-4.5's 0.5); the rest pass unrotated."""

    partial_rotary_factor: float = rotary_fraction_field(0.5)


class Glm4MoeBlock(MoEBlock):
    """:class:`MoEBlock` whose attention is :class:`Glm4MoeAttention`."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Glm4MoeAttention


class Glm4Moe(MixtureLM, Llama):
    """GLM-4.5 (transformers' ``glm4_moe``; also GLM-4.6 and 4.7): :class:`Llama`'s pre-norm blocks (RMSNorm,
    grouped-query attention, SwiGLU, untied head) with

    * biases on the query, key and value projections and none on the output (``architecture/attention_bias``
      and ``attention_out_bias`` left None; set them to change either);
    * RoPE on the leading ``architecture/partial_rotary_factor`` (default 0.5) of each head
      (:class:`Glm4MoeAttention`);
    * with ``architecture/qk_norm`` (GLM-4.5 and 4.6 set it, Air does not), each query and key head
      RMS-normalised (``query_norm`` / ``key_norm``, ``scale`` ``[head_dim]``) before RoPE;
    * the leading ``architecture/moe/first_k_dense`` layers dense (``architecture/d_ff``), the others a
      mixture of SwiGLU experts of ``architecture/moe/expert_hidden`` with DeepSeek-V3's sigmoid router (a
      per-expert balancing bias, ``n_group`` / ``topk_group``, ``routed_scaling_factor``) and ``n_shared``
      shared experts.

    The ``architecture/moe/*`` keys left None take the preset's shape and routing (``hf/import`` reads every
    one from ``config.json``). The multi-token-prediction layer the releases ship is not part of the model.

    Presets (``architecture/preset``): ``tiny`` (3 layers, the first dense, 8 experts of 32 in 2 groups) and
    ``glm-4.5-air`` (the published GLM-4.5-Air shape: 106.9B parameters, 13.4B active per token, at
    ``architecture/vocab_size=151552``; the release sets ``architecture/rope_theta=1e6`` and
    ``architecture/norm_eps=1e-5``, which ``hf/import`` reads from ``config.json``).
    """

    PRESETS: ClassVar[dict[str, Preset]] = GLM4_MOE_PRESETS
    FAMILY: ClassVar[str] = "Glm4Moe"
    BLOCK: ClassVar[type[MoEBlock]] = Glm4MoeBlock

    qk_norm: bool = field(
        "architecture/qk_norm",
        default=False,
        help="GLM-4.5: RMS-normalise each query and key head (with weights) before RoPE",
    )

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        attention = dataclasses.replace(
            arch.attention,
            qkv_bias=True if self.attention_bias is None else self.attention_bias,
            out_bias=False if self.attention_out_bias is None else self.attention_out_bias,
            qk_norm=self.qk_norm,
        )
        return dataclasses.replace(arch, attention=attention).validate()


__all__ = ["GLM4_MOE_PRESETS", "Glm4Moe", "Glm4MoeAttention", "Glm4MoeBlock", "Glm4MoePreset"]
