"""``DeepseekV3``: multi-head latent attention and a sigmoid-routed mixture of experts (DeepSeek-V3)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.base.axis import ShardingPlan
from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import INIT_STD, child
from theseus.model.layers.latent_attention import LatentAttention, MLAKeys
from theseus.model.models.deepseek_v3.mtp import (
    MTPModule,
    deepseek_architecture,
    latent,
    mtp_depth,
    multi_token_prediction,
)
from theseus.model.models.llama.model import Llama
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset
from theseus.model.stack.block import LayerCall, detached_child
from theseus.model.stack.mixture import MixtureLM, MoEBlock, SigmoidRoutingPreset


@dataclass(frozen=True)
class DeepseekV3Preset(SigmoidRoutingPreset):
    """A :class:`SigmoidRoutingPreset` (DeepSeek's routing as its defaults) with the latent attention's widths."""

    q_lora_rank: int = 0
    kv_lora_rank: int = 16
    qk_nope_head_dim: int = 16
    qk_rope_head_dim: int = 8
    v_head_dim: int = 16


DEEPSEEK_V3_PRESETS: dict[str, Preset] = {
    "tiny": DeepseekV3Preset(
        n_layers=3,
        n_heads=4,
        n_embd=64,
        mlp_ratio=3.0,
        expert_hidden=32,
        q_lora_rank=32,
        n_group=2,
        routed_scaling_factor=2.5,
        description="3 layers (1 dense) of 8 experts (top 2, 1 shared) of width 32, 64 wide; tests and demos",
    ),
    # deepseek-ai/DeepSeek-V3's config.json: 61 layers (the first 3 dense, intermediate 18432), 128 heads,
    # 7168 wide, 256 routed experts of moe_intermediate 2048 (8 per token from 4 of 8 groups, scaled 2.5)
    # and 1 shared; query rank 1536, latent 512, head widths 128 + 64 (rotated) and values 128, untied
    # head; 671B parameters (37B active) at vocab 129280, the multi-token-prediction module not counted.
    "deepseek-v3": DeepseekV3Preset(
        n_layers=61,
        n_heads=128,
        n_embd=7168,
        mlp_ratio=18432 / 7168,
        n_experts=256,
        top_k=8,
        expert_hidden=2048,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        first_k_dense=3,
        n_group=8,
        topk_group=4,
        routed_scaling_factor=2.5,
        description="DeepSeek-V3's shape: 671B parameters (37B active) at vocab 129280",
    ),
}


class DeepseekV3Block(MoEBlock):
    """:class:`MoEBlock` whose attention is :attr:`LATENT` (:class:`LatentAttention`)."""

    #: The latent attention layer when :meth:`latent_options` configures it (a subclass may name its own).
    LATENT: ClassVar[type[LatentAttention]] = LatentAttention

    @classmethod
    def components(cls) -> list[type]:
        latent: list[type] = [LatentAttention, cls.LATENT]
        return [*super().components(), *dict.fromkeys(latent)]

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan.union(super().sharding, LatentAttention().sharding, self.LATENT().sharding)

    def latent_options(self) -> dict[str, Any] | None:
        """Fields of :attr:`LATENT` beyond :class:`LatentAttention`'s (none here); None: the
        architecture does not configure it, and the layer is a plain :class:`LatentAttention`."""
        return {}

    def attention(self) -> Module:
        arch = self.arch
        mla = latent(arch)
        if mla is None:
            return super().attention()
        options = self.latent_options()
        attention: LatentAttention = child(
            self,
            LatentAttention if options is None else self.LATENT,
            **dataclasses.asdict(mla),
            **(options or {}),
            n_embd=arch.n_embd,
            n_heads=arch.attention.n_heads,
            dropout=arch.dropout,
            attention_impl=arch.attention.implementation,
            position=arch.position,
            out_std=self.out_std,
        )
        return attention


class DeepseekV3MTP(MTPModule):
    """A multi-token-prediction depth of DeepSeek-V3: its layer is a :class:`DeepseekV3Block`."""

    BLOCK: ClassVar[type[Module]] = DeepseekV3Block


class DeepseekV3(MLAKeys, MixtureLM, Llama):
    """DeepSeek-V3: RMSNorm pre-norm layers with multi-head latent attention
    (:class:`~theseus.model.layers.latent_attention.LatentAttention`, ``architecture/mla/*``: a
    compressed key/value latent, which the KV cache holds) and, from ``architecture/moe/first_k_dense``
    on, a mixture of SwiGLU experts with a sigmoid router, a per-expert balancing bias, group-limited
    choice (``n_group`` / ``topk_group``), ``routed_scaling_factor`` and ``n_shared`` shared experts
    (:class:`~theseus.model.layers.moe.MoE`); the leading layers have a dense MLP of
    ``architecture/d_ff``. The head is untied.

    The ``architecture/mla/*`` keys left None take the preset's widths, and the ``architecture/moe/*``
    keys left None its shape and routing (``hf/import`` reads every one from ``config.json``).
    RoPE keys as :class:`Llama`'s (the releases use ``yarn``, with ``architecture/mla/mscale_all_dim``); they set
    ``architecture/norm_eps=1e-6``.

    Presets (``architecture/preset``): ``tiny`` (3 layers, the first dense, 8 experts of 32 in 2 groups,
    top 2 of 1 group, 1 shared) and ``deepseek-v3`` (the published shape: 671B parameters, 37B active
    per token, at ``architecture/vocab_size=129280``). ``hf/import`` of a ``model_type: deepseek_v3``
    checkpoint builds this model.

    **Multi-token prediction** (:mod:`theseus.model.models.deepseek_v3.mtp`): ``architecture/mtp_depth``
    modules (``mtp_0``, ``mtp_1``, ...; default 0: none; the releases have 1) each predict one token
    further ahead from the previous depth's hidden state and the next token's embedding, through one
    mixture layer and the shared head. In training ``model/mtp_weight`` (default 0.3, the report's
    lambda for most of training) times the mean of their cross-entropies joins the loss, and
    ``mtp_loss`` (that mean) is logged; decoding and calls without targets skip them.
    """

    PRESETS: ClassVar[dict[str, Preset]] = DEEPSEEK_V3_PRESETS
    FAMILY: ClassVar[str] = "DeepseekV3"
    BLOCK: ClassVar[type[MoEBlock]] = DeepseekV3Block
    #: The multi-token-prediction depth the model builds (its layer a :attr:`BLOCK`).
    MTP: ClassVar[type[MTPModule]] = DeepseekV3MTP

    mtp_depth: int = field(
        "architecture/mtp_depth",
        default=0,
        min=0,
        help="multi-token-prediction modules after the last layer (DeepSeek-V3: 1); 0: none",
    )
    mtp_weight: float = field(
        "model/mtp_weight",
        default=0.3,
        min=0.0,
        help="factor on the mean multi-token-prediction cross-entropy added to the training loss "
        "(the DeepSeek-V3 report's lambda)",
    )

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), cls.MTP]

    def flops(self, seq: int) -> int:
        """The main model's FLOPs (head and layers) plus each multi-token-prediction depth's own
        (:meth:`~theseus.model.models.deepseek_v3.mtp.MTPModule.flops`). Works unbound."""
        arch = self.architecture
        depth = mtp_depth(arch)
        extra = depth * detached_child(self, self.MTP, architecture=arch).flops(seq) if depth else 0
        return super().flops(seq) + extra

    def setup(self) -> None:
        super().setup()
        arch = self.architecture
        depth = mtp_depth(arch)
        if depth:
            out_std = INIT_STD / math.sqrt(2 * arch.n_layers)
            self.mtp = [child(self, self.MTP, architecture=arch, out_std=out_std) for _ in range(depth)]

    def __call__(
        self,
        x: jax.Array,
        y: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
    ) -> tuple[jax.Array, jax.Array | None]:
        h, _mask, positions = self.hidden(x, padding_mask, deterministic, decode)
        logits, loss = self.logits_and_loss(self.final_norm(h), y, padding_mask)
        if mtp_depth(self.architecture) and not decode and (y is not None or self.is_initializing()):
            call = LayerCall(padding_mask, positions, deterministic)
            multi_token_prediction(self, self.mtp, h, x, y, call, self.mtp_weight)
        return logits, loss

    def resolve_architecture(self) -> Architecture:
        arch: Architecture = super(MixtureLM, self).resolve_architecture()
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        widths: dict[str, int] = {}
        if isinstance(preset, DeepseekV3Preset):
            names = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            widths = {name: getattr(preset, name) for name in names}
        self._refuse_attention_keys(arch.attention.n_heads)
        mla = self.mla_spec(**widths)
        moe = self.mixture(arch.feed_forward.d_ff)
        attention = dataclasses.replace(arch.attention, head_dim=mla.qk_head_dim)
        arch = dataclasses.replace(arch.with_mixture(moe), attention=attention)
        return deepseek_architecture(arch, mla, self.mtp_depth).validate()

    def _refuse_attention_keys(self, n_heads: int) -> None:
        """The dense attention's keys that latent attention has no use for: one line, not ignored."""
        set_keys = {
            "architecture/sliding_window": self.sliding_window,
            "architecture/head_dim": self.head_dim,
            "architecture/attention_bias": self.attention_bias or None,
            "architecture/attention_out_bias": self.attention_out_bias or None,
            "architecture/n_kv_heads": None if self.n_kv_heads in (None, n_heads) else self.n_kv_heads,
        }
        for key, value in set_keys.items():
            if value is not None:
                raise ConfigError(
                    f"{key}={value} does not apply to DeepSeek-V3's latent attention (its shape is "
                    "architecture/mla/*; one key/value per head, no window, no biases); remove it"
                )


__all__ = ["DEEPSEEK_V3_PRESETS", "DeepseekV3", "DeepseekV3Block", "DeepseekV3MTP", "DeepseekV3Preset"]
