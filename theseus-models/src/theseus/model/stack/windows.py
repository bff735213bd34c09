"""Layers that interleave sliding-window and full attention, as Gemma 2 and 3, OLMo 3 and GPT-OSS do:
``architecture/layer_types`` with the family's default pattern, and the window of the sliding layers."""

from __future__ import annotations

from typing import Any, ClassVar

from theseus.model.layers._common import optional_key
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.stack.architecture import lookup_preset
from theseus.model.stack.transformer import TransformerLM


def pattern_layer_types(n_layers: int, every: int) -> tuple[str, ...]:
    """Sliding-window layers with every ``every``-th one full attention (transformers' default pattern)."""
    return tuple(FULL_ATTENTION if (i + 1) % every == 0 else SLIDING_ATTENTION for i in range(n_layers))


class InterleavedWindows(TransformerLM):
    """A model whose ``architecture/layer_types`` (None: ``FULL_EVERY - 1`` sliding layers, then one
    full, repeated) give ``architecture/sliding_window`` (None: ``DEFAULT_WINDOW``, at most the block
    size) to the sliding layers only. Mix it in before the family's base class."""

    #: The window of the sliding layers when ``architecture/sliding_window`` is None.
    DEFAULT_WINDOW: ClassVar[int] = 4096
    #: Every this many layers one is full attention (when ``architecture/layer_types`` is None).
    FULL_EVERY: ClassVar[int] = 2

    layer_types: tuple[str, ...] | None = optional_key(
        "architecture/layer_types", "sliding_attention | full_attention per layer", "the family's interleaving"
    )

    def _sliding_window(self) -> int | None:
        """The key's window; unset, the family's, at most the block size (longer would change nothing)."""
        if self.sliding_window is None:
            return min(self.DEFAULT_WINDOW, self.block_size)
        return self.sliding_window

    def resolved_layer_types(self) -> tuple[str, ...]:
        """``architecture/layer_types``, or the family's pattern over the resolved number of layers."""
        if self.layer_types is not None:
            return tuple(self.layer_types)
        preset = lookup_preset(self.PRESETS, self.preset, self.FAMILY)
        return pattern_layer_types(preset.n_layers if self.n_layers is None else self.n_layers, self.FULL_EVERY)

    def _extra_architecture(self) -> dict[str, Any]:
        return {**super()._extra_architecture(), "layer_types": self.resolved_layer_types()}


__all__ = ["InterleavedWindows", "pattern_layer_types"]
