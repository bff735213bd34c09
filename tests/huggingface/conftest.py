"""Tiny random transformers models saved with ``save_pretrained``, a small tokenizer, and an
in-process ``theseus`` command runner for the Hugging Face import/export tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

VOCAB = 300  # the tokenizer below has 258 ids; the model's vocabulary is padded like real checkpoints


def make_tokenizer(folder: Path, *, bos: bool) -> None:
    """A byte-level tokenizer (256 byte tokens, ``<|endoftext|>`` = 256, ``<s>`` = 257) saved as a
    transformers fast tokenizer; with ``bos`` encoding starts with ``<s>``, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    from theseus.model.huggingface.tokenizer_files import bytes_to_unicode

    table = bytes_to_unicode()
    tok = Tokenizer(models.BPE(vocab={table[b]: b for b in range(256)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>", "<s>"])
    if bos:
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 257)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<s>" if bos else "<|endoftext|>"
    )
    fast.save_pretrained(folder)


def hf_config(family: str, **overrides: Any) -> Any:
    from transformers import (
        DeepseekV3Config,
        DeepseekV32Config,
        FalconH1Config,
        Glm4MoeConfig,
        GlmMoeDsaConfig,
        GPT2Config,
        GptOssConfig,
        GraniteMoeHybridConfig,
        KimiLinearConfig,
        Lfm2Config,
        Llama4TextConfig,
        LlamaConfig,
        MiniMaxM2Config,
        MistralConfig,
        MixtralConfig,
        NemotronHConfig,
        Olmo2Config,
        Olmo3Config,
        OlmoHybridConfig,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
        Qwen3NextConfig,
        SmolLM3Config,
    )

    if family == "gpt2":
        values = {"vocab_size": VOCAB, "n_positions": 320, "n_embd": 32, "n_layer": 2, "n_head": 4}
        values.update({"bos_token_id": 256, "eos_token_id": 256})
        return GPT2Config(**{**values, **overrides})
    common = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": 257,
        "eos_token_id": 256,
        "rms_norm_eps": 1e-6,
    }
    classes = {
        "llama": LlamaConfig,
        "mistral": MistralConfig,
        "qwen2": Qwen2Config,
        "qwen3": Qwen3Config,
        "olmo2": Olmo2Config,
        "olmo3": Olmo3Config,
        "phi3": Phi3Config,
        "mixtral": MixtralConfig,
        "qwen3_moe": Qwen3MoeConfig,
        "deepseek_v3": DeepseekV3Config,
        "deepseek_v32": DeepseekV32Config,
        "glm_moe_dsa": GlmMoeDsaConfig,
        "gpt_oss": GptOssConfig,
        "llama4_text": Llama4TextConfig,
        "qwen3_next": Qwen3NextConfig,
        "minimax_m2": MiniMaxM2Config,
        "smollm3": SmolLM3Config,
        "glm4_moe": Glm4MoeConfig,
        "lfm2": Lfm2Config,
        "nemotron_h": NemotronHConfig,
        "falcon_h1": FalconH1Config,
        "olmo_hybrid": OlmoHybridConfig,
        "granitemoehybrid": GraniteMoeHybridConfig,
        "kimi_linear": KimiLinearConfig,
    }
    if family == "qwen3":  # its own head width (4 x 16 != 32) and a tied head, as the small releases have
        common.update({"head_dim": 16, "tie_word_embeddings": True})
    if family == "olmo3":  # a window of 5 on layer 0, full attention on layer 1
        common.update({"sliding_window": 5, "layer_types": ["sliding_attention", "full_attention"]})
    if family == "gpt_oss":  # GPT_OSS below: a window of 5 on layer 0, YaRN, 4 experts, a clamp that binds
        common.update(GPT_OSS)
    if family == "llama4_text":  # LLAMA4 below: chunks of 5, NoPE layers 1 and 3, mixtures at 1 and 3
        common.update(LLAMA4)
    if family == "qwen3_next":  # QWEN3_NEXT below: linear layers 0 and 2, full 1 and 3, a dense layer 0
        common.update(QWEN3_NEXT)
    if family == "smollm3":  # SMOLLM3 below: layer 1 NoPE, attention biases, a tied head
        common.update(SMOLLM3)
    if family == "glm4_moe":  # GLM4_MOE below: a dense layer then grouped sigmoid-routed mixtures, partial RoPE
        common.update(GLM4_MOE)
    if family == "minimax_m2":  # MINIMAX_M2 below: half of each head rotated, 4 sigmoid-routed experts
        common.update(MINIMAX_M2)
    if family in ("deepseek_v32", "glm_moe_dsa"):  # DSA below: latent attention, an indexer keeping 4 keys
        common.update(DSA)
    if family == "lfm2":  # LFM2 below: a short-convolution layer 0, an attention layer 1, a tied head
        common.update(LFM2)
    if family == "nemotron_h":  # NEMOTRON_H below: a Mamba-2 layer, an attention layer and a squared-ReLU MLP
        common.update(NEMOTRON_H)
    if family == "falcon_h1":  # FALCON_H1 below: one layer of attention and Mamba-2 in parallel, every multiplier
        common.update(FALCON_H1)
    if family == "olmo_hybrid":  # OLMO_HYBRID below: a Gated DeltaNet layer 0, an attention layer 1
        common.update(OLMO_HYBRID)
    if family == "granitemoehybrid":  # GRANITE below: a Mamba-2 layer then an attention layer, each with experts
        common.update(GRANITE)
    if family == "kimi_linear":  # KIMI_LINEAR below: a KDA layer 0 (dense MLP), a latent-attention layer 1 (experts)
        common.update(KIMI_LINEAR)
    if family == "phi3":  # its default pad id (32000) is past this vocabulary
        common["pad_token_id"] = None
    if family in GEMMA:
        return gemma_config(family, common, overrides)
    if family in QWEN3_5_FAMILIES:  # QWEN3_5 below: Qwen3-Next's layers; the vision-language ones nest them
        return qwen3_5_config(family, common, overrides)
    if family == "qwen4_exp_text":  # QWEN4_EXP below: Qwen3.5-MoE's layers on hyper-connections, n-grams, QSA
        return qwen4_exp_config(common, overrides)
    return classes[family](**{**common, **overrides})


