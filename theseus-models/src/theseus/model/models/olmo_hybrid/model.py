"""``OLMoHybrid``: OLMo 3's attention layers (post-norm, query/key norms over the whole projections, no window)
between Gated DeltaNet layers (pre-norm, separate query, key, value, a, b and output-gate projections)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION, CausalSelfAttention
from theseus.model.layers.deltanet import CHUNK, GatedDeltaNet
from theseus.model.models.olmo2.model import OLMo2
from theseus.model.models.qwen3_next.model import HybridPreset, Qwen3NextArchitecture
from theseus.model.module import Module
from theseus.model.stack.architecture import Architecture, Preset, lookup_preset
from theseus.model.stack.block import Block

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


class OLMoHybridBlock(Block):
    """:class:`Block` of one OLMo Hybrid layer: with ``linear`` a pre-norm block around a
    :class:`~theseus.model.layers.deltanet.GatedDeltaNet`, else OLMo 3's post-norm attention block."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = OLMoHybridAttention

    linear: bool = False

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), GatedDeltaNet]

    def placement(self) -> str:
        return "pre" if self.linear else super().placement()

    def attention(self) -> Module:
        if not self.linear:
            return super().attention()
        arch = self.arch
        if not isinstance(arch, OLMoHybridArchitecture):
            raise ConfigError(
                "OLMo Hybrid's linear-attention layers need an OLMoHybridArchitecture (model/olmo_hybrid)"
            )
        layer: GatedDeltaNet = child(
            self,
            GatedDeltaNet,
            key_heads=arch.linear_key_heads,
            value_heads=arch.linear_value_heads,
            key_dim=arch.linear_key_dim,
            value_dim=arch.linear_value_dim,
            conv_kernel=arch.conv_kernel,
            chunk_size=arch.linear_chunk,
            norm_eps=GATE_NORM_EPS,
            beta_scale=arch.linear_beta_scale,
            out_std=self.out_std,
            n_embd=arch.n_embd,
        )
        return layer


class OLMoHybrid(OLMo2):
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
    BLOCK = OLMoHybridBlock
    TIED_EMBEDDINGS: ClassVar[bool] = False

    layer_types: tuple[str, ...] | None = field(
        "architecture/layer_types",
        default=None,
        help="linear_attention | full_attention per layer (None: every full_attention_interval-th layer full)",
    )
    full_attention_interval: int | None = field(
        "architecture/full_attention_interval",
        default=None,
        help="every this many layers one is full attention, the last of each (None: the preset's)",
    )
    linear_key_heads: int | None = field(
        "architecture/linear_num_key_heads", default=None, help="query/key heads of the linear layers"
    )
    linear_value_heads: int | None = field(
        "architecture/linear_num_value_heads", default=None, help="value heads of the linear layers"
    )
    linear_key_dim: int | None = field(
        "architecture/linear_key_head_dim", default=None, help="query/key head width of the linear layers"
    )
    linear_value_dim: int | None = field(
        "architecture/linear_value_head_dim", default=None, help="value head width of the linear layers"
    )
    conv_kernel: int | None = field(
        "architecture/linear_conv_kernel_dim", default=None, help="taps of the linear layers' convolution"
    )
    linear_chunk: int = field(
        "architecture/linear_chunk_size", default=CHUNK, above=0, help="chunk of the chunked delta rule"
    )
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

    def __post_init__(self) -> None:
        if isinstance(self.layer_types, list):  # as a run's saved configuration reads back: hashable
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        super().__post_init__()

    def _preset(self) -> HybridPreset:
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        if isinstance(preset, HybridPreset):
            return preset
        return HybridPreset(**{f.name: getattr(preset, f.name) for f in dataclasses.fields(Preset)})

    def _extra_architecture(self) -> dict[str, Any]:
        preset = self._preset()
        n_layers = preset.n_layers if self.n_layers is None else self.n_layers
        types = self.layer_types
        if types is None:
            every = (
                preset.full_attention_interval if self.full_attention_interval is None else self.full_attention_interval
            )
            if every < 1:
                raise ConfigError(f"architecture/full_attention_interval={every} must be at least 1")
            types = default_layer_types(n_layers, every)
        if not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise ConfigError(
                f"architecture/layer_types={list(types)}: OLMo Hybrid has linear_attention and full_attention; "
                "use those"
            )
        return {**super()._extra_architecture(), "layer_types": tuple(types)}

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        preset = self._preset()

        def pick(value: int | None, default: int) -> int:
            return default if value is None else int(value)

        values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(Architecture)}
        if not self.rotary:
            values["position"] = dataclasses.replace(arch.position, kind="none")
        return OLMoHybridArchitecture(
            **values,
            linear_key_heads=pick(self.linear_key_heads, preset.linear_key_heads),
            linear_value_heads=pick(self.linear_value_heads, preset.linear_value_heads),
            linear_key_dim=pick(self.linear_key_dim, preset.linear_key_dim),
            linear_value_dim=pick(self.linear_value_dim, preset.linear_value_dim),
            conv_kernel=pick(self.conv_kernel, preset.conv_kernel),
            linear_chunk=int(self.linear_chunk),
            linear_beta_scale=2.0 if self.linear_allow_neg_eigval else 1.0,
        ).validate()

    def _layer_options(self, layer: int) -> dict[str, Any]:
        types = self.architecture.layer_types or ()
        return {**super()._layer_options(layer), "linear": types[layer] == LINEAR_ATTENTION}


__all__ = [
    "OLMO_HYBRID_PRESETS",
    "OLMoHybrid",
    "OLMoHybridArchitecture",
    "OLMoHybridAttention",
    "OLMoHybridBlock",
    "default_layer_types",
]
