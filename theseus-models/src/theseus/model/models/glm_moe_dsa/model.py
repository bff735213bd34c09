"""``GlmMoeDsa``: GLM-5, DeepSeek-V3.2's architecture with an interleaved-pair indexer RoPE."""

from __future__ import annotations

from typing import ClassVar

from theseus.model.models.deepseek_v32.model import DEEPSEEK_V32_PRESETS, DeepseekV32, DeepseekV32Preset
from theseus.model.stack.architecture import Preset, preset_as

GLM_MOE_DSA_PRESETS: dict[str, Preset] = {
    "tiny": DEEPSEEK_V32_PRESETS["tiny"],
    # zai-org/GLM-5's shape as transformers' GlmMoeDsaConfig defaults hold it: 78 layers (the first 3 dense,
    # intermediate 12288), 64 heads, 6144 wide, 256 routed experts of 2048 (8 per token, one group, scaled
    # 2.5) and 1 shared, query rank 2048, latent 512, heads of 192 + 64 rotated, values 256, untied head,
    # an indexer of 32 heads of 128 keeping 2048 keys: 743,911,218,432 parameters at vocab 154880 (the
    # routers' biases counted, the multi-token-prediction module not). DeepSeek-V3.2's experts, latent,
    # rotated head width and indexer heads, with these sizes:
    "glm-5": preset_as(
        DEEPSEEK_V32_PRESETS["deepseek-v3.2"],
        DeepseekV32Preset,
        n_layers=78,
        n_heads=64,
        n_embd=6144,
        mlp_ratio=12288 / 6144,
        q_lora_rank=2048,
        qk_nope_head_dim=192,
        v_head_dim=256,
        n_group=1,
        topk_group=1,
        index_n_heads=32,
        description="GLM-5's shape: 743.9B parameters at vocab 154880",
    ),
}


class GlmMoeDsa(DeepseekV32):
    """GLM-5 (transformers' ``glm_moe_dsa``): :class:`~theseus.model.models.deepseek_v32.model.DeepseekV32`
    (latent attention with DeepSeek Sparse Attention, sigmoid-routed experts with a shared one, leading
    dense layers, the same training phases and keys), whose lightning indexer rotates interleaved pairs
    (``architecture/dsa/rope_interleave`` true unless set). transformers' cross-layer sharing of the top-k
    (``indexer_types`` ``shared``) is not supported: every layer runs its own indexer.

    Presets: ``tiny`` (DeepSeek-V3.2's) and ``glm-5`` (the published shape, at ``architecture/vocab_size=154880``).
    ``hf/import`` of a ``model_type: glm_moe_dsa`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = GLM_MOE_DSA_PRESETS
    FAMILY: ClassVar[str] = "GlmMoeDsa"
    INDEXER_ROPE_INTERLEAVE: ClassVar[bool] = True


__all__ = ["GLM_MOE_DSA_PRESETS", "GlmMoeDsa"]
