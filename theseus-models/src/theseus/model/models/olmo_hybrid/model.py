"""``OLMoHybrid``: OLMo 3's attention layers (post-norm, query/key norms over the whole projections, no window)
between Gated DeltaNet layers (pre-norm, separate query, key, value, a, b and output-gate projections)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.config import field
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION, CausalSelfAttention
from theseus.model.models.olmo2.model import OLMo2
from theseus.model.models.qwen3_next.model import HybridBlock, HybridPreset, LinearAttentionLM, Qwen3NextArchitecture
from theseus.model.stack.architecture import Architecture, Preset

#: The epsilon of the Gated DeltaNet's gated output norm (the FLA kernel's default, which the releases use).
GATE_NORM_EPS = 1e-5


def default_layer_types(n_layers: int, every: int) -> tuple[str, ...]:
    """Every ``every``-th layer full attention, the rest linear; the last layer full when no other is."""
    types = [FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(n_layers)]
    if FULL_ATTENTION not in types and types:
        types[-1] = FULL_ATTENTION
    return tuple(types)


OLMO_HYBRID_PRESETS: dict[str, Preset] = {
    "tiny": HybridPreset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        n_embd=64,
        mlp_ratio=2.0,
        linear_key_heads=4,
        linear_value_heads=4,
        linear_key_dim=12,
        linear_value_dim=24,
        description="4 layers (full attention at 3), 64 wide; tests and demos",
    ),
    # transformers' OlmoHybridConfig defaults (allenai/Olmo-Hybrid-7B): 32 layers, every 4th full attention
    # (30 heads of 128, no grouping), the others Gated DeltaNet (30 query/key heads of 96, 30 value heads of
    # 192, convolution of 4), 3840 wide, intermediate 11008, untied head; 7,430,870,688 parameters at vocab
    # 100352 (transformers' count on the meta device).
    "olmo-hybrid-7b": HybridPreset(
        n_layers=32,
        n_heads=30,
        n_kv_heads=30,
        n_embd=3840,
        head_dim=128,
        mlp_ratio=11008 / 3840,
        linear_key_heads=30,
        linear_value_heads=30,
        linear_key_dim=96,
        linear_value_dim=192,
        description="Olmo-Hybrid-7B's shape: 7.43B parameters at vocab 100352",
    ),
}


@dataclass(frozen=True)
class OLMoHybridArchitecture(Qwen3NextArchitecture):
    """A :class:`Qwen3NextArchitecture` (the Gated DeltaNet's shape) with the write strength's scale
    (``linear_beta_scale``: 2 where the state's transition may have negative eigenvalues)."""

    linear_beta_scale: float = 2.0


class OLMoHybridAttention(CausalSelfAttention):
    """OLMo 3's attention on OLMo Hybrid's ``full_attention`` layers: no window on any layer (the other
    ``layer_types`` entries are Gated DeltaNet layers)."""

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        return self.attention_spec.sliding_window


class OLMoHybridBlock(HybridBlock):
    """:class:`HybridBlock` of one OLMo Hybrid layer: with ``linear`` a pre-norm block around a
    :class:`~theseus.model.layers.deltanet.GatedDeltaNet` (its output norm of epsilon 1e-5, its write
    strength scaled by ``linear_beta_scale``), else OLMo 3's post-norm attention block."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = OLMoHybridAttention
    LINEAR_ARCHITECTURE: ClassVar[type[Qwen3NextArchitecture]] = OLMoHybridArchitecture
    LINEAR_NEEDS: ClassVar[str] = (
        "OLMo Hybrid's linear-attention layers need an OLMoHybridArchitecture (model/olmo_hybrid)"
    )

    def placement(self) -> str:
        return "pre" if self.linear else super().placement()

    def linear_options(self) -> dict[str, Any]:
        arch = self.arch
        beta_scale = arch.linear_beta_scale if isinstance(arch, OLMoHybridArchitecture) else 1.0
        return {**super().linear_options(), "norm_eps": GATE_NORM_EPS, "beta_scale": beta_scale}


class OLMoHybrid(LinearAttentionLM, OLMo2):
    """OLMo Hybrid: per ``architecture/layer_types`` (None: every ``architecture/full_attention_interval``-th
    layer full, the last one if no other) a ``full_attention`` layer as OLMo 3's (norms after each branch,
    query/key RMSNorm over the whole projections, no window) or a ``linear_attention`` layer, pre-norm around a
    Gated DeltaNet (``architecture/linear_num_key_heads`` query/key heads of ``linear_key_head_dim``,
    ``linear_num_value_heads`` value heads of ``linear_value_head_dim``, a causal convolution of
    ``linear_conv_kernel_dim``, the write strength doubled with ``architecture/linear_allow_neg_eigval``,
    a gated output norm of epsilon 1e-5). Plain-scale RMSNorms, an untied head. ``architecture/rotary`` false
    (the releases): no position embedding at all; true: RoPE of ``architecture/rope_theta`` on the attention
    layers.

    The two kinds of layer have different parameters: a scanned model (``model/scan_layers``) runs one period
    of ``layer_types`` per scan step. Presets: ``tiny`` and ``olmo-hybrid-7b``. ``hf/import`` of ``model_type:
    olmo_hybrid`` builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = OLMO_HYBRID_PRESETS
    FAMILY: ClassVar[str] = "OLMoHybrid"
    LINEAR_FAMILY: ClassVar[str] = "OLMo Hybrid"
    BLOCK = OLMoHybridBlock
    TIED_EMBEDDINGS: ClassVar[bool] = False

    linear_allow_neg_eigval: bool = field(
        "architecture/linear_allow_neg_eigval",
        default=True,
        help="OLMo Hybrid: the Gated DeltaNet's write strength 2 * sigmoid(b) (negative eigenvalues), else sigmoid(b)",
    )
    rotary: bool = field(
        "architecture/rotary",
        default=False,
        help="OLMo Hybrid: RoPE on the attention layers (false: no position embedding, as the releases)",
    )

    def default_layer_types(self, n_layers: int, every: int) -> tuple[str, ...]:
        return default_layer_types(n_layers, every)

    def linear_extras(self, arch: Architecture) -> dict[str, Any]:
        """The write strength's scale, and no position embedding unless ``architecture/rotary``."""
        extras: dict[str, Any] = {"linear_beta_scale": 2.0 if self.linear_allow_neg_eigval else 1.0}
        if not self.rotary:
            extras["position"] = dataclasses.replace(arch.position, kind="none")
        return extras


__all__ = [
    "OLMO_HYBRID_PRESETS",
    "OLMoHybrid",
    "OLMoHybridArchitecture",
    "OLMoHybridAttention",
    "OLMoHybridBlock",
    "default_layer_types",
]