#: GPT-OSS at a small scale: heads of 16, a window of 5 on layer 0 and full attention on layer 1, the
#: releases' YaRN (ramp ends not rounded) stretched over 8 positions, 4 experts of 48 (top 2), and a
#: SwiGLU clamp of 1 (the releases' 7 never binds on these small activations).
GPT_OSS = {
    "head_dim": 16,
    "sliding_window": 5,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 4.0,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
        "original_max_position_embeddings": 8,
    },
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "swiglu_limit": 1.0,
    "pad_token_id": None,
}

#: MiniMax-M2 at a small scale: heads of 16 with the leading 8 rotated (rotary_dim), 4 experts of 24 (top 2)
#: chosen by a sigmoid router whose balancing bias save_model draws at random (so that it changes the choice).
MINIMAX_M2 = {
    "head_dim": 16,
    "rotary_dim": 8,
    "intermediate_size": 24,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "rope_theta": 10000.0,
}

#: DeepSeek-V3.2 / GLM-5 at a small scale: a dense layer then a mixture of 8 experts of 16 in 2 groups (top 2
#: from 1 group) with a shared one; latent attention (query rank 12, latent 8, heads of 8 + 4 rotated, values
#: 6) and a lightning indexer of 8 heads of 16 keeping 4 keys: prompts of 12 tokens attend sparsely.
DSA = {
    "num_key_value_heads": 4,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "moe_intermediate_size": 16,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "q_lora_rank": 12,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "index_topk": 4,
    "index_n_heads": 8,
    "index_head_dim": 16,
    "pad_token_id": None,
}

#: Gemma 3's 4B+ releases: linear scaling of the full layers' RoPE only.
GEMMA3_LINEAR = {
    "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
}

#: Gemma families: a window of 5 and a full layer, a query scalar that is not head_dim, caps that bind.
GEMMA = {
    "gemma2": {"attn_logit_softcapping": 3.0, "final_logit_softcapping": 4.0},
    "gemma3_text": {"rope_parameters": None},
    "gemma4_text": {},
    "gemma4": {},
}

