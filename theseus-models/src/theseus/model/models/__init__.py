"""Language models: ``GPT`` (GPT-2) and ``Llama`` (Llama-style), plus KV-cache decoding.

Both follow the trainer's call contract::

    logits, loss = model.apply(variables, x, y=None, padding_mask=None, deterministic=False,
                               rngs={"dropout": key})

and size themselves from ``architecture/preset`` plus explicit ``architecture/*`` keys (see
:class:`TransformerLM`). ``model.flops(seq)`` and ``model.architecture`` work on an unbound model.

KV-cache decoding (:mod:`theseus.model.models.decoding`)::

    from theseus.model.models import GPT, decode_step, generate, init_cache

    cache = init_cache(model, batch_size, max_len)                 # max_len <= block_size
    logits, cache = decode_step(model, params, cache, prompt, padding_mask)   # prompt [B, P], left-padded
    logits, cache = decode_step(model, params, cache, next_tokens[:, None])   # then one token at a time
    tokens = generate(model, params, prompt, max_new_tokens, sample=my_sampler, key=key)  # [B, N]

The same works directly: ``model.apply({"params": p, "cache": cache}, x, decode=True, mutable=["cache"])``.
"""

from theseus.model.models.architecture import Architecture, Preset
from theseus.model.models.block import Block
from theseus.model.models.decoding import decode_step, generate, greedy, init_cache
from theseus.model.models.gpt import GPT, GPT_PRESETS
from theseus.model.models.llama import LLAMA_PRESETS, Llama
from theseus.model.models.transformer import TransformerLM, cross_entropy, token_positions

__all__ = [
    "GPT",
    "GPT_PRESETS",
    "LLAMA_PRESETS",
    "Architecture",
    "Block",
    "Llama",
    "Preset",
    "TransformerLM",
    "cross_entropy",
    "decode_step",
    "generate",
    "greedy",
    "init_cache",
    "token_positions",
]
