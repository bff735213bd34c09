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
        GPT2Config,
        GptOssConfig,
        Llama4TextConfig,
        LlamaConfig,
        MistralConfig,
        MixtralConfig,
        Olmo2Config,
        Olmo3Config,
        Phi3Config,
        Qwen2Config,
        Qwen3Config,
        Qwen3MoeConfig,
        Qwen3NextConfig,
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
        "gpt_oss": GptOssConfig,
        "llama4_text": Llama4TextConfig,
        "qwen3_next": Qwen3NextConfig,
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
    if family == "phi3":  # its default pad id (32000) is past this vocabulary
        common["pad_token_id"] = None
    if family in GEMMA:
        return gemma_config(family, common, overrides)
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

#: Gemma 3's 4B+ releases: linear scaling of the full layers' RoPE only.
GEMMA3_LINEAR = {
    "full_attention": {"rope_type": "linear", "rope_theta": 1e4, "factor": 8.0},
    "sliding_attention": {"rope_type": "default", "rope_theta": 1e3},
}

#: Gemma families: a window of 5 and a full layer, a query scalar that is not head_dim, caps that bind.
GEMMA = {
    "gemma2": {"attn_logit_softcapping": 3.0, "final_logit_softcapping": 4.0},
    "gemma3_text": {"rope_parameters": None},
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


def save_model(folder: Path, family: str, seed: int = 0, *, tokenizer: bool = True, **overrides: Any) -> Any:
    """A random transformers model of ``family`` saved in ``folder`` (float32 safetensors); returns it."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(family, **overrides)
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
