"""GLM-5 checkpoints (``GlmMoeDsaForCausalLM``) <-> theseus' ``GlmMoeDsa``: the ``hf/glm_moe_dsa`` family.

DeepSeek-V3.2's layout and fields (:mod:`theseus.model.models.deepseek_v32.hf`) with GLM-5's defaults for
the fields ``config.json`` omits, and an indexer that rotates interleaved pairs. ``indexer_types`` (or the
``index_topk_pattern`` / ``index_topk_freq`` / ``index_skip_topk_offset`` it derives from) must run the
indexer on every layer (``full``): layers that reuse another layer's top-k (``shared``) are refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, unsupported
from theseus.model.models.deepseek_v32.hf import V32_DEFAULTS, DeepseekV32Family
from theseus.model.stack.architecture import Architecture

GLM_MOE_DSA_CLASS = "theseus.model.models.glm_moe_dsa.model:GlmMoeDsa"

#: What transformers' ``GlmMoeDsaConfig`` reads where ``config.json`` omits a field.
GLM_DEFAULTS: dict[str, Any] = {
    **V32_DEFAULTS,
    "q_lora_rank": 2048,
    "n_group": 1,
    "topk_group": 1,
    "rms_norm_eps": 1e-5,
    "index_n_heads": 32,
}


def indexer_types(config: Mapping[str, Any]) -> list[str]:
    """Each layer's indexer mode as transformers derives it (``full`` or ``shared``)."""
    n_layers = int(config.get("num_hidden_layers") or 0)
    if config.get("indexer_types") is not None:
        return list(config["indexer_types"])
    pattern = config.get("index_topk_pattern")
    if pattern is not None:
        return [{"F": "full", "S": "shared"}[c] for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq, offset = max(int(config.get("index_topk_freq", 1)), 1), int(config.get("index_skip_topk_offset", 2))
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n_layers)]


class GlmMoeDsaFamily(DeepseekV32Family):
    """``model_type: glm_moe_dsa``."""

    identity: ClassVar[Identity] = Identity("glm_moe_dsa", "GlmMoeDsaForCausalLM", GLM_MOE_DSA_CLASS)
    hf_defaults: ClassVar[Mapping[str, Any]] = GLM_DEFAULTS
    indexer_rope_interleave: ClassVar[bool] = True

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        types = indexer_types(config)
        if "shared" in types:
            raise unsupported("indexer_types", types, "every layer runs its own indexer (no cross-layer top-k)")
        return super().keys(config)

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().config(arch, settings), "indexer_types": ["full"] * arch.n_layers}


__all__ = ["GLM_DEFAULTS", "GLM_MOE_DSA_CLASS", "GlmMoeDsaFamily", "indexer_types"]