#: Gemma 4 at a small scale: sliding heads of 8, the full layer's heads of 16 rotated proportionally (half of
#: the pairs turn; bases 1e3 sliding, 1e4 full), per-layer inputs of 8 from a table of 320 rows, logits
#: capped at 5; ``gemma4`` nests it in ``text_config`` beside one-layer vision and audio towers (GEMMA4_TOWERS).
GEMMA4 = {
    "head_dim": 8,
    "global_head_dim": 16,
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": 320,
    "final_logit_softcapping": 5.0,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5, "rope_theta": 1e4},
    },
}
GEMMA4_FAMILIES = ("gemma4_text", "gemma4")
GEMMA4_TOWERS = {
    "vision_config": {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2}
    | {"num_key_value_heads": 2, "head_dim": 8, "patch_size": 4, "position_embedding_size": 64},
    "audio_config": {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "conv_kernel_size": 3}
    | {"subsampling_conv_channels": [4, 4], "output_proj_dims": 16},
}


def gemma_config(family: str, common: dict[str, Any], overrides: dict[str, Any]) -> Any:
    from transformers import Gemma2Config, Gemma3TextConfig

    values = {
        **common,
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"],
        "pad_token_id": None,
        **GEMMA[family],
    }
    if family == "gemma3_text":  # separate bases for the full and the sliding layers
        values["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
        }
    values = {**values, **overrides}
    if family in ("gemma4_text", "gemma4"):  # GEMMA4 above; no query_pre_attn_scalar (scores are not scaled)
        from transformers import Gemma4Config, Gemma4TextConfig

        values.pop("query_pre_attn_scalar")
        text = {**values, **GEMMA4, **overrides}
        if family == "gemma4_text":
            return Gemma4TextConfig(**text)
        tied = text.get("tie_word_embeddings", True)  # a pad id: the multimodal forward maps tower tokens to it
        return Gemma4Config(text_config={**text, "pad_token_id": 0}, tie_word_embeddings=tied, **GEMMA4_TOWERS)
    return (Gemma2Config if family == "gemma2" else Gemma3TextConfig)(**values)


#: Llama 4's text model at a small scale, every mechanism binding on prompts of 12: layers 0 and 2 local
#: (RoPE, the query/key L2 norm, chunks of 5 positions) and 1 and 3 global NoPE layers with a temperature
#: that grows every 2 positions; dense layers (intermediate 40) at 0 and 2, mixtures of 4 experts of 24
#: (top 2, the sigmoid scaling their inputs) with a shared expert at 1 and 3; Llama 3's RoPE scaling.
LLAMA4 = {
    "head_dim": 16,
    "intermediate_size": 24,
    "intermediate_size_mlp": 40,
    "num_hidden_layers": 4,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "interleave_moe_layer_step": 2,
    "no_rope_layer_interval": 2,
    "attention_chunk_size": 5,
    "floor_scale": 2,
    "attn_scale": 0.5,
    "rope_parameters": {
        "rope_type": "llama3",
        "rope_theta": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "pad_token_id": None,
}


#: Qwen3-Next at a small scale: Gated DeltaNet layers 0 and 2 (2 query/key heads of 8 serving 4 value
#: heads of 6, a convolution of 4), gated full-attention layers 1 and 3 (4 heads of 16, a quarter rotated),
#: a dense first layer (mlp_only_layers) then mixtures of 4 experts of 24 (top 2, renormalised) with a
#: gated shared expert of 20.
QWEN3_NEXT = {
    "head_dim": 16,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "linear_conv_kernel_dim": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 20,
    "mlp_only_layers": [0],
    "norm_topk_prob": True,
    "partial_rotary_factor": 0.25,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "pad_token_id": None,
}


#: SmolLM3 at a small scale: a NoPE layer every 2 (layer 1 of 2 rotates nothing), biases on the attention
#: projections, the releases' tied head and a RoPE base of 5e6.
SMOLLM3 = {
    "no_rope_layer_interval": 2,
    "attention_bias": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5000000.0},
    "pad_token_id": None,
}


