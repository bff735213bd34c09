"""``NemotronH``: NVIDIA's Nemotron-H hybrids. Every layer is one kind, each with its own pre-norm RMSNorm and
residual: a Mamba-2 mixer (:class:`~theseus.model.layers.mamba2.Mamba2`, ``mamba``), grouped-query attention
without position embeddings (``full_attention``) or a squared-ReLU MLP without a gate (``mlp``); an untied head.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.errors import ConfigError
from theseus.model.layers._common import child, optional_key
from theseus.model.layers.attention import FULL_ATTENTION, CausalSelfAttention
from theseus.model.layers.mamba2 import MAMBA, Mamba2, MambaSpec
from theseus.model.layers.mlp import MLP_LAYER
from theseus.model.module import Module
from theseus.model.stack.architecture import (
    Architecture,
    Preset,
    architecture_as,
    extend_architecture,
    lookup_preset_as,
)
from theseus.model.stack.block import Block
from theseus.model.stack.mamba import MambaLM, MambaPreset

#: The layer kinds of a Nemotron-H model, and the letters of transformers' ``hybrid_override_pattern``.
KINDS = (MAMBA, FULL_ATTENTION, MLP_LAYER)
PATTERN_LETTERS = {"M": MAMBA, "*": FULL_ATTENTION, "-": MLP_LAYER}


def pattern_types(pattern: str) -> tuple[str, ...]:
    """The layer kinds of a ``hybrid_override_pattern`` such as ``"M-M*-"`` (``M`` mamba, ``*`` attention,
    ``-`` MLP)."""
    unknown = sorted(set(pattern) - set(PATTERN_LETTERS))
    if unknown:
        raise ConfigError(
            f"the Nemotron-H pattern {pattern!r} has {', '.join(map(repr, unknown))}; use M (mamba), "
            "* (attention) and - (MLP)"
        )
    return tuple(PATTERN_LETTERS[letter] for letter in pattern)


@dataclass(frozen=True)
class NemotronHPreset(MambaPreset):
    """A :class:`MambaPreset` with the layer pattern."""

    pattern: str = "M*-"
    mamba_groups: int = 2


#: Nemotron-H 8B and 4B: 52 layers, 24 Mamba-2, 4 attention and 24 MLP ones.
RELEASE_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"

# nvidia/Nemotron-H-8B-Base-8K: 4096 wide; attention of 32 query and 8 key/value heads of 128; a squared-ReLU
# MLP of 21504; Mamba-2 mixers of 128 heads of 64, 8 groups, a state of 128; 8.10B parameters at vocab
# 131072 (transformers' count of the same configuration on the meta device).
_NEMOTRON_H_8B = NemotronHPreset(
    n_layers=52,
    n_heads=32,
    n_kv_heads=8,
    n_embd=4096,
    head_dim=128,
    mlp_ratio=21504 / 4096,
    pattern=RELEASE_PATTERN,
    mamba_heads=128,
    mamba_head_dim=64,
    mamba_state=128,
    mamba_groups=8,
    description="Nemotron-H 8B's shape: 8.10B parameters at vocab 131072",
)

NEMOTRON_H_PRESETS: dict[str, Preset] = {
    "tiny": NemotronHPreset(
        n_layers=3,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        mlp_ratio=3.0,
        pattern="M*-",
        description="3 layers (mamba, attention, MLP), 64 wide; tests",
    ),
    "nemotron-h-8b": _NEMOTRON_H_8B,
    # nvidia/Nemotron-H-4B-Base-8K: 3072 wide, an MLP of 12288, Mamba-2 mixers of 112 heads of 64, otherwise as
    # the 8B; 4.49B parameters at vocab 131072 (transformers' count on the meta device).
    "nemotron-h-4b": dataclasses.replace(
        _NEMOTRON_H_8B,
        n_embd=3072,
        mlp_ratio=4.0,
        mamba_heads=112,
        description="Nemotron-H 4B's shape: 4.49B parameters at vocab 131072",
    ),
}


@dataclass(frozen=True)
class NemotronHArchitecture(Architecture):
    """An :class:`Architecture` with the Mamba-2 mixers' :class:`MambaSpec`, which the ``mamba`` layers of
    ``layer_types`` are built with."""

    mamba: MambaSpec = MambaSpec(n_heads=8, head_dim=16, state_size=16, n_groups=2)


class NemotronHAttention(CausalSelfAttention):
    """:class:`CausalSelfAttention` of Nemotron-H's attention layers: no window on any layer (the other
    ``layer_types`` entries are no attention layers)."""

    def _layer_window(self, layer: int | jax.Array | None) -> int | jax.Array | None:
        return self.attention_spec.sliding_window


class NemotronHBlock(Block):
    """:class:`Block` of one Nemotron-H layer, ``kind`` one of :data:`KINDS`: a ``mamba`` or
    ``full_attention`` layer has only its mixer (``attn_norm``, ``attn``), an ``mlp`` layer only its
    feed-forward (``mlp_norm``, ``mlp``)."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = NemotronHAttention

    MIXERS: ClassVar[tuple[type, ...]] = (Mamba2,)

    kind: str = FULL_ATTENTION

    def branches(self) -> tuple[bool, bool]:
        return self.kind != MLP_LAYER, self.kind == MLP_LAYER

    def attention(self) -> Module:
        if self.kind != MAMBA:
            return super().attention()
        message = "Nemotron-H's Mamba-2 layers need a NemotronHArchitecture (model/nemotron_h)"
        arch = architecture_as(self.arch, NemotronHArchitecture, message)
        layer: Mamba2 = child(
            self, Mamba2, **arch.mamba.layer_options(), norm_eps=arch.norm.eps, out_std=self.out_std, n_embd=arch.n_embd
        )
        return layer


