"""``Qwen3MoE``: Qwen3's blocks (per-head query/key RMSNorm) with a mixture of experts (Qwen3-30B-A3B)."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.qwen3.model import Qwen3
from theseus.model.stack.architecture import Preset
from theseus.model.stack.mixture import MixtureLM, MoEPreset

QWEN3_MOE_PRESETS: dict[str, Preset] = {
    "tiny": MoEPreset(
        n_layers=2,
        n_heads=4,
        n_kv_heads=2,
        n_embd=64,
        head_dim=16,
        mlp_ratio=3.0,
        expert_hidden=32,
        description="2 layers of 8 experts (top 2) of width 32, 64 wide; tests and demos",
    ),
    # Qwen/Qwen3-30B-A3B's config.json: 48 layers, 32 query and 4 key/value heads of 128, 2048 wide,
    # 128 experts of moe_intermediate 768 with 8 per token (dense intermediate 6144 unused), untied
    # head; 30.5B parameters, 3.3B active, at vocab 151936.
    "qwen3-30b-a3b": MoEPreset(
        n_layers=48,
        n_heads=32,
        n_kv_heads=4,
        n_embd=2048,
        head_dim=128,
        mlp_ratio=3.0,
        n_experts=128,
        top_k=8,
        expert_hidden=768,
        description="Qwen3-30B-A3B's shape: 30.5B parameters (3.3B active) at vocab 151936",
    ),
}


class Qwen3MoE(MixtureLM, Qwen3):
    """Qwen3-MoE: :class:`Qwen3` (per-head query/key RMSNorm before RoPE) whose feed-forwards are
    softmax-routed mixtures of SwiGLU experts of ``architecture/moe/expert_hidden``
    (``moe_intermediate_size``); ``architecture/moe/norm_topk_prob`` renormalises the top-k weights
    (the releases do), ``architecture/moe/first_k_dense`` gives leading layers a dense MLP of
    ``architecture/d_ff``. The head is untied, as in the releases.

    Presets (``architecture/preset``): ``tiny`` (2 layers, 8 experts of 32, top 2) and
    ``qwen3-30b-a3b`` (the published shape; 30.5B parameters, 3.3B active per token, at
    ``architecture/vocab_size=151936``). See :class:`Qwen3` for the other keys.
    """

    PRESETS: ClassVar[dict[str, Preset]] = QWEN3_MOE_PRESETS
    FAMILY: ClassVar[str] = "Qwen3MoE"
    TIED_EMBEDDINGS: ClassVar[bool] = False
