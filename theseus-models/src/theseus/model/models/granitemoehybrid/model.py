"""``GraniteMoeHybrid``: IBM's Granite 4 hybrids. Per ``layer_types`` each layer's token mixer is a Mamba-2 mixer
(:class:`~theseus.model.layers.mamba2.Mamba2`, ``mamba``) or grouped-query attention (``full_attention``, RoPE or
none), then a softmax-routed mixture of SwiGLU experts beside an always-on shared SwiGLU MLP (or the shared MLP
alone: ``architecture/moe/n_experts`` 0); pre-norm RMSNorms, no biases. Granite's multipliers scale the
embeddings, every branch's output before its residual sum, the attention scores and the logits.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child, optional_key
from theseus.model.layers.attention import FULL_ATTENTION, CausalSelfAttention
from theseus.model.layers.mamba2 import MAMBA, Mamba2, MambaSpec
from theseus.model.models.llama.model import Llama
from theseus.model.models.nemotron_h.model import NemotronHAttention
from theseus.model.module import Module
from theseus.model.stack.architecture import (
    Architecture,
    Preset,
    architecture_as,
    extend_architecture,
    lookup_preset_as,
)
from theseus.model.stack.mamba import MambaLM, MambaPreset
from theseus.model.stack.mixture import MixtureLM, MoEBlock, MoEPreset

#: The layer kinds of a Granite 4 hybrid.
KINDS = (MAMBA, FULL_ATTENTION)


@dataclass(frozen=True)
class GraniteMoeHybridPreset(MoEPreset, MambaPreset):
    """A :class:`MoEPreset` (the routed experts; ``shared_hidden`` the shared MLP's width, ``d_ff`` the dense
    width) with the Mamba-2 mixers' shape (:class:`MambaPreset`) and the layer kinds (None: a Mamba-2 mixer
    in every layer but the middle one)."""

    layer_types: tuple[str, ...] | None = None
    n_shared: int = 1


GRANITE_MOE_HYBRID_PRESETS: dict[str, Preset] = {
    "tiny": GraniteMoeHybridPreset(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        mlp_ratio=1.0,
        n_experts=4,
        expert_hidden=32,
        shared_hidden=64,
        mamba_heads=4,
        layer_types=(MAMBA, FULL_ATTENTION),
        description="2 layers (mamba, attention), mixtures of 4 experts of 32 (top 2) + a shared MLP of 64",
    ),
    # transformers' GraniteMoeHybridConfig defaults (the configuration class states no released size): 32
    # Mamba-2 layers 4096 wide (128 heads of 64, one group, a state of 256), each with a mixture of 8 experts of
    # 11008 (top 2) and a shared MLP of 1024; 32 attention heads (unused by these layers); 38.60B parameters at
    # vocab 32000 (transformers' count of the same configuration on the meta device).
    "granitemoehybrid-defaults": GraniteMoeHybridPreset(
        n_layers=32,
        n_heads=32,
        n_kv_heads=32,
        n_embd=4096,
        mlp_ratio=1024 / 4096,
        n_experts=8,
        top_k=2,
        expert_hidden=11008,
        shared_hidden=1024,
        mamba_heads=128,
        mamba_head_dim=64,
        mamba_state=256,
        mamba_groups=1,
        layer_types=(MAMBA,) * 32,
        description="transformers' GraniteMoeHybridConfig defaults: 38.60B parameters at vocab 32000",
    ),
}


@dataclass(frozen=True)
class GraniteMoeHybridArchitecture(Architecture):
    """An :class:`Architecture` with the Mamba-2 mixers' :class:`MambaSpec` (the ``mamba`` layers of
    ``layer_types``)."""

    mamba: MambaSpec = MambaSpec(n_heads=4, head_dim=32, state_size=16, n_groups=1)


class GraniteMoeHybridBlock(MoEBlock):
    """:class:`MoEBlock` of one Granite 4 layer, ``kind`` one of :data:`KINDS`: ``attn`` is a Mamba-2 mixer
    (``mamba``) or attention (``full_attention``), ``mlp`` the mixture with its shared MLP (a dense MLP
    without experts); both branches' outputs are times ``architecture.residual_multiplier``."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = NemotronHAttention
    MIXERS: ClassVar[tuple[type, ...]] = (Mamba2,)

    kind: str = FULL_ATTENTION

    def attention(self) -> Module:
        if self.kind != MAMBA:
            return super().attention()
        message = "Granite's Mamba-2 layers need a GraniteMoeHybridArchitecture (model/granitemoehybrid)"
        arch = architecture_as(self.arch, GraniteMoeHybridArchitecture, message)
        layer: Mamba2 = child(
            self, Mamba2, **arch.mamba.layer_options(), norm_eps=arch.norm.eps, out_std=self.out_std, n_embd=arch.n_embd
        )
        return layer


def granite_field(key: str, default: Any, help: str) -> Any:
    """An ``architecture/<key>`` key of Granite's."""
    return field(f"architecture/{key}", default=default, help=f"Granite: {help}")


