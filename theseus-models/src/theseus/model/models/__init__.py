"""Language models: ``GPT`` (GPT-2), ``Llama`` (Llama-style), ``Qwen3``, ``OLMo2``, ``OLMo3``, ``Phi3``, ``Gemma2``,
``Gemma3``, ``Gemma4``, ``SmolLM3``, ``Qwen35``, ``Lfm2``, ``NemotronH``, ``FalconH1``, ``OLMoHybrid`` and the
mixtures ``Mixtral``, ``Qwen3MoE``, ``Qwen3Next``, ``Qwen35MoE``, ``Qwen4Exp``, ``DeepseekV3``, ``DeepseekV32``,
``GlmMoeDsa``, ``Glm4Moe``, ``GptOss``, ``GraniteMoeHybrid``, ``KimiLinear``, ``Llama4`` and ``MiniMaxM2``, plus
KV-cache decoding.

Each family is a folder, ``models/<family>/``: ``model.py`` (the model class, its layers and presets),
``hf.py`` (its Hugging Face families) and an ``__init__.py`` naming the model and presets. What the families
share (``TransformerLM``, blocks, scanned and pipelined stacks, decoding) is :mod:`theseus.model.stack`.

All follow the trainer's call contract::

    logits, loss = model.apply(variables, x, y=None, padding_mask=None, deterministic=False,
                               rngs={"dropout": key})

and size themselves from ``architecture/preset`` plus explicit ``architecture/*`` keys (see
:class:`TransformerLM`). ``model.flops(seq)`` and ``model.architecture`` work on an unbound model.

The KV cache (:mod:`theseus.model.stack.decoding`)::

    from theseus.model.models import GPT, decode_step, init_cache

    cache = init_cache(model, batch_size, max_len)                 # max_len <= block_size
    logits, cache = decode_step(model, params, cache, prompt, padding_mask)   # prompt [B, P], left-padded
    logits, cache = decode_step(model, params, cache, next_tokens[:, None])   # then one token at a time

The same works directly: ``model.apply({"params": p, "cache": cache}, x, decode=True, mutable=["cache"])``.
The decoder (sampling, stop at end-of-text, one jitted loop) is
``theseus.model.generation.decode.generate_tokens``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from theseus.model.models.deepseek_v3.model import DEEPSEEK_V3_PRESETS, DeepseekV3
    from theseus.model.models.deepseek_v32.model import DEEPSEEK_V32_PRESETS, DeepseekV32
    from theseus.model.models.falcon_h1.model import FALCON_H1_PRESETS, FalconH1
    from theseus.model.models.gemma.model import GEMMA2_PRESETS, GEMMA3_PRESETS, Gemma2, Gemma3
    from theseus.model.models.gemma4.model import GEMMA4_PRESETS, Gemma4
    from theseus.model.models.glm4_moe.model import GLM4_MOE_PRESETS, Glm4Moe
    from theseus.model.models.glm_moe_dsa.model import GLM_MOE_DSA_PRESETS, GlmMoeDsa
    from theseus.model.models.gpt.model import GPT, GPT_PRESETS
    from theseus.model.models.gpt_oss.model import GPT_OSS_PRESETS, GptOss
    from theseus.model.models.granitemoehybrid.model import GRANITE_MOE_HYBRID_PRESETS, GraniteMoeHybrid
    from theseus.model.models.kimi_linear.model import KIMI_LINEAR_PRESETS, KimiLinear
    from theseus.model.models.lfm2.model import LFM2_PRESETS, Lfm2
    from theseus.model.models.llama.model import LLAMA_PRESETS, Llama
    from theseus.model.models.llama4.model import LLAMA4_PRESETS, Llama4
    from theseus.model.models.minimax_m2.model import MINIMAX_M2_PRESETS, MiniMaxM2
    from theseus.model.models.mixtral.model import MIXTRAL_PRESETS, Mixtral
    from theseus.model.models.nemotron_h.model import NEMOTRON_H_PRESETS, NemotronH
    from theseus.model.models.olmo2.model import OLMO2_PRESETS, OLMo2
    from theseus.model.models.olmo3.model import OLMO3_PRESETS, OLMo3
    from theseus.model.models.olmo_hybrid.model import OLMO_HYBRID_PRESETS, OLMoHybrid
    from theseus.model.models.phi3.model import PHI3_PRESETS, Phi3
    from theseus.model.models.qwen3.model import QWEN3_PRESETS, Qwen3
    from theseus.model.models.qwen3_5.model import QWEN3_5_MOE_PRESETS, QWEN3_5_PRESETS, Qwen35, Qwen35MoE
    from theseus.model.models.qwen3_moe.model import QWEN3_MOE_PRESETS, Qwen3MoE
    from theseus.model.models.qwen3_next.model import QWEN3_NEXT_PRESETS, Qwen3Next
    from theseus.model.models.qwen4_exp.model import Qwen4Exp
    from theseus.model.models.smollm3.model import SMOLLM3_PRESETS, SmolLM3
    from theseus.model.stack.architecture import Architecture, Preset
    from theseus.model.stack.block import Block
    from theseus.model.stack.decoding import decode_step, init_cache
    from theseus.model.stack.mixture import MoEBlock
    from theseus.model.stack.transformer import TransformerLM, cross_entropy, token_positions

#: The module of each public name. A name is imported when first read (``from theseus.model.models import
#: GPT``, or an entry point ``theseus.model.models:GPT``), so a run of one family does not define every
#: family's Flax modules (about a tenth of the CPU time of importing one model).
_HOMES = {
    "Architecture": "theseus.model.stack.architecture",
    "Preset": "theseus.model.stack.architecture",
    "Block": "theseus.model.stack.block",
    "decode_step": "theseus.model.stack.decoding",
    "init_cache": "theseus.model.stack.decoding",
    "MoEBlock": "theseus.model.stack.mixture",
    "TransformerLM": "theseus.model.stack.transformer",
    "cross_entropy": "theseus.model.stack.transformer",
    "token_positions": "theseus.model.stack.transformer",
    "DEEPSEEK_V3_PRESETS": "theseus.model.models.deepseek_v3.model",
    "DeepseekV3": "theseus.model.models.deepseek_v3.model",
    "DEEPSEEK_V32_PRESETS": "theseus.model.models.deepseek_v32.model",
    "DeepseekV32": "theseus.model.models.deepseek_v32.model",
    "GLM_MOE_DSA_PRESETS": "theseus.model.models.glm_moe_dsa.model",
    "GlmMoeDsa": "theseus.model.models.glm_moe_dsa.model",
    "GEMMA2_PRESETS": "theseus.model.models.gemma.model",
    "GEMMA3_PRESETS": "theseus.model.models.gemma.model",
    "Gemma2": "theseus.model.models.gemma.model",
    "Gemma3": "theseus.model.models.gemma.model",
    "GEMMA4_PRESETS": "theseus.model.models.gemma4.model",
    "Gemma4": "theseus.model.models.gemma4.model",
    "GPT": "theseus.model.models.gpt.model",
    "GPT_PRESETS": "theseus.model.models.gpt.model",
    "GPT_OSS_PRESETS": "theseus.model.models.gpt_oss.model",
    "GptOss": "theseus.model.models.gpt_oss.model",
    "LFM2_PRESETS": "theseus.model.models.lfm2.model",
    "Lfm2": "theseus.model.models.lfm2.model",
    "NEMOTRON_H_PRESETS": "theseus.model.models.nemotron_h.model",
    "FALCON_H1_PRESETS": "theseus.model.models.falcon_h1.model",
    "FalconH1": "theseus.model.models.falcon_h1.model",
    "GRANITE_MOE_HYBRID_PRESETS": "theseus.model.models.granitemoehybrid.model",
    "GraniteMoeHybrid": "theseus.model.models.granitemoehybrid.model",
    "NemotronH": "theseus.model.models.nemotron_h.model",
    "LLAMA_PRESETS": "theseus.model.models.llama.model",
    "Llama": "theseus.model.models.llama.model",
    "LLAMA4_PRESETS": "theseus.model.models.llama4.model",
    "Llama4": "theseus.model.models.llama4.model",
    "MINIMAX_M2_PRESETS": "theseus.model.models.minimax_m2.model",
    "MiniMaxM2": "theseus.model.models.minimax_m2.model",
    "KIMI_LINEAR_PRESETS": "theseus.model.models.kimi_linear.model",
    "KimiLinear": "theseus.model.models.kimi_linear.model",
    "MIXTRAL_PRESETS": "theseus.model.models.mixtral.model",
    "Mixtral": "theseus.model.models.mixtral.model",
    "OLMO2_PRESETS": "theseus.model.models.olmo2.model",
    "OLMo2": "theseus.model.models.olmo2.model",
    "OLMO3_PRESETS": "theseus.model.models.olmo3.model",
    "OLMo3": "theseus.model.models.olmo3.model",
    "OLMO_HYBRID_PRESETS": "theseus.model.models.olmo_hybrid.model",
    "OLMoHybrid": "theseus.model.models.olmo_hybrid.model",
    "PHI3_PRESETS": "theseus.model.models.phi3.model",
    "Phi3": "theseus.model.models.phi3.model",
    "QWEN3_PRESETS": "theseus.model.models.qwen3.model",
    "Qwen3": "theseus.model.models.qwen3.model",
    "QWEN3_MOE_PRESETS": "theseus.model.models.qwen3_moe.model",
    "Qwen3MoE": "theseus.model.models.qwen3_moe.model",
    "QWEN3_5_PRESETS": "theseus.model.models.qwen3_5.model",
    "QWEN3_5_MOE_PRESETS": "theseus.model.models.qwen3_5.model",
    "Qwen35": "theseus.model.models.qwen3_5.model",
    "Qwen35MoE": "theseus.model.models.qwen3_5.model",
    "Qwen4Exp": "theseus.model.models.qwen4_exp.model",
    "QWEN3_NEXT_PRESETS": "theseus.model.models.qwen3_next.model",
    "Qwen3Next": "theseus.model.models.qwen3_next.model",
    "SMOLLM3_PRESETS": "theseus.model.models.smollm3.model",
    "SmolLM3": "theseus.model.models.smollm3.model",
    "GLM4_MOE_PRESETS": "theseus.model.models.glm4_moe.model",
    "Glm4Moe": "theseus.model.models.glm4_moe.model",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "DEEPSEEK_V3_PRESETS",
    "DEEPSEEK_V32_PRESETS",
    "FALCON_H1_PRESETS",
    "GEMMA2_PRESETS",
    "GEMMA3_PRESETS",
    "GEMMA4_PRESETS",
    "GLM4_MOE_PRESETS",
    "GLM_MOE_DSA_PRESETS",
    "GPT",
    "GPT_OSS_PRESETS",
    "GPT_PRESETS",
    "GRANITE_MOE_HYBRID_PRESETS",
    "KIMI_LINEAR_PRESETS",
    "LFM2_PRESETS",
    "LLAMA4_PRESETS",
    "LLAMA_PRESETS",
    "MINIMAX_M2_PRESETS",
    "MIXTRAL_PRESETS",
    "NEMOTRON_H_PRESETS",
    "OLMO2_PRESETS",
    "OLMO3_PRESETS",
    "OLMO_HYBRID_PRESETS",
    "PHI3_PRESETS",
    "QWEN3_5_MOE_PRESETS",
    "QWEN3_5_PRESETS",
    "QWEN3_MOE_PRESETS",
    "QWEN3_NEXT_PRESETS",
    "QWEN3_PRESETS",
    "SMOLLM3_PRESETS",
    "Architecture",
    "Block",
    "DeepseekV3",
    "DeepseekV32",
    "FalconH1",
    "Gemma2",
    "Gemma3",
    "Gemma4",
    "Glm4Moe",
    "GlmMoeDsa",
    "GptOss",
    "GraniteMoeHybrid",
    "KimiLinear",
    "Lfm2",
    "Llama",
    "Llama4",
    "MiniMaxM2",
    "Mixtral",
    "MoEBlock",
    "NemotronH",
    "OLMo2",
    "OLMo3",
    "OLMoHybrid",
    "Phi3",
    "Preset",
    "Qwen3",
    "Qwen3MoE",
    "Qwen3Next",
    "Qwen4Exp",
    "Qwen35",
    "Qwen35MoE",
    "SmolLM3",
    "TransformerLM",
    "cross_entropy",
    "decode_step",
    "init_cache",
    "token_positions",
]
