"""``KimiLinear``: Kimi Linear (Kimi-Linear-48B-A3B): Kimi Delta Attention layers between multi-head latent
attention layers without position embeddings, under DeepSeek-V3's sigmoid-routed mixture of experts."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION
from theseus.model.layers.deltanet import CHUNK
from theseus.model.layers.kda import KimiDeltaAttention
from theseus.model.models.deepseek_v3.model import DeepseekV3, DeepseekV3Block, DeepseekV3Preset
from theseus.model.models.deepseek_v3.mtp import DeepseekV3Architecture
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset


def default_layer_types(n_layers: int) -> tuple[str, ...]:
    """transformers' default: layers 4, 8, 12, ... (from 0) full attention, the others linear."""
    return tuple(FULL_ATTENTION if i and i % 4 == 0 else LINEAR_ATTENTION for i in range(n_layers))


def full_at(n_layers: int, full: tuple[int, ...]) -> tuple[str, ...]:
    """``full_attention`` at the layers ``full`` (from 0), ``linear_attention`` elsewhere."""
    return tuple(FULL_ATTENTION if i in full else LINEAR_ATTENTION for i in range(n_layers))


@dataclass(frozen=True)
class KimiLinearPreset(DeepseekV3Preset):
    """A :class:`DeepseekV3Preset` (latent attention, sigmoid routing) with Kimi Delta Attention's shape and
    the full-attention layers (``full_layers``, from 0; None: transformers' default rule)."""

    q_lora_rank: int = 0
    linear_heads: int = 32
    linear_head_dim: int = 128
    conv_kernel: int = 4
    full_layers: tuple[int, ...] | None = None


KIMI_LINEAR_PRESETS: dict[str, Preset] = {
    "tiny": KimiLinearPreset(
        n_layers=2,
        n_heads=4,
        n_embd=64,
        mlp_ratio=2.0,
        n_experts=4,
        top_k=2,
        expert_hidden=32,
        linear_heads=4,
        linear_head_dim=16,
        full_layers=(1,),
        routed_scaling_factor=2.446,
        description="2 layers (KDA, then latent attention with 4 experts of 32, top 2, 1 shared), 64 wide",
    ),
    # moonshotai/Kimi-Linear-48B-A3B-Instruct (transformers' KimiLinearConfig defaults): 27 layers, latent
    # attention (32 heads, no query bottleneck, latent 512, widths 128 + 64 unrotated, values 128) at layers
    # 4, 8, ..., 24 and 27 (from 1, the release's full_attn_layers), the others Kimi Delta Attention (32 heads
    # of 128, convolution of 4); 2304 wide, the first layer dense (9216), then 256 experts of 1024 (top 8,
    # scaled 2.446) and 1 shared; untied head; 49,122,681,728 parameters at vocab 163840 (transformers' count on
    # the meta device, 49,122,675,072, and the 26 routers' balancing biases it keeps as buffers).
    "kimi-linear-48b-a3b": KimiLinearPreset(
        n_layers=27,
        n_heads=32,
        n_embd=2304,
        mlp_ratio=9216 / 2304,
        n_experts=256,
        top_k=8,
        expert_hidden=1024,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        routed_scaling_factor=2.446,
        full_layers=(3, 7, 11, 15, 19, 23, 26),
        description="Kimi-Linear-48B-A3B's shape: 49.1B parameters at vocab 163840",
    ),
}


@dataclass(frozen=True)
class KimiLinearArchitecture(DeepseekV3Architecture):
    """A :class:`DeepseekV3Architecture` with Kimi Delta Attention's shape (the ``linear_attention`` layers)."""

    linear_heads: int = 32
    linear_head_dim: int = 128
    conv_kernel: int = 4
    linear_chunk: int = CHUNK


class KimiLinearBlock(DeepseekV3Block):
    """:class:`DeepseekV3Block` of one Kimi Linear layer: with ``linear`` its attention is a
    :class:`~theseus.model.layers.kda.KimiDeltaAttention`, else latent attention."""

    linear: bool = False

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), KimiDeltaAttention]

    def attention(self) -> Module:
        if not self.linear:
            return super().attention()
        arch = self.arch
        if not isinstance(arch, KimiLinearArchitecture):
            raise ConfigError("Kimi Linear's linear-attention layers need a KimiLinearArchitecture (model/kimi_linear)")
        layer: KimiDeltaAttention = child(
            self,
            KimiDeltaAttention,
            key_heads=arch.linear_heads,
            value_heads=arch.linear_heads,
            key_dim=arch.linear_head_dim,
            value_dim=arch.linear_head_dim,
            conv_kernel=arch.conv_kernel,
            chunk_size=arch.linear_chunk,
            norm_eps=arch.norm.eps,
            out_std=self.out_std,
            n_embd=arch.n_embd,
        )
        return layer