class NemotronH(MambaLM):
    """Nemotron-H: per ``architecture/layer_types`` each layer is a Mamba-2 mixer (``mamba``: the chunked
    state-space scan, its state cached for decoding), grouped-query attention without position embeddings
    (``full_attention``) or a feed-forward ``down(relu(up(x))^2)`` without a gate (``mlp``), each with its
    own pre-norm RMSNorm and residual; no biases, an untied head. ``layer_types`` None: the preset's pattern.
    The mixers' shape: ``architecture/mamba_heads``, ``mamba_head_dim``, ``mamba_state_size``,
    ``mamba_groups`` (None: the preset's), ``mamba_conv_kernel``, ``mamba_chunk_size``, ``mamba_conv_bias``,
    ``mamba_bias`` and the time step's clip ``mamba_dt_min`` / ``mamba_dt_max``.

    Presets: ``tiny`` (tests), ``nemotron-h-8b`` (8.10B parameters at ``architecture/vocab_size=131072``) and
    ``nemotron-h-4b`` (4.49B). A repeating ``layer_types`` scans one period per step (``model/scan_layers``);
    the releases' pattern does not, so they run unrolled. ``hf/import`` of ``model_type: nemotron_h``
    builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = NEMOTRON_H_PRESETS
    FAMILY: ClassVar[str] = "NemotronH"
    BLOCK = NemotronHBlock
    ACTIVATION: ClassVar[str] = "relu2"
    NORM: ClassVar[str] = "rmsnorm"
    USE_BIAS: ClassVar[bool] = False
    ROTARY: ClassVar[bool] = False
    TIED_EMBEDDINGS: ClassVar[bool] = False
    LEARNED_POSITIONS: ClassVar[bool] = False

    layer_types: tuple[str, ...] | None = optional_key(
        "architecture/layer_types", "Nemotron-H: mamba | full_attention | mlp per layer", "the preset's pattern"
    )

    def _preset(self) -> NemotronHPreset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, NemotronHPreset)

    def _extra_architecture(self) -> dict[str, Any]:
        preset = self._preset()
        types = self.layer_types
        if types is None:
            types = pattern_types(preset.pattern)
            if self.n_layers is not None and self.n_layers != len(types):
                raise ConfigError(
                    f"architecture/n_layers={self.n_layers} differs from the {len(types)} layers of preset "
                    f"{self.preset!r}; set architecture/layer_types too"
                )
        if not set(types) <= set(KINDS):
            raise ConfigError(
                f"architecture/layer_types={list(types)}: Nemotron-H's layers are {', '.join(KINDS)}; use those"
            )
        return {"layer_types": tuple(types)}

    def resolve_architecture(self) -> Architecture:
        spec = self.mamba_spec(self._preset())
        return extend_architecture(super().resolve_architecture(), NemotronHArchitecture, mamba=spec)

    def _layer_options(self, layer: int) -> dict[str, Any]:
        types = self.architecture.layer_types or ()
        return {"kind": types[layer]}


__all__ = [
    "KINDS",
    "NEMOTRON_H_PRESETS",
    "MambaSpec",
    "NemotronH",
    "NemotronHArchitecture",
    "NemotronHAttention",
    "NemotronHBlock",
    "NemotronHPreset",
    "pattern_types",
]
