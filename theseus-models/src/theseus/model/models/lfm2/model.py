"""``Lfm2``: Liquid AI's LFM2, gated short-convolution layers (:class:`~theseus.model.layers.short_conv.ShortConv`)
interleaved with grouped-query attention layers (per-head query/key RMSNorm before RoPE), each followed by a
SwiGLU feed-forward; pre-norm RMSNorms and a tied head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child, optional_key
from theseus.model.layers.attention import FULL_ATTENTION, CausalSelfAttention
from theseus.model.layers.short_conv import SHORT_CONV, ShortConv
from theseus.model.models.llama.model import Llama
from theseus.model.module import Module
from theseus.model.stack.architecture import (
    Architecture,
    Preset,
    architecture_as,
    extend_architecture,
    lookup_preset_as,
)
from theseus.model.stack.block import Block


@dataclass(frozen=True)
class Lfm2Preset(Preset):
    """A :class:`Preset` with the layers that are attention (``full_attn_idxs``; the others short
    convolutions) and the convolution's taps."""

    full_attn_idxs: tuple[int, ...] = ()
    conv_kernel: int = 3


#: The attention layers of the 16-layer releases (LFM2-350M, -700M, -1.2B).
RELEASE_ATTENTION = (2, 5, 8, 10, 12, 14)

LFM2_PRESETS: dict[str, Preset] = {
    "tiny": Lfm2Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        mlp_ratio=3.0,
        full_attn_idxs=(1, 3),
        description="4 layers (attention at 1 and 3, short convolutions at 0 and 2), 64 wide; tests",
    ),
    # LiquidAI/LFM2-350M's config.json: 16 layers (attention at 2, 5, 8, 10, 12, 14: 16 query and 8 key/value
    # heads of 64; the others short convolutions of 3 taps), 1024 wide, block_ff_dim 6656 auto-adjusted to a
    # SwiGLU of 4608, tied head; 354.5M parameters at vocab 65536 (transformers' count on the meta device).
    "lfm2-350m": Lfm2Preset(
        n_layers=16,
        n_heads=16,
        n_kv_heads=8,
        n_embd=1024,
        mlp_ratio=4608 / 1024,
        full_attn_idxs=RELEASE_ATTENTION,
        description="LFM2-350M's shape: 354.5M parameters at vocab 65536",
    ),
    # LiquidAI/LFM2-1.2B's config.json: 16 layers (attention at 2, 5, 8, 10, 12, 14: 32 query and 8 key/value
    # heads of 64), 2048 wide, block_ff_dim 12288 auto-adjusted to a SwiGLU of 8192, tied head; 1.17B
    # parameters at vocab 65536 (transformers' count on the meta device).
    "lfm2-1.2b": Lfm2Preset(
        n_layers=16,
        n_heads=32,
        n_kv_heads=8,
        n_embd=2048,
        full_attn_idxs=RELEASE_ATTENTION,
        description="LFM2-1.2B's shape: 1.17B parameters at vocab 65536",
    ),
}


@dataclass(frozen=True)
class Lfm2Architecture(Architecture):
    """An :class:`Architecture` with the short convolutions' taps and biases, which the ``conv`` layers of
    ``layer_types`` are built with."""

    conv_kernel: int = 3
    conv_bias: bool = False


class Lfm2Attention(CausalSelfAttention):
    """:class:`CausalSelfAttention` of LFM2's ``full_attention`` layers: no layer has a window (the ``conv``
    entries of ``layer_types`` are no attention layers)."""

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        return self.attention_spec.sliding_window


