"""``Mixtral``: Llama's blocks with a mixture of experts as the feed-forward (Mixtral 8x7B)."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Preset
from theseus.model.stack.mixture import MixtureLM, MoEPreset

MIXTRAL_PRESETS: dict[str, Preset] = {
    "tiny": MoEPreset(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        mlp_ratio=2.0,
        n_experts=4,
        description="2 layers of 4 experts (top 2) of width 128, 64 wide; tests and demos",
    ),
    # mistralai/Mixtral-8x7B-v0.1's config.json: 32 layers, 32 query and 8 key/value heads, 4096 wide,
    # 8 experts of intermediate 14336 with 2 per token; 46.7B parameters, 12.9B active, at vocab 32000.
    "mixtral-8x7b": MoEPreset(
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        n_embd=4096,
        mlp_ratio=3.5,
        n_experts=8,
        top_k=2,
        description="Mixtral-8x7B's shape: 46.7B parameters (12.9B active) at vocab 32000",
    ),
}


class Mixtral(MixtureLM, Llama):
    """Mixtral: :class:`Llama` (RMSNorm, grouped-query attention with RoPE, untied head) whose every
    feed-forward is a softmax-routed mixture of SwiGLU experts, the top-k weights renormalised
    (``architecture/moe/*``, see :class:`theseus.model.layers.moe.MoE`; ``expert_hidden`` defaults
    to ``d_ff``, which Mixtral's ``intermediate_size`` is).

    Presets (``architecture/preset``): ``tiny`` (2 layers, 4 experts, top 2) and ``mixtral-8x7b``
    (the published shape; 46.7B parameters, 12.9B active per token, at
    ``architecture/vocab_size=32000``; the release sets ``architecture/rope_theta=1e6``, which
    ``hf/import`` reads from ``config.json``). See :class:`Llama` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = MIXTRAL_PRESETS
    FAMILY: ClassVar[str] = "Mixtral"
