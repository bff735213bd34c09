"""What a model whose layers build Mamba-2 mixers shares (Nemotron-H's ``mamba`` layers, Falcon-H1's parallel
mixers): the preset's mixer shape, the ``architecture/mamba_*`` keys and the :class:`MambaSpec` they resolve to."""

from __future__ import annotations

from dataclasses import dataclass

from theseus.model.layers.mamba2 import MambaSpec, mamba_key
from theseus.model.stack.architecture import Preset, preset_or
from theseus.model.stack.transformer import TransformerLM


@dataclass(frozen=True)
class MambaPreset(Preset):
    """A :class:`Preset` with the Mamba-2 mixers' shape (each None key of the model takes it)."""

    mamba_heads: int = 8
    mamba_head_dim: int = 16
    mamba_state: int = 16
    mamba_groups: int = 1


class MambaLM(TransformerLM):
    """A :class:`TransformerLM` with Mamba-2 mixers: the ``architecture/mamba_*`` keys every such family
    reads alike (:func:`~theseus.model.layers.mamba2.mamba_key`) and :meth:`mamba_spec` of them."""

    mamba_heads: int | None = mamba_key("mamba_heads")
    mamba_head_dim: int | None = mamba_key("mamba_head_dim")
    mamba_state_size: int | None = mamba_key("mamba_state_size")
    mamba_groups: int | None = mamba_key("mamba_groups")
    mamba_conv_kernel: int = mamba_key("mamba_conv_kernel")
    mamba_chunk_size: int = mamba_key("mamba_chunk_size")
    mamba_conv_bias: bool = mamba_key("mamba_conv_bias")
    mamba_bias: bool = mamba_key("mamba_bias")
    mamba_dt_min: float = mamba_key("mamba_dt_min")
    mamba_dt_max: float | None = mamba_key("mamba_dt_max")

    def mamba_spec(self, preset: MambaPreset) -> MambaSpec:
        """The mixers' validated spec: each key's value, or ``preset``'s where a shape key is None."""
        return MambaSpec(
            n_heads=preset_or(self.mamba_heads, preset.mamba_heads),
            head_dim=preset_or(self.mamba_head_dim, preset.mamba_head_dim),
            state_size=preset_or(self.mamba_state_size, preset.mamba_state),
            n_groups=preset_or(self.mamba_groups, preset.mamba_groups),
            conv_kernel=int(self.mamba_conv_kernel),
            chunk_size=int(self.mamba_chunk_size),
            conv_bias=bool(self.mamba_conv_bias),
            bias=bool(self.mamba_bias),
            dt_min=float(self.mamba_dt_min),
            dt_max=None if self.mamba_dt_max is None else float(self.mamba_dt_max),
        ).validate()


__all__ = ["MambaLM", "MambaPreset"]
