"""``FalconH1``: TII's Falcon-H1 hybrids. In every layer grouped-query attention (RoPE) and a Mamba-2 mixer read
the same RMS-normed input and their outputs are summed into one residual, then a SwiGLU MLP; an untied head.
The mup-style multipliers of the releases scale the embeddings, each mixer's input and output, the keys, the
Mamba-2 projection's parts, the MLP's gate and output and the logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import child, optional_key
from theseus.model.layers.mamba2 import Mamba2, MambaSpec
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
from theseus.model.stack.mamba import MambaLM, MambaPreset


@dataclass(frozen=True)
class FalconH1Preset(MambaPreset):
    """A :class:`MambaPreset`: 4 mixer heads by default."""

    mamba_heads: int = 4


FALCON_H1_PRESETS: dict[str, Preset] = {
    "tiny": FalconH1Preset(
        n_layers=2, n_heads=4, n_kv_heads=2, n_embd=64, mlp_ratio=2.0, description="2 layers, 64 wide; tests"
    ),
    # tiiuae/Falcon-H1-0.5B-Base: 36 layers 1024 wide; attention of 8 query and 2 key/value heads of 64; Mamba-2
    # mixers of 24 heads of 64 (mamba_d_ssm 1536), one group, a state of 128; a SwiGLU MLP of 2048.
    "falcon-h1-0.5b": FalconH1Preset(
        n_layers=36,
        n_heads=8,
        n_kv_heads=2,
        n_embd=1024,
        head_dim=64,
        mlp_ratio=2.0,
        mamba_heads=24,
        mamba_head_dim=64,
        mamba_state=128,
        mamba_groups=1,
        description="Falcon-H1 0.5B's shape: 521M parameters at vocab 32784",
    ),
}


@dataclass(frozen=True)
class FalconH1Multipliers:
    """Falcon-H1's mup-style multipliers (transformers' names without ``_multiplier``): ``ssm`` five, of
    ``in_proj``'s ``z``, ``x``, ``B``, ``C`` and time-step parts; ``mlp`` two, the gate's and the output's."""

    embedding: float = 1.0
    lm_head: float = 1.0
    attention_in: float = 1.0
    attention_out: float = 1.0
    key: float = 1.0
    ssm_in: float = 1.0
    ssm_out: float = 1.0
    ssm: tuple[float, ...] = (1.0, 1.0, 1.0, 1.0, 1.0)
    mlp: tuple[float, ...] = (1.0, 1.0)

    def validate(self) -> FalconH1Multipliers:
        if len(self.ssm) != 5 or len(self.mlp) != 2:
            raise ConfigError(
                f"architecture/ssm_multipliers={list(self.ssm)} and mlp_multipliers={list(self.mlp)} must hold "
                "5 and 2 numbers (z, x, B, C, dt; gate, down)"
            )
        if not self.key > 0:
            raise ConfigError(f"architecture/key_multiplier={self.key} must be > 0")
        return self


@dataclass(frozen=True)
class FalconH1Architecture(Architecture):
    """An :class:`Architecture` with every layer's Mamba-2 mixer (:class:`MambaSpec`), its gated group norm
    (``mamba_rms_norm``) and ``out_proj`` bias, and the multipliers."""

    mamba: MambaSpec = MambaSpec(n_heads=4, head_dim=16, state_size=16, n_groups=1)
    mamba_rms_norm: bool = False
    mamba_out_bias: bool = False
    multipliers: FalconH1Multipliers = FalconH1Multipliers()


def falcon_arch(arch: Architecture) -> FalconH1Architecture:
    """``arch`` as a :class:`FalconH1Architecture`, or one line saying which model builds one."""
    return architecture_as(
        arch, FalconH1Architecture, "Falcon-H1's layers need a FalconH1Architecture (model/falcon_h1)"
    )


class FalconH1Block(Block):
    """:class:`Block` of one Falcon-H1 layer: ``attn`` (grouped-query attention) and ``mamba`` (Mamba-2) in
    parallel on ``attn_norm``'s output, each scaled in and out by its multipliers, then the MLP."""

    MIXERS: ClassVar[tuple[type, ...]] = (Mamba2,)

    def parallel_mixers(self) -> dict[str, Module]:
        arch = falcon_arch(self.arch)
        spec, scales = arch.mamba, arch.multipliers
        layer: Mamba2 = child(
            self,
            Mamba2,
            **spec.layer_options(),
            out_bias=arch.mamba_out_bias,
            norm_eps=arch.norm.eps,
            out_std=self.out_std,
            n_embd=arch.n_embd,
            gated_norm=arch.mamba_rms_norm,
            projection_multipliers=None if all(m == 1.0 for m in scales.ssm) else tuple(scales.ssm),
        )
        return {"mamba": layer}

    def mixer_scales(self, name: str) -> tuple[float, float]:
        scales = falcon_arch(self.arch).multipliers
        if name == "mamba":
            return scales.ssm_in, scales.ssm_out
        return scales.attention_in, scales.attention_out

    def feed_forward_options(self) -> dict[str, Any]:
        gate, down = falcon_arch(self.arch).multipliers.mlp
        return {"gate_multiplier": float(gate), "down_multiplier": float(down)}


def multiplier_field(name: str, what: str) -> Any:
    """An ``architecture/<name>_multiplier`` key (default 1)."""
    return field(f"architecture/{name}_multiplier", default=1.0, help=f"Falcon-H1: multiplier of {what}")