#: Qwen3.5 at a small scale: Qwen3-Next's layers (Gated DeltaNet layers 0 and 2 with 2 query/key heads of 8
#: serving 4 value heads of 6, gated full-attention layers 1 and 3 with a quarter of each head rotated by the
#: multimodal RoPE, whose sections a text position fills alike), a dense MLP on every layer (the dense
#: families) or mixtures of 4 experts of 24 (top 2) with a gated shared expert of 20 on every layer (QWEN3_5_MOE);
#: the vision-language families (``qwen3_5``, ``qwen3_5_moe``) nest it in ``text_config`` beside a one-block
#: vision tower (QWEN3_5_VISION) and are saved with ``*ForConditionalGeneration``.
QWEN3_5 = {
    "head_dim": 16,
    "num_hidden_layers": 4,
    "layer_types": ["linear_attention", "full_attention"] * 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "linear_conv_kernel_dim": 4,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
    "pad_token_id": None,
}
QWEN3_5_MOE = {
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "shared_expert_intermediate_size": 20,
}
QWEN3_5_VISION = {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "patch_size": 4}
QWEN3_5_FAMILIES = ("qwen3_5_text", "qwen3_5", "qwen3_5_moe_text", "qwen3_5_moe")
#: The families saved with ``AutoModelForImageTextToText`` (a vision tower beside the language model).
VISION_LANGUAGE = ("qwen3_5", "qwen3_5_moe", "gemma4")


