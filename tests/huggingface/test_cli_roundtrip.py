"""End to end through the CLI: import, greedy generation against transformers, export and reload."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.huggingface.conftest import (
    HYBRID,
    NOPE,
    ONE_LAYER,
    TWO_LAYERS,
    hf_logits,
    imported_logits,
    read_json,
    save_model,
)
from tests.huggingface.test_import_parity import LONGROPE, YARN

PROMPT = "def f(x):"
#: A chat template given to the GPT-2 case's tokenizer (saved as chat_template.jinja by transformers 5).
CHAT_TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort 3 1 2."}]
#: Families exported as another (a vision-language checkpoint's language model: its text family).
EXPORTED_AS = {"qwen3_5_moe": "qwen3_5_moe_text", "gemma4": "gemma4_text"}
#: Families whose recurrent state carries bfloat16 rounding along (Gated DeltaNet layers).
RECURRENT = ("qwen3_next", "qwen3_5_text", "qwen3_5_moe")
#: The cases also exported sharded in bfloat16. The cast, the shard files and their index are the exporter's,
#: the same for every family (the dtype field is written by the families' shared to_config, the tensors each
#: family maps are what the float32 export above checks for all of them): GPT-2's transposed Conv1D and fused
#: c_attn, Phi-3's fused qkv_proj and gate_up_proj, a Gemma (transformers' own bfloat16 copy rounds its norms'
#: 1 + w, hence its wider tolerance) exported as its text family, and a recurrent family (the comparison with
#: transformers' rounded copy).
SHARDED = ("gpt2", "phi3-window-longrope", "gemma4", "qwen3_next")


#: Each family with what it adds; the windows (6) are shorter than the prompt and its 16 new tokens,
#: so generation runs past them against the KV cache. The families saved with 3 or 4 layers elsewhere have 2
#: here (TWO_LAYERS, HYBRID), and those whose layers are all alike 1 (ONE_LAYER): each kind of layer generation
#: meets, once.
FAMILIES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2": ("gpt2", {"n_layer": 1}),
    # YaRN: the prompt of 10 tokens and the new ones are past the original 8 positions
    # (two layers: with one, transformers' cached greedy decoding leaves its own forward's argmax at the 8th
    # new token, where theseus keeps to the forward's)
    "llama-yarn": ("llama", {"rope_parameters": YARN}),
    "mistral-window": ("mistral", {"sliding_window": 6, **ONE_LAYER}),
    "qwen3-window": ("qwen3", {"use_sliding_window": True, "sliding_window": 6, "max_window_layers": 0, **ONE_LAYER}),
    "olmo2": ("olmo2", ONE_LAYER),
    # OLMo 2 with the window on layer 0 only and YaRN on the full layer 1 (rope_scaling: the full layers')
    "olmo3-window-yarn": ("olmo3", {"sliding_window": 6, "rope_scaling": {**YARN, "rope_theta": 5e5}}),
    # the window on layer 0 only; capped scores and logits (Gemma 2), two RoPE bases, linear scaling of the
    # full layers' (Gemma 3)
    "gemma2-window": ("gemma2", {"sliding_window": 6}),
    "gemma3-window": ("gemma3_text", {"sliding_window": 6, "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
    # attention sinks, biases, YaRN unrounded, biased experts with a clamp; the window on layer 0 only
    "gpt_oss-window": ("gpt_oss", {"sliding_window": 6}),
    # chunks of 5 (the KV cache keeps each key's position), NoPE layers with a temperature, interleaved
    # dense and mixture layers with a shared expert
    "llama4_text-chunks": ("llama4_text", TWO_LAYERS),
    # Gated DeltaNet layers decoding through their recurrent and convolution states, gated full-attention
    # layers with partial RoPE, a gated shared expert
    "qwen3_next": ("qwen3_next", HYBRID),
    # the same layers with the split linear-attention projections and a dense MLP on every layer; and a
    # vision-language MoE checkpoint whose language model is imported and exported text-only
    "qwen3_5_text": ("qwen3_5_text", HYBRID),
    "qwen3_5_moe": ("qwen3_5_moe", HYBRID),
    # q/k norms over the whole projections, partial RoPE (rotary_dim), a sigmoid router with a balancing bias
    "minimax_m2": ("minimax_m2", ONE_LAYER),
    # fused qkv_proj / gate_up_proj split and fused back; LongRoPE's long factors (the prompt of 10 tokens
    # is past the original 8 positions)
    # DeepSeek Sparse Attention: the indexer keeps 4 keys, its keys cached beside the latents while decoding
    "deepseek_v32-sparse": ("deepseek_v32", {}),
    # GLM-5: the same with the indexer's interleaved rotary pairs
    "glm_moe_dsa-sparse": ("glm_moe_dsa", {}),
    "phi3-window-longrope": (
        "phi3",
        {"sliding_window": 6, "rope_parameters": LONGROPE, "original_max_position_embeddings": 8, **ONE_LAYER},
    ),
    # a NoPE layer (the KV cache of a layer that rotates nothing), attention biases, a tied head
    "smollm3": ("smollm3", {}),
    # partial RoPE, query/key/value biases and norms, a dense layer then grouped sigmoid-routed mixtures with
    # a selection bias and a shared expert
    "glm4_moe": ("glm4_moe", TWO_LAYERS),
    # Gemma 4: the window on layer 0 only, the full layer's wider heads (its keys as its values) rotated
    # proportionally, per-layer inputs, layer scalars; and the language model of a multimodal checkpoint
    # (towers skipped), exported text-only
    "gemma4_text-window": ("gemma4_text", {"sliding_window": 6, "attention_k_eq_v": True}),
    "gemma4": ("gemma4", {"sliding_window": 6}),
    # a gated short-convolution layer decoding through its rolling state, an attention layer with q/k norms
    "lfm2": ("lfm2", {}),
    # a Mamba-2 layer decoding from its cached state and convolution inputs, a NoPE attention layer, an MLP layer
    "nemotron_h": ("nemotron_h", {}),
    # attention and a Mamba-2 mixer in parallel, both decoding from their caches; the gated group norm on
    "falcon_h1": ("falcon_h1", {"mamba_rms_norm": True}),
    # a pre-norm Gated DeltaNet layer decoding from its cached state and convolution inputs, a post-norm OLMo 3
    # attention layer without position embeddings (the releases' NoPE, exported as such)
    "olmo_hybrid": ("olmo_hybrid", {"rope_parameters": NOPE}),
    # a Mamba-2 layer decoding from its cached state and convolution inputs, a NoPE attention layer, each with 4
    # experts (fused gate/up rows read and written back) beside a shared MLP; Granite's multipliers
    "granitemoehybrid": ("granitemoehybrid", {}),
    # Kimi Delta Attention decoding from its cached state and convolution inputs, NoPE latent attention from its
    # compressed cache, a dense MLP then a mixture with a shared expert
    "kimi_linear": ("kimi_linear", {}),
    # hyper-connection streams, n-gram embeddings decoding from the previous ids and the convolution's inputs,
    # the indexer's keys cached beside the attention's
    "qwen4_exp_text": ("qwen4_exp_text", {}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(FAMILIES))
def test_import_generate_export_round_trip(case: str, tmp_path: Path, theseus: Any) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    family, overrides = FAMILIES[case]
    source = tmp_path / "source"
    model = save_model(source, family, vocab_size=258, **overrides)
    if family == "gpt2":  # a chat model: its template is kept by the import and written by the export
        chat_tok = AutoTokenizer.from_pretrained(source)
        chat_tok.chat_template = CHAT_TEMPLATE
        chat_tok.save_pretrained(source)
    code, _, err = theseus("run", "hf/import", f"hf/source={source}", "run/name=imported")
    assert code == 0, err
    run = theseus.root / "runs" / "imported"
    assert (run / "checkpoints" / "0").is_dir() and (run / "tokenizer" / "tokenizer.json").is_file()
    record = read_json(run / "provenance.json")
    assert record["huggingface"]["model_type"] == family
    assert set(record["huggingface"]["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}

    # greedy generation: the same 16 tokens as transformers
    code, out, err = theseus(
        "run",
        "generate",
        "generate/run=imported",
        f"generate/prompt={PROMPT}",
        "generate/temperature=0",
        "generate/max_new_tokens=16",
        "generate/stop_at_eot=false",
    )
    assert code == 0, err
    hf_tok = AutoTokenizer.from_pretrained(source)
    ids = hf_tok(PROMPT, return_tensors="pt").input_ids
    if family == "gpt2":  # theseus starts a text after end-of-text, as documents start in packed data
        ids = torch.cat([torch.tensor([[256]]), ids], dim=1)
    with torch.no_grad():
        generated = model.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=256)
    new = generated[0, ids.shape[1] :].tolist()
    assert len(new) == 16
    decoder = Tokenizer.from_file(str(source / "tokenizer.json"))
    assert out.rstrip("\n") == decoder.decode(ids[0, -len(PROMPT) :].tolist() + new, skip_special_tokens=False)

    # export, then transformers loads it with the same logits
    out_dir = tmp_path / "export"
    code, _, err = theseus("run", "hf/export", "hf/run=imported", f"hf/out={out_dir}")
    assert code == 0, err
    reloaded, info = AutoModelForCausalLM.from_pretrained(out_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys"))
    x = np.random.default_rng(0).integers(0, 258, (2, 9))
    assert np.max(np.abs(hf_logits(reloaded.eval(), x) - hf_logits(model, x))) <= 1e-5
    exported_tok = AutoTokenizer.from_pretrained(out_dir)
    assert exported_tok(PROMPT).input_ids == hf_tok(PROMPT).input_ids
    if family == "gpt2":  # the chat template travels: the export renders prompts as the source does
        rendered = exported_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        assert rendered == hf_tok.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
        assert rendered == "<system>Be brief.</s><user>Sort 3 1 2.</s><assistant>"
        code, _, err = theseus("run", "hf/import", f"hf/source={out_dir}", "run/name=again")
        assert code == 0, err
        for name in ("imported", "again"):  # the template a run renders its prompts with (rl/chat, generate)
            assert read_json(theseus.root / "runs" / name / "chat_template.json")["chat_template"] == CHAT_TEMPLATE
    exported = read_json(out_dir / "config.json")
    assert exported["model_type"] == EXPORTED_AS.get(family, family)
    assert getattr(reloaded.config, "sliding_window", None) == overrides.get("sliding_window")
    if "rope_parameters" in overrides:
        assert reloaded.config.rope_parameters["rope_type"] == overrides["rope_parameters"]["rope_type"]
    if family == "minimax_m2":  # the partial rotation in both fields transformers reads
        assert (exported["rotary_dim"], reloaded.config.rope_parameters["partial_rotary_factor"]) == (8, 0.5)
    if family == "glm4_moe":  # the partial rotation and the routing as they were
        assert reloaded.config.rope_parameters["partial_rotary_factor"] == 0.5
        assert (reloaded.config.n_group, reloaded.config.routed_scaling_factor, reloaded.config.use_qk_norm) == (
            2,
            2.5,
            True,
        )
    if family == "lfm2":  # the layer kinds and the feed-forward's width as transformers built them
        assert reloaded.config.layer_types == model.config.layer_types == ["conv", "full_attention"]
        assert reloaded.model.layers[0].feed_forward.w1.weight.shape == (48, 32)
    if family == "nemotron_h":  # the layer kinds and the mixer's shape as they were
        assert reloaded.config.layers_block_type == ["linear_attention", "full_attention", "mlp"]
        assert (reloaded.config.mamba_num_heads, reloaded.config.n_groups, reloaded.config.chunk_size) == (4, 2, 4)
    if family == "falcon_h1":  # the mixer's shape, its norm and the multipliers as they were
        assert (reloaded.config.mamba_n_heads, reloaded.config.mamba_n_groups, reloaded.config.mamba_rms_norm) == (
            4,
            2,
            True,
        )
        assert reloaded.config.ssm_multipliers == model.config.ssm_multipliers
        assert abs(reloaded.config.key_multiplier - 0.4) <= 1e-12
    if family == "olmo_hybrid":  # the layer kinds as they were, and still no position embedding
        assert reloaded.config.layer_types == ["linear_attention", "full_attention"]
        assert reloaded.model.rotary_emb is None and reloaded.config.linear_allow_neg_eigval
    if family == "granitemoehybrid":  # the layer kinds, the mixture and the multipliers as they were
        assert reloaded.config.layer_types == ["linear_attention", "full_attention"]
        assert (reloaded.config.num_local_experts, reloaded.config.shared_intermediate_size) == (4, 24)
        assert (reloaded.config.mamba_n_heads, reloaded.config.mamba_n_groups, reloaded.config.mamba_expand) == (
            4,
            2,
            1,
        )
        assert (reloaded.config.embedding_multiplier, reloaded.config.logits_scaling) == (12.0, 4.0)
        assert reloaded.config.attention_multiplier == 0.25 and reloaded.model.rotary_emb is None
    if family == "kimi_linear":  # the layer kinds and the feed-forwards as they were
        assert reloaded.config.layer_types == ["linear_attention", "full_attention"]
        assert reloaded.config.mlp_layer_types == ["dense", "sparse"]
    if family == "qwen4_exp_text":  # the streams, the n-gram layer and the indexer as they were
        assert (reloaded.config.hc_count, reloaded.config.ple_layer_ids, reloaded.config.indexer_budget) == (3, [1], 4)
        assert reloaded.config.layer_types == ["linear_attention", "indexed_attention"]
    if family == "smollm3":  # the NoPE layers as they were
        assert reloaded.config.no_rope_layers == model.config.no_rope_layers == [1, 0]
    if family == "olmo3":  # one rope_parameters entry per layer type, the layer types as they were
        assert reloaded.config.layer_types == model.config.layer_types == ["sliding_attention", "full_attention"]
        theirs, mine = reloaded.config.rope_parameters, model.config.rope_parameters
        assert theirs["sliding_attention"] == mine["sliding_attention"]  # the full entry gains yarn's defaults
        assert {k: theirs["full_attention"][k] for k in mine["full_attention"]} == mine["full_attention"]

    if case not in SHARDED:
        return
    # sharded, bfloat16: an index and several files that transformers reads back
    sharded = tmp_path / "sharded"
    code, _, err = theseus(
        "run", "hf/export", "hf/run=imported", f"hf/out={sharded}", "hf/shard_size=20KB", "hf/dtype=bfloat16"
    )
    assert code == 0, err
    index = read_json(sharded / "model.safetensors.index.json")
    assert len(set(index["weight_map"].values())) > 1
    reloaded = AutoModelForCausalLM.from_pretrained(sharded, dtype=torch.float32).eval()
    if family in RECURRENT:  # transformers' own bfloat16 copy is 1.97 off (the recurrent state carries
        # the rounding along): compare with that copy, which the export's rounding must equal
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.copy_(parameter.to(torch.bfloat16).float())
        assert np.max(np.abs(hf_logits(reloaded, x) - hf_logits(model, x))) <= 1e-4
        return
    # transformers' own bfloat16 copy of the Gemma models is 0.08-0.14 off (their norms multiply by 1 + w)
    assert np.max(np.abs(hf_logits(reloaded, x) - hf_logits(model, x))) <= (0.2 if family.startswith("gemma") else 0.1)


def test_sharded_transformers_checkpoint_imports(tmp_path: Path) -> None:
    import torch

    model = save_model(tmp_path / "a", "qwen2", tokenizer=False)
    model.save_pretrained(tmp_path / "b", max_shard_size="30KB")
    assert (tmp_path / "b" / "model.safetensors.index.json").is_file()
    ids = np.arange(10)[None] % 300
    got, _ = imported_logits(tmp_path / "b", ids)
    assert torch.is_tensor(model.lm_head.weight)
    assert np.max(np.abs(got - hf_logits(model, ids))) <= 1e-4


def test_a_byte_level_runs_chat_template_is_exported_for_apply_chat_template(tmp_path: Path) -> None:
    """What ``hf/export`` writes of a run fine-tuned on chat data (its ``chat_template.json``) beside the byte
    tokenizer: transformers renders the run's prompts, and the import reads the template back."""
    import json

    from transformers import AutoTokenizer

    from theseus.data.chat import BUILTIN_TEMPLATES, ChatTemplate
    from theseus.model.huggingface.exporter import write_chat_template, write_tokenizer
    from theseus.model.huggingface.tokenizer_files import chat_template_record

    run, out = tmp_path / "run", tmp_path / "out"
    run.mkdir(), out.mkdir()
    kept = {"chat_template": BUILTIN_TEMPLATES["chatml"], "bos_token": "", "eos_token": ""}
    (run / "chat_template.json").write_text(json.dumps(kept))
    assert write_tokenizer(out, run, {"kind": "byte"}, 64) == (256, 256)
    write_chat_template(out, run)
    rendered = AutoTokenizer.from_pretrained(out).apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
    assert rendered == ChatTemplate(BUILTIN_TEMPLATES["chatml"]).render(CHAT, add_generation_prompt=True)
    assert rendered.endswith("<|im_start|>user\nSort 3 1 2.<|im_end|>\n<|im_start|>assistant\n")
    assert chat_template_record(out) == kept | {"eos_token": "<|endoftext|>", "bos_token": "<|endoftext|>"}