class FalconH1(Llama, MambaLM):
    """Falcon-H1: Llama's attention, RMSNorm and SwiGLU MLP, and in every layer a Mamba-2 mixer beside the
    attention (``mamba``, the stack's parallel arrangement: both read ``attn_norm``'s output, their outputs are
    summed into one residual); no biases, an untied head. The mixers' shape: ``architecture/mamba_heads``,
    ``mamba_head_dim``, ``mamba_state_size``, ``mamba_groups`` (None: the preset's), ``mamba_conv_kernel``,
    ``mamba_chunk_size``, ``mamba_conv_bias``, ``mamba_bias`` (``in_proj``), ``mamba_out_bias`` (``out_proj``),
    ``mamba_rms_norm`` (the gated group norm; off: ``y * SiLU(z)``) and the time step's clip ``mamba_dt_min`` /
    ``mamba_dt_max``. The multipliers: ``architecture/embedding_multiplier``, ``lm_head_multiplier``,
    ``attention_in_multiplier``, ``attention_out_multiplier``, ``key_multiplier`` (folded into the score scale),
    ``ssm_in_multiplier``, ``ssm_out_multiplier``, ``ssm_multipliers`` (five) and ``mlp_multipliers`` (two).

    Presets: ``tiny`` (tests) and ``falcon-h1-0.5b``. ``hf/import`` of ``model_type: falcon_h1`` builds it.
    """

    PRESETS: ClassVar[dict[str, Preset]] = FALCON_H1_PRESETS
    FAMILY: ClassVar[str] = "FalconH1"
    BLOCK = FalconH1Block

    mamba_out_bias: bool | None = optional_key(
        "architecture/mamba_out_bias", "Falcon-H1: a bias on Mamba-2's out_proj", "as architecture/mamba_bias"
    )
    mamba_rms_norm: bool = field(
        "architecture/mamba_rms_norm",
        default=False,
        help="Falcon-H1: Mamba-2's gated group norm (false: the scan's output times SiLU(z), no norm)",
    )
    embedding_multiplier: float = multiplier_field("embedding", "the token embeddings")
    lm_head_multiplier: float = multiplier_field("lm_head", "the logits")
    attention_in_multiplier: float = multiplier_field("attention_in", "the attention's input")
    attention_out_multiplier: float = multiplier_field("attention_out", "the attention's output")
    key_multiplier: float = multiplier_field("key", "the keys")
    ssm_in_multiplier: float = multiplier_field("ssm_in", "the Mamba-2 mixer's input")
    ssm_out_multiplier: float = multiplier_field("ssm_out", "the Mamba-2 mixer's output")
    ssm_multipliers: tuple[float, ...] = field(
        "architecture/ssm_multipliers",
        default=(1.0, 1.0, 1.0, 1.0, 1.0),
        help="Falcon-H1: multipliers of Mamba-2's in_proj parts z, x, B, C and dt",
    )
    mlp_multipliers: tuple[float, ...] = field(
        "architecture/mlp_multipliers",
        default=(1.0, 1.0),
        help="Falcon-H1: multipliers of the MLP's gate (before the activation) and output",
    )

    def _preset(self) -> FalconH1Preset:
        return lookup_preset_as(self.PRESETS, self.preset, self.FAMILY, FalconH1Preset)

    def _multipliers(self) -> FalconH1Multipliers:
        return FalconH1Multipliers(
            embedding=float(self.embedding_multiplier),
            lm_head=float(self.lm_head_multiplier),
            attention_in=float(self.attention_in_multiplier),
            attention_out=float(self.attention_out_multiplier),
            key=float(self.key_multiplier),
            ssm_in=float(self.ssm_in_multiplier),
            ssm_out=float(self.ssm_out_multiplier),
            ssm=tuple(float(m) for m in self.ssm_multipliers),
            mlp=tuple(float(m) for m in self.mlp_multipliers),
        ).validate()

    def _extra_architecture(self) -> dict[str, Any]:
        """The key multiplier as the attention's score scale: ``(q . k m) / sqrt(d)`` is ``q . k`` over
        ``sqrt(d / m^2)``; the embedding and lm_head multipliers as the architecture's
        ``embedding_multiplier`` and ``logits_multiplier``."""
        preset, key = self._preset(), float(self.key_multiplier)
        if not key > 0:
            raise ConfigError(f"architecture/key_multiplier={key} must be > 0")
        head_dim = (
            self.head_dim or preset.head_dim or (self.n_embd or preset.n_embd) // (self.n_heads or preset.n_heads)
        )
        return {
            **super()._extra_architecture(),
            "query_pre_attn_scalar": None if key == 1.0 else head_dim / key**2,
            "embedding_multiplier": float(self.embedding_multiplier),
            "logits_multiplier": float(self.lm_head_multiplier),
        }

    def resolve_architecture(self) -> Architecture:
        spec = self.mamba_spec(self._preset())
        out_bias = self.mamba_bias if self.mamba_out_bias is None else self.mamba_out_bias
        return extend_architecture(
            super().resolve_architecture(),
            FalconH1Architecture,
            mamba=spec,
            mamba_rms_norm=bool(self.mamba_rms_norm),
            mamba_out_bias=bool(out_bias),
            multipliers=self._multipliers(),
        )


__all__ = [
    "FALCON_H1_PRESETS",
    "FalconH1",
    "FalconH1Architecture",
    "FalconH1Block",
    "FalconH1Multipliers",
    "FalconH1Preset",
]