def qwen3_5_config(family: str, common: dict[str, Any], overrides: dict[str, Any]) -> Any:
    from transformers import Qwen3_5Config, Qwen3_5MoeConfig, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    moe = family.startswith("qwen3_5_moe")
    text = {**common, **QWEN3_5, **(QWEN3_5_MOE if moe else {}), **overrides}
    if moe:
        text.pop("intermediate_size")  # no dense layer: transformers' configuration has no such field
    if family not in VISION_LANGUAGE:
        return (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(**text)
    vision = {**QWEN3_5_VISION, "out_hidden_size": text["hidden_size"], "num_position_embeddings": 16}
    tied = text.get("tie_word_embeddings", False)
    return (Qwen3_5MoeConfig if moe else Qwen3_5Config)(
        text_config=text, vision_config=vision, tie_word_embeddings=tied
    )


#: Qwen4-Exp at a small scale: Qwen3.5-MoE's layers (a Gated DeltaNet layer 0, a gated full-attention layer 1,
#: mixtures of 4 experts with a gated shared expert) on 3 hyper-connection streams (gates of rank 8), hashed
#: n-gram embeddings on layer 1 (bigrams and trigrams, 2 tables each of the primes from 61 on, 16 wide in all,
#: stored in 2 shards), the attention layer's indexer keeping 2 blocks of 2 of the prompt's 12 keys (4 heads of 8).
QWEN4_EXP = {
    "head_dim": 16,
    "layer_types": ["linear_attention", "indexed_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    "hc_count": 3,
    "hc_lowrank": 8,
    "ple_layer_ids": [1],
    "ple_embed_dim": 16,
    "heads_per_ngram": 2,
    "ngram_vocab_size_base": 61,
    "make_ngram_vocab_size_divisible_by": 8,
    "split_ngram_parts": 2,
    "indexer_n_heads": 4,
    "indexer_kv_heads": 1,
    "indexer_head_dim": 8,
    "indexer_budget": 4,
    "indexer_compress_ratio": 2,
    "pad_token_id": None,
}


def qwen4_exp_config(common: dict[str, Any], overrides: dict[str, Any]) -> Any:
    from transformers import Qwen4ExpTextConfig

    text = {**common, **QWEN4_EXP, **QWEN3_5_MOE, **overrides}
    text.pop("intermediate_size")  # every layer a mixture: transformers' configuration has no such field
    return Qwen4ExpTextConfig(**text)


#: GLM-4.5 at a small scale: heads of 16 with query/key/value biases, half of each rotated, per-head query/key
#: norms; a dense first layer (intermediate 48), then mixtures of 8 experts of 24 (top 2 from 1 of 2 groups,
#: renormalised, scaled 2.5, a random selection bias) with a shared expert.
GLM4_MOE = {
    "head_dim": 16,
    "num_hidden_layers": 3,
    "attention_bias": True,
    "use_qk_norm": True,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 2,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "pad_token_id": None,
}


#: LFM2 at a small scale: a gated short convolution of 3 taps on layer 0 and attention on layer 1 (per-head
#: query/key norms, heads of 8), block_ff_dim 72 adjusted as the releases' is (two thirds, rounded up to 16:
#: a SwiGLU of 48), a tied head.
LFM2 = {
    "layer_types": ["conv", "full_attention"],
    "intermediate_size": 72,
    "block_auto_adjust_ff_dim": True,
    "block_multiple_of": 16,
    "norm_eps": 1e-5,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
    "pad_token_id": None,
}


#: Nemotron-H at a small scale: a Mamba-2 layer (4 heads of 8 in 2 groups, a state of 8, chunks of 4 so that 12
#: tokens cross chunks), an attention layer without position embeddings (heads of 8) and a squared-ReLU MLP. The
#: mixture's widths, unused without moe layers, are small too: config.json claims no size its weights cannot hold.
NEMOTRON_H = {
    "layers_block_type": ["linear_attention", "full_attention", "mlp"],
    "num_hidden_layers": 3,
    "head_dim": 8,
    "mamba_num_heads": 4,
    "mamba_head_dim": 8,
    "ssm_state_size": 8,
    "n_groups": 2,
    "conv_kernel": 4,
    "chunk_size": 4,
    "layer_norm_epsilon": 1e-5,
    "moe_intermediate_size": 16,
    "moe_shared_expert_intermediate_size": 16,
}


#: Falcon-H1 at a small scale: one layer, its attention (heads of 8) and its Mamba-2 mixer (4 heads of 8 in 2
#: groups, a state of 8, chunks of 4 so that 12 tokens cross chunks) in parallel; no gated norm, as the releases;
#: every multiplier away from 1 (the releases' kind of values), so that each one is read where it applies.
FALCON_H1 = {
    "num_hidden_layers": 1,
    "head_dim": 8,
    "mamba_d_ssm": 32,
    "mamba_n_heads": 4,
    "mamba_d_head": 8,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 4,
    "mamba_rms_norm": False,
    "mamba_norm_before_gate": False,
    "rms_norm_eps": 1e-5,
    "embedding_multiplier": 2.5,
    "lm_head_multiplier": 0.5,
    "attention_in_multiplier": 0.8,
    "attention_out_multiplier": 0.9,
    "key_multiplier": 0.4,
    "ssm_in_multiplier": 1.25,
    "ssm_out_multiplier": 0.6,
    "ssm_multipliers": [0.35, 0.25, 0.5, 0.7, 0.3],
    "mlp_multipliers": [0.9, 0.6],
}
#: OLMo Hybrid at a small scale: a Gated DeltaNet layer (transformers' default heads: 4 query/key heads of 6, 4
#: value heads of 12) then an OLMo 3 attention layer; its default pad id (100277) is past this vocabulary.
OLMO_HYBRID = {"layer_types": ["linear_attention", "full_attention"], "pad_token_id": None}
#: rope_parameters without a base: no position embedding, as the OLMo Hybrid releases have.
NOPE = {"rope_type": "default", "rope_theta": None}
#: Kimi Linear at a small scale: a Kimi Delta Attention layer (2 heads of 8) with a dense MLP, then a NoPE
#: latent-attention layer (latent 8, heads of 8 + 4 unrotated, values 6; one key/value per head) with a mixture of
#: 4 experts of 16 in 2 groups (top 2 from 1 group, scaled 2.446) and a shared one; its pad id is past the vocabulary.
KIMI_LINEAR = {
    "num_key_value_heads": 4,
    "layer_types": ["linear_attention", "full_attention"],
    "mlp_layer_types": ["dense", "sparse"],
    "linear_num_heads": 2,
    "linear_head_dim": 8,
    "kv_lora_rank": 8,
    "q_lora_rank": None,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "moe_intermediate_size": 16,
    "n_shared_experts": 1,
    "pad_token_id": None,
}


#: Granite 4 at a small scale: a Mamba-2 layer (4 heads of 8 in 2 groups, a state of 8, chunks of 4 so that 12
#: tokens cross chunks) then an attention layer (heads of 8, no position embedding, as the releases), each
#: followed by 4 experts of 16 (top 2) beside a shared MLP of 24; every multiplier away from 1 (the releases'
#: kind of values), so that each one is read where it applies.
GRANITE = {
    "layer_types": ["mamba", "attention"],
    "intermediate_size": 16,
    "shared_intermediate_size": 24,
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_n_heads": 4,
    "mamba_d_head": 8,
    "mamba_expand": 1,
    "mamba_n_groups": 2,
    "mamba_d_state": 8,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 4,
    "position_embedding_type": "nope",
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.25,
    "logits_scaling": 4.0,
    "pad_token_id": None,
}


#: Overrides for two layers where the configurations above have 3 or 4: still one layer of each kind (a Gated
#: DeltaNet layer and a gated full-attention one, a dense MLP then a mixture, Llama 4's chunked RoPE layer then
#: its NoPE mixture layer), for the tests that need each kind once (about half the tracing and compiling).
TWO_LAYERS: dict[str, Any] = {"num_hidden_layers": 2}
#: One layer, for the tests of a family whose layers are all alike (each kind of layer met once all the same).
ONE_LAYER: dict[str, Any] = {"num_hidden_layers": 1}
HYBRID: dict[str, Any] = {**TWO_LAYERS, "layer_types": ["linear_attention", "full_attention"]}


def save_model(folder: Path, family: str, seed: int = 0, *, tokenizer: bool = True, **overrides: Any) -> Any:
    """A random transformers model of ``family`` saved in ``folder`` (float32 safetensors); returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(family, **overrides)
    if family in VISION_LANGUAGE:
        from transformers import AutoModelForImageTextToText as AutoModelForCausalLM
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():  # larger weights than the 0.02 default: logits that differ clearly
        for name, parameter in model.named_parameters():
            if "norm" in name or "ln_" in name:
                parameter.copy_(
                    1.0 + 0.2 * torch.randn_like(parameter)
                    if name.endswith("weight")
                    else 0.1 * torch.randn_like(parameter)
                )
            else:
                parameter.copy_(0.15 * torch.randn_like(parameter))
        for name, buffer in model.named_buffers():  # MiniMax-M2's router bias is a buffer (zero by default)
            if family in ("minimax_m2", "glm4_moe", "kimi_linear") and name.endswith("e_score_correction_bias"):
                buffer.copy_(0.5 * torch.randn_like(buffer))
            if name.endswith("layer_scalar"):  # Gemma 4's layer scalars are buffers (ones by default)
                buffer.copy_(0.5 + torch.rand_like(buffer))
    model.save_pretrained(folder)
    if tokenizer:
        make_tokenizer(folder, bos=family != "gpt2")
    return model


def hf_logits(model: Any, ids: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """transformers' float32 logits; left padding gets positions counted over real tokens."""
    import torch

    x = torch.tensor(ids, dtype=torch.long)
    kwargs: dict[str, Any] = {}
    if mask is not None:
        m = torch.tensor(mask, dtype=torch.long)
        kwargs = {"attention_mask": m, "position_ids": (m.cumsum(-1) - 1).clamp(min=0)}
    with torch.no_grad():
        return model(x, **kwargs).logits.float().numpy()


def imported_logits(
    folder: Path, ids: np.ndarray, mask: np.ndarray | None = None, **extra: Any
) -> tuple[np.ndarray, Any]:
    """The logits of the checkpoint in ``folder`` as theseus imports it (``extra``: settings on top of its
    own), and the prepared import."""
    from tests.models.conftest import forward
    from theseus.model.huggingface.importer import prepare, read_params

    prepared = prepare(folder, extra)
    return forward(prepared.model, read_params(prepared), ids, mask), prepared


@pytest.fixture
def theseus(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Callable[..., tuple[int, str, str]]:
    """Run ``theseus ARGS`` in this process with ``--root`` = a fresh folder; (exit code, stdout, stderr)."""
    from theseus.cli.main import main

    root = tmp_path / "root"

    def run(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = 0
        try:
            main([args[0], args[1], "--root", str(root), *args[2:]])
        except SystemExit as exc:
            code = int(exc.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    run.root = root  # type: ignore[attr-defined]
    return run


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def assert_generation_matches(
    theseus: Callable[..., tuple[int, str, str]], run: str, source: Path, model: Any, prompt: str, new_tokens: int
) -> None:
    """Greedy ``generate`` of ``new_tokens`` from the imported ``run`` prints what transformers'
    greedy ``model.generate`` (the model saved in ``source``) decodes to."""
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    code, out, err = theseus(
        "run",
        "generate",
        f"generate/run={run}",
        f"generate/prompt={prompt}",
        "generate/temperature=0",
        f"generate/max_new_tokens={new_tokens}",
        "generate/stop_at_eot=false",
    )
    assert code == 0, err
    ids = AutoTokenizer.from_pretrained(source)(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        generated = model.generate(
            ids, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=256
        )
    new = generated[0, ids.shape[1] :].tolist()
    decoder = Tokenizer.from_file(str(source / "tokenizer.json"))
    assert out.rstrip("\n") == decoder.decode(ids[0, -len(prompt) :].tolist() + new, skip_special_tokens=False)