class GraniteMoeHybrid(MixtureLM, Llama, MambaLM):
    """Granite 4 hybrids: per ``architecture/layer_types`` a Mamba-2 mixer (``mamba``: the chunked state-space
    scan with its gated group norm, its state cached for decoding) or grouped-query attention
    (``full_attention``; RoPE with ``architecture/rotary``, none without, as the releases), each followed by a
    softmax-routed mixture of ``architecture/moe/n_experts`` SwiGLU experts of ``moe/expert_hidden`` (top
    ``moe/top_k``, the weights renormalised) plus a shared SwiGLU MLP of ``moe/shared_hidden`` that every token
    passes through; ``moe/n_experts`` 0: the shared MLP alone, a dense MLP of ``architecture/d_ff``. Pre-norm
    RMSNorms, no biases, the head tied or not (``architecture/tied_embeddings``). The mixers' shape: the
    ``architecture/mamba_*`` keys (:class:`~theseus.model.stack.mamba.MambaLM`).

    Granite's multipliers: ``architecture/embedding_multiplier`` (the token embeddings),
    ``residual_multiplier`` (each branch's output before its residual sum), ``attention_multiplier`` (the
    attention's score scale in place of ``1 / sqrt(head_dim)``; None: that) and ``logits_scaling`` (the
    logits divided).

    Presets: ``tiny`` (tests) and ``granitemoehybrid-defaults`` (transformers' configuration defaults; 38.60B
    parameters at ``architecture/vocab_size=32000``). ``hf/import`` of ``model_type: granitemoehybrid`` builds
    it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GRANITE_MOE_HYBRID_PRESETS
    FAMILY: ClassVar[str] = "GraniteMoeHybrid"
    BLOCK = GraniteMoeHybridBlock  # type: ignore[assignment]  # a MoEBlock with Mamba-2 layers

    layer_types: tuple[str, ...] | None = optional_key(
        "architecture/layer_types", "Granite: mamba | full_attention per layer", "the preset's"
    )
    rotary: bool = granite_field("rotary", False, "RoPE on the attention layers (false: none, as the releases)")
    embedding_multiplier: float = granite_field("embedding_multiplier", 1.0, "multiplier of the token embeddings")
    residual_multiplier: float = granite_field(
        "residual_multiplier", 1.0, "multiplier of each branch's output before its residual sum"
    )
    attention_multiplier: float | None = optional_key(
        "architecture/attention_multiplier", "Granite: the attention's score scale", "1 / sqrt(head_dim)"
    )
    logits_scaling: float = granite_field("logits_scaling", 1.0, "divisor of the logits")

    def _preset(self) -> GraniteMoeHybridPreset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, GraniteMoeHybridPreset)

    def _types(self, preset: GraniteMoeHybridPreset) -> tuple[str, ...]:
        n_layers = preset.n_layers if self.n_layers is None else self.n_layers
        types = self.layer_types if self.layer_types is not None else preset.layer_types
        if types is None:
            types = tuple(FULL_ATTENTION if i == n_layers // 2 else MAMBA for i in range(n_layers))
        if len(types) != n_layers or not set(types) <= set(KINDS):
            raise ConfigError(
                f"architecture/layer_types={list(types)} must give each of the {n_layers} layers one of "
                f"{', '.join(KINDS)}"
            )
        return tuple(types)

    def _extra_architecture(self) -> dict[str, Any]:
        """The layer kinds and the multipliers: ``attention_multiplier`` as the score scale
        (``query_pre_attn_scalar`` ``1 / m^2``), ``logits_scaling`` as the logits' multiplier ``1 / s``."""
        scale, logits = self.attention_multiplier, float(self.logits_scaling)
        for key, value in (("attention_multiplier", scale), ("logits_scaling", logits)):
            if value is not None and not (math.isfinite(float(value)) and float(value) > 0):
                raise ConfigError(f"architecture/{key}={value} must be a positive number")
        return {
            **super()._extra_architecture(),
            "layer_types": self._types(self._preset()),
            "query_pre_attn_scalar": None if scale is None else 1.0 / float(scale) ** 2,
            "embedding_multiplier": float(self.embedding_multiplier),
            "residual_multiplier": float(self.residual_multiplier),
            "logits_multiplier": 1.0 / logits,
        }

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        if not self.rotary:
            arch = dataclasses.replace(arch, position=dataclasses.replace(arch.position, kind="none"))
        spec = self.mamba_spec(self._preset())
        return extend_architecture(arch, GraniteMoeHybridArchitecture, mamba=spec)

    def _layer_options(self, layer: int) -> dict[str, Any]:
        types = self.architecture.layer_types or ()
        return {**super()._layer_options(layer), "kind": types[layer]}


__all__ = [
    "GRANITE_MOE_HYBRID_PRESETS",
    "KINDS",
    "GraniteMoeHybrid",
    "GraniteMoeHybridArchitecture",
    "GraniteMoeHybridBlock",
    "GraniteMoeHybridPreset",
]