class Lfm2Block(Block):
    """:class:`Block` of LFM2: its ``attn`` is a :class:`ShortConv` when ``conv``, else
    :class:`Lfm2Attention`; ``attn_norm`` and ``mlp_norm`` are LFM2's ``operator_norm`` and ``ffn_norm``."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = Lfm2Attention

    MIXERS: ClassVar[tuple[type, ...]] = (ShortConv,)

    conv: bool = False

    def attention(self) -> Module:
        if not self.conv:
            return super().attention()
        message = "LFM2's short-convolution layers need an Lfm2Architecture (model/lfm2)"
        arch = architecture_as(self.arch, Lfm2Architecture, message)
        layer: ShortConv = child(
            self,
            ShortConv,
            conv_kernel=arch.conv_kernel,
            use_bias=arch.conv_bias,
            out_std=self.out_std,
            n_embd=arch.n_embd,
        )
        return layer


class Lfm2(Llama):
    """LFM2: pre-norm blocks whose token mixer is, per ``architecture/layer_types``, a gated short
    convolution (``conv``: :class:`~theseus.model.layers.short_conv.ShortConv` of
    ``architecture/short_conv_kernel`` taps, biases with ``architecture/short_conv_bias``) or grouped-query
    attention (``full_attention``: per-head query/key RMSNorm before RoPE); every layer then a SwiGLU MLP.
    RMSNorms throughout, a tied head, RoPE base 1e6 by default. ``layer_types`` None: the preset's
    attention layers (``tiny``: 1 and 3 of 4; the releases: 2, 5, 8, 10, 12, 14 of 16), the rest ``conv``.

    Presets: ``tiny`` (tests), ``lfm2-350m`` (354.5M parameters at ``architecture/vocab_size=65536``) and
    ``lfm2-1.2b`` (1.17B). The two kinds of layer scan as one period per step when ``layer_types`` repeat
    (``model/scan_layers``); the releases' pattern does not, so they run unrolled. ``hf/import`` of
    ``model_type: lfm2`` builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = LFM2_PRESETS
    FAMILY: ClassVar[str] = "Lfm2"
    BLOCK = Lfm2Block
    TIED_EMBEDDINGS: ClassVar[bool] = True
    QK_NORM: ClassVar[bool] = True

    rope_theta: float = field("architecture/rope_theta", default=1000000.0, help="rotary embedding base frequency")
    layer_types: tuple[str, ...] | None = optional_key(
        "architecture/layer_types",
        "LFM2: conv | full_attention per layer",
        "the preset's attention layers, the others conv",
    )
    conv_kernel: int | None = optional_key(
        "architecture/short_conv_kernel", "LFM2: taps of the gated short convolution, conv_L_cache", "the preset's, 3"
    )
    conv_bias: bool = field(
        "architecture/short_conv_bias", default=False, help="LFM2: biases on the short convolution and its projections"
    )

    def _preset(self) -> Lfm2Preset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, Lfm2Preset)

    def _extra_architecture(self) -> dict[str, Any]:
        preset = self._preset()
        n_layers = preset.n_layers if self.n_layers is None else self.n_layers
        types = self.layer_types
        if types is None:
            types = tuple(FULL_ATTENTION if i in preset.full_attn_idxs else SHORT_CONV for i in range(n_layers))
        if not set(types) <= {FULL_ATTENTION, SHORT_CONV}:
            raise ConfigError(f"architecture/layer_types={list(types)}: LFM2 has {SHORT_CONV} and {FULL_ATTENTION}")
        return {**super()._extra_architecture(), "layer_types": tuple(types)}

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        kernel = self._preset().conv_kernel if self.conv_kernel is None else int(self.conv_kernel)
        if kernel < 1:
            raise ConfigError(f"architecture/short_conv_kernel={kernel} must be at least 1")
        return extend_architecture(arch, Lfm2Architecture, conv_kernel=kernel, conv_bias=bool(self.conv_bias))

    def _layer_options(self, layer: int) -> dict[str, Any]:
        types = self.architecture.layer_types or ()
        return {**super()._layer_options(layer), "conv": types[layer] == SHORT_CONV}


__all__ = ["LFM2_PRESETS", "Lfm2", "Lfm2Architecture", "Lfm2Attention", "Lfm2Block", "Lfm2Preset"]
