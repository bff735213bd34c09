"""The Gated DeltaNet, now a shared layer kind (:mod:`theseus.model.layers.deltanet`): this path is kept for
code that imported it from Qwen3-Next, its first family."""

from __future__ import annotations

from theseus.model.layers.deltanet import (
    CHUNK,
    GatedDeltaNet,
    causal_conv,
    chunk_gated_delta_rule,
    l2_normalise,
    recurrent_gated_delta_rule,
)

__all__ = [
    "CHUNK",
    "GatedDeltaNet",
    "causal_conv",
    "chunk_gated_delta_rule",
    "l2_normalise",
    "recurrent_gated_delta_rule",
]