class KimiLinear(DeepseekV3):
    """Kimi Linear: pre-norm RMSNorm layers, per ``architecture/layer_types`` (None: the preset's) a
    ``linear_attention`` layer, Kimi Delta Attention (:class:`~theseus.model.layers.kda.KimiDeltaAttention`:
    ``architecture/linear_num_heads`` heads of ``linear_head_dim``, a convolution of ``linear_conv_kernel_dim``,
    a forget gate per key channel), or a ``full_attention`` layer, DeepSeek-V3's multi-head latent attention
    (``architecture/mla/*``) without position embeddings (NoPE: the ``qk_rope_head_dim`` part is unrotated). The
    feed-forwards are DeepSeek-V3's: dense for the first ``architecture/moe/first_k_dense`` layers, then a
    sigmoid-routed mixture with its balancing bias, ``routed_scaling_factor`` and shared experts. Untied head; no
    multi-token prediction.

    The two kinds of layer have different parameters: a scanned model runs one period of ``layer_types`` per
    scan step where they repeat. Presets: ``tiny`` and ``kimi-linear-48b-a3b``. ``hf/import`` of ``model_type:
    kimi_linear`` builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = KIMI_LINEAR_PRESETS
    FAMILY: ClassVar[str] = "KimiLinear"
    BLOCK = KimiLinearBlock

    layer_types: tuple[str, ...] | None = field(
        "architecture/layer_types",
        default=None,
        help="linear_attention | full_attention per layer (None: the preset's)",
    )
    linear_heads: int | None = field(
        "architecture/linear_num_heads", default=None, help="Kimi Linear: heads of the Kimi Delta Attention layers"
    )
    linear_head_dim: int | None = field(
        "architecture/linear_head_dim", default=None, help="Kimi Linear: head width of the Kimi Delta Attention layers"
    )
    conv_kernel: int | None = field(
        "architecture/linear_conv_kernel_dim", default=None, help="taps of the linear layers' convolution"
    )
    linear_chunk: int = field(
        "architecture/linear_chunk_size", default=CHUNK, above=0, help="chunk of the chunked delta rule"
    )

    def __post_init__(self) -> None:
        if isinstance(self.layer_types, list):  # as a run's saved configuration reads back: hashable
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        super().__post_init__()

    def _preset(self) -> KimiLinearPreset:
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        if isinstance(preset, KimiLinearPreset):
            return preset
        return KimiLinearPreset(**{f.name: getattr(preset, f.name) for f in dataclasses.fields(Preset)})

    def _extra_architecture(self) -> dict[str, Any]:
        preset = self._preset()
        n_layers = preset.n_layers if self.n_layers is None else self.n_layers
        types = self.layer_types
        if types is None:
            full = preset.full_layers
            types = default_layer_types(n_layers) if full is None else full_at(n_layers, full)
        if not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ConfigError(
                f"architecture/layer_types={list(types)}: Kimi Linear has linear_attention and full_attention; "
                "use those"
            )
        return {**super()._extra_architecture(), "layer_types": tuple(types)}

    def resolve_architecture(self) -> Architecture:
        if self.mtp_depth:
            raise ConfigError(f"architecture/mtp_depth={self.mtp_depth}: Kimi Linear has no multi-token prediction")
        arch = super().resolve_architecture()
        preset = self._preset()

        def pick(value: int | None, default: int) -> int:
            return default if value is None else int(value)

        values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(DeepseekV3Architecture)}
        values["position"] = dataclasses.replace(arch.position, kind="none")
        return KimiLinearArchitecture(
            **values,
            linear_heads=pick(self.linear_heads, preset.linear_heads),
            linear_head_dim=pick(self.linear_head_dim, preset.linear_head_dim),
            conv_kernel=pick(self.conv_kernel, preset.conv_kernel),
            linear_chunk=int(self.linear_chunk),
        ).validate()

    def _layer_options(self, layer: int) -> dict[str, Any]:
        types = self.architecture.layer_types or ()
        return {**super()._layer_options(layer), "linear": types[layer] == LINEAR_ATTENTION}


__all__ = [
    "KIMI_LINEAR_PRESETS",
    "KimiLinear",
    "KimiLinearArchitecture",
    "KimiLinearBlock",
    "KimiLinearPreset",
    "default_layer_types",
    "full_at",
]
