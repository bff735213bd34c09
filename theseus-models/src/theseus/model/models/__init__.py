"""Language models: ``GPT`` (GPT-2), ``Llama`` (Llama-style), ``Qwen3``, ``OLMo2``, ``OLMo3``, ``Phi3``, ``Gemma2``,
``Gemma3`` and the mixtures ``Mixtral``, ``Qwen3MoE``, ``DeepseekV3``, ``GptOss`` and ``Llama4``, plus KV-cache
decoding.

Both follow the trainer's call contract::

    logits, loss = model.apply(variables, x, y=None, padding_mask=None, deterministic=False,
                               rngs={"dropout": key})

and size themselves from ``architecture/preset`` plus explicit ``architecture/*`` keys (see
:class:`TransformerLM`). ``model.flops(seq)`` and ``model.architecture`` work on an unbound model.

The KV cache (:mod:`theseus.model.models.decoding`)::

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
    from theseus.model.models.architecture import Architecture, Preset
    from theseus.model.models.block import Block
    from theseus.model.models.decoding import decode_step, init_cache
    from theseus.model.models.deepseek_v3 import DEEPSEEK_V3_PRESETS, DeepseekV3
    from theseus.model.models.gemma import GEMMA2_PRESETS, GEMMA3_PRESETS, Gemma2, Gemma3
    from theseus.model.models.gpt import GPT, GPT_PRESETS
    from theseus.model.models.gpt_oss import GPT_OSS_PRESETS, GptOss
    from theseus.model.models.llama import LLAMA_PRESETS, Llama
    from theseus.model.models.llama4 import LLAMA4_PRESETS, Llama4
    from theseus.model.models.mixtral import MIXTRAL_PRESETS, Mixtral
    from theseus.model.models.mixture import MoEBlock
    from theseus.model.models.olmo2 import OLMO2_PRESETS, OLMo2
    from theseus.model.models.olmo3 import OLMO3_PRESETS, OLMo3
    from theseus.model.models.phi3 import PHI3_PRESETS, Phi3
    from theseus.model.models.qwen3 import QWEN3_PRESETS, Qwen3
    from theseus.model.models.qwen3_moe import QWEN3_MOE_PRESETS, Qwen3MoE
    from theseus.model.models.qwen3_next import QWEN3_NEXT_PRESETS, Qwen3Next
    from theseus.model.models.transformer import TransformerLM, cross_entropy, token_positions

#: The module of each public name. A name is imported when first read (``from theseus.model.models import
#: GPT``, or an entry point ``theseus.model.models:GPT``), so a run of one family does not define every
#: family's Flax modules (about a tenth of the CPU time of importing one model).
_HOMES = {
    "Architecture": "architecture",
    "Preset": "architecture",
    "Block": "block",
    "decode_step": "decoding",
    "init_cache": "decoding",
    "DEEPSEEK_V3_PRESETS": "deepseek_v3",
    "DeepseekV3": "deepseek_v3",
    "GEMMA2_PRESETS": "gemma",
    "GEMMA3_PRESETS": "gemma",
    "Gemma2": "gemma",
    "Gemma3": "gemma",
    "GPT": "gpt",
    "GPT_PRESETS": "gpt",
    "GPT_OSS_PRESETS": "gpt_oss",
    "GptOss": "gpt_oss",
    "LLAMA_PRESETS": "llama",
    "Llama": "llama",
    "LLAMA4_PRESETS": "llama4",
    "Llama4": "llama4",
    "MIXTRAL_PRESETS": "mixtral",
    "Mixtral": "mixtral",
    "MoEBlock": "mixture",
    "OLMO2_PRESETS": "olmo2",
    "OLMo2": "olmo2",
    "OLMO3_PRESETS": "olmo3",
    "OLMo3": "olmo3",
    "PHI3_PRESETS": "phi3",
    "Phi3": "phi3",
    "QWEN3_PRESETS": "qwen3",
    "Qwen3": "qwen3",
    "QWEN3_MOE_PRESETS": "qwen3_moe",
    "Qwen3MoE": "qwen3_moe",
    "QWEN3_NEXT_PRESETS": "qwen3_next",
    "Qwen3Next": "qwen3_next",
    "TransformerLM": "transformer",
    "cross_entropy": "transformer",
    "token_positions": "transformer",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_HOMES])


__all__ = [
    "DEEPSEEK_V3_PRESETS",
    "GEMMA2_PRESETS",
    "GEMMA3_PRESETS",
    "GPT",
    "GPT_OSS_PRESETS",
    "GPT_PRESETS",
    "LLAMA4_PRESETS",
    "LLAMA_PRESETS",
    "MIXTRAL_PRESETS",
    "OLMO2_PRESETS",
    "OLMO3_PRESETS",
    "PHI3_PRESETS",
    "QWEN3_MOE_PRESETS",
    "QWEN3_NEXT_PRESETS",
    "QWEN3_PRESETS",
    "Architecture",
    "Block",
    "DeepseekV3",
    "Gemma2",
    "Gemma3",
    "GptOss",
    "Llama",
    "Llama4",
    "Mixtral",
    "MoEBlock",
    "OLMo2",
    "OLMo3",
    "Phi3",
    "Preset",
    "Qwen3",
    "Qwen3MoE",
    "Qwen3Next",
    "TransformerLM",
    "cross_entropy",
    "decode_step",
    "init_cache",
    "token_positions",
]
