"""Imported checkpoints compute what transformers computes (float32 logits within 1e-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.huggingface.conftest import (
    GEMMA,
    GEMMA3_LINEAR,
    GEMMA4_FAMILIES,
    NEMOTRON_H,
    NOPE,
    QWEN3_5_FAMILIES,
    VISION_LANGUAGE,
    VOCAB,
    hf_logits,
    imported_logits,
    save_model,
)
from tests.models.conftest import forward
from theseus.errors import ConfigError
from theseus.model.generation.decode import check_rope_switch
from theseus.model.huggingface.importer import prepare, read_params

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

#: YaRN as Qwen3's long-context setting has it, at a small scale: trained on 8 positions, stretched 4x
#: (the attention factor left to its default, 0.1 ln 4 + 1); prompts of 12 tokens run past the 8.
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}

#: OLMo 3's rope_parameters: one entry per layer type.
OLMO3_ROPE = {"full_attention": dict(YARN), "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}}

#: Families whose imported models have a window on some layers by default (see conftest.hf_config).
WINDOWED = (*GEMMA, "olmo3", "gpt_oss")

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2-tied": ("gpt2", {}),
    "gpt2-untied": ("gpt2", {"tie_word_embeddings": False}),
    # GQA, head_dim 16 (4 heads x 16 != 32 wide), llama3 RoPE scaling, untied head
    "llama3-scaled-headdim": ("llama", {"head_dim": 16, "rope_parameters": LLAMA3}),
    "llama-tied-linear": (
        "llama",
        {"tie_word_embeddings": True, "rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0}},
    ),
    "qwen2-biases": ("qwen2", {"tie_word_embeddings": True}),
    # prompts of 12 tokens against windows of 5: the window changes the logits of the later tokens
    "mistral-window": ("mistral", {"sliding_window": 5}),
    "qwen2-window": ("qwen2", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}),
    "qwen3-qk-norm": ("qwen3", {}),
    # head_dim = hidden_size / heads: the import still sets it, so the Qwen3 preset's own width never applies
    "qwen3-width-heads": ("qwen3", {"head_dim": 8}),
    "qwen3-window": ("qwen3", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}),
    "qwen3-yarn": ("qwen3", {"rope_parameters": YARN}),
    # norms after each branch, q/k RMSNorm over the whole projection (GQA: 4 query, 2 key heads)
    "olmo2": ("olmo2", {}),
    "olmo2-tied-bias": ("olmo2", {"tie_word_embeddings": True, "attention_bias": True}),
    # OLMo 2 with a window of 5 on layer 0 and a full layer 1; YaRN on the full layer only, base 1e3 on the sliding
    "olmo3-yarn": ("olmo3", {"rope_parameters": OLMO3_ROPE}),
    # a window of 5 on layer 0, full attention on layer 1, capped scores and logits, sandwich norms
    "gemma2": ("gemma2", {}),
    # per-head q/k norms, bases 1e3 (sliding) / 1e6 (full), an untied head
    "gemma3-untied": ("gemma3_text", {"tie_word_embeddings": False}),
    "gemma3-linear-rope": ("gemma3_text", {"rope_parameters": GEMMA3_LINEAR}),
    # attention sinks and biases, a window of 5 on layer 0, YaRN unrounded, biased experts with a binding clamp
    "gpt-oss": ("gpt_oss", {}),
    # chunks of 5 on the RoPE layers (pairs rotated, L2-normalised), NoPE layers with a temperature that
    # binds, dense and mixture layers interleaved (sigmoid-scaled expert inputs, a shared expert)
    "llama4": ("llama4_text", {}),
    # Gated DeltaNet and gated full-attention layers (partial RoPE), zero-centred norms, a dense layer then
    # mixtures with a gated shared expert
    "qwen3-next": ("qwen3_next", {}),
    # q/k RMSNorm over the whole projections, half of each head rotated (rotary_dim), 4 experts chosen by a
    # sigmoid router with a random balancing bias
    "minimax-m2": ("minimax_m2", {}),
    # fused qkv_proj (GQA: 4 query, 2 key/value heads) and gate_up_proj split on import, with a window of 5
    # (Phi-3 without a window: test_a_window_longer_than_the_context_imports_as_full_attention)
    "phi3-window": ("phi3", {"sliding_window": 5}),
    # latent attention with DeepSeek Sparse Attention: an indexer (rotating halves) keeps 4 of the prompt's 12 keys
    "deepseek-v32-sparse": ("deepseek_v32", {}),
    # GLM-5: the same, its indexer rotating interleaved pairs
    "glm-moe-dsa-sparse": ("glm_moe_dsa", {}),
    # a NoPE layer 1 (no_rope_layer_interval 2), biases on every attention projection, a tied head
    "smollm3": ("smollm3", {}),
    "smollm3-untied-listed": ("smollm3", {"tie_word_embeddings": False, "no_rope_layers": [0, 1]}),
    # half of each head rotated, query/key/value biases, per-head q/k norms, a dense layer then mixtures
    # routed by sigmoid scores with a selection bias, from 1 of 2 groups, scaled 2.5, with a shared expert
    "glm4-moe": ("glm4_moe", {}),
    # GLM-4.5-Air's switches: no q/k norms, one group, unscaled; the partial rotation at the top level
    "glm4-moe-air": (
        "glm4_moe",
        {"use_qk_norm": False, "n_group": 1, "routed_scaling_factor": 1.0}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}, "partial_rotary_factor": 0.25},
    ),
    # Qwen3-Next's layers with the split linear-attention projections (in_proj_qkv / z / b / a), the text
    # positions' multimodal RoPE, a dense MLP on every layer; and nested in a vision-language checkpoint
    # (text_config, model.language_model.*, a vision tower left out)
    "qwen3_5-text": ("qwen3_5_text", {}),
    "qwen3_5-vision-language": ("qwen3_5", {}),
    # every layer a mixture with a gated shared expert; the experts also read fused, as the releases hold them
    "qwen3_5_moe-text": ("qwen3_5_moe_text", {}),
    "qwen3_5_moe-vision-language": ("qwen3_5_moe", {}),
    # Gemma 4: plain-scale norms, value norms, unscaled scores, a full layer of wider heads rotated
    # proportionally, per-layer inputs, layer scalars, capped logits; then the full layer's keys as its values
    # (attention_k_eq_v, one key/value head) with an untied head; and nested in a multimodal checkpoint
    # (text_config, model.language_model.*, vision and audio towers skipped)
    "gemma4-text": ("gemma4_text", {}),
    "gemma4-k-eq-v": (
        "gemma4_text",
        {"attention_k_eq_v": True, "num_global_key_value_heads": 1, "tie_word_embeddings": False},
    ),
    "gemma4-multimodal": ("gemma4", {}),
    # a gated short-convolution layer (its input masked at the left padding) and an attention layer with
    # per-head q/k norms, the feed-forward's width adjusted from block_ff_dim, a tied head
    "lfm2": ("lfm2", {}),
    # a Mamba-2 layer (its state carried across chunks of 4, its input masked at the left padding), an attention
    # layer without position embeddings and a squared-ReLU MLP layer, each with its own norm
    "nemotron_h": ("nemotron_h", {}),
    # attention and a Mamba-2 mixer in parallel on one norm (its state across chunks of 4, its input masked at the
    # left padding), every Falcon-H1 multiplier away from 1
    "falcon_h1": ("falcon_h1", {}),
    # a pre-norm Gated DeltaNet layer (separate projections, the write strength doubled, its state carried across
    # chunks of 4) and a post-norm OLMo 3 attention layer: without position embeddings (the releases) and with RoPE
    "olmo_hybrid-nope": ("olmo_hybrid", {"rope_parameters": NOPE}),
    "olmo_hybrid-rope": ("olmo_hybrid", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e3}}),
    # a Mamba-2 layer (its state across chunks of 4, its input masked at the left padding) and an attention layer
    # without position embeddings, each followed by 4 experts (top 2, fused gate/up rows) beside a shared MLP,
    # every Granite multiplier away from 1; then without experts (the shared MLP alone) and with RoPE
    "granitemoehybrid": ("granitemoehybrid", {}),
    "granitemoehybrid-dense-rope": (
        "granitemoehybrid",
        {"num_local_experts": 0, "position_embedding_type": "rope", "tie_word_embeddings": True}
        | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e3}},
    ),
    # a Kimi Delta Attention layer (a forget gate per key channel from a low-rank pair, its state carried across
    # chunks of 4, a sigmoid-gated output norm) with a dense MLP, then a NoPE latent-attention layer with a mixture
    # of experts routed by sigmoid scores with a random balancing bias, from 1 of 2 groups, and a shared expert
    "kimi_linear": ("kimi_linear", {}),
    # Qwen3.5-MoE's layers on 3 hyper-connection streams, hashed n-gram embeddings on the Gated DeltaNet layer
    # (their tables stored in 2 shards), the attention layer's indexer keeping 2 blocks of 2 keys; the same
    # logits scanned
    "qwen4_exp": ("qwen4_exp_text", {}),
}

#: Settings on top of an imported case's own: Kimi Delta Attention's prompt of 12 in chunks of 4 (its state carried
#: across them; transformers' chunks are 64).
SETTINGS: dict[str, dict[str, Any]] = {"kimi_linear": {"architecture/linear_chunk_size": 4}}


def fuse_experts(path: Path) -> None:
    """Rewrite a Qwen3.5 MoE checkpoint's experts (``experts.<j>.{gate,up,down}_proj.weight``, as
    ``save_pretrained`` writes them) fused as the releases hold them: ``experts.gate_up_proj`` ``[E, 2F, D]``
    and ``experts.down_proj`` ``[E, D, F]``."""
    import re

    from safetensors.numpy import load_file, save_file

    tensors = load_file(path)
    experts: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    for name in list(tensors):
        found = re.fullmatch(r"(.*\.mlp\.experts\.)(\d+)\.(gate|up|down)_proj\.weight", name)
        if found:
            prefix, j, kind = found.groups()
            experts.setdefault(prefix, {}).setdefault(kind, {})[int(j)] = tensors.pop(name)
    for prefix, kinds in experts.items():
        stack = {kind: np.stack([w[j] for j in sorted(w)]) for kind, w in kinds.items()}
        tensors[prefix + "gate_up_proj"] = np.concatenate([stack["gate"], stack["up"]], axis=1)
        tensors[prefix + "down_proj"] = stack["down"]
    save_file(tensors, path, metadata={"format": "pt"})


def full_attention_logits(prepared: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The imported model's logits with its window switched off (the same weights)."""
    params = read_params(prepared)
    return forward(prepared.model.clone(sliding_window=None), params, ids, mask)


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case: str, tmp_path: Path) -> None:
    family, overrides = CASES[case]
    model = save_model(tmp_path, family, **overrides)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False  # a left-padded row: positions count real tokens only
    got, prepared = imported_logits(tmp_path, ids, mask, **SETTINGS.get(case, {}))
    expected = hf_logits(model, ids, mask)
    assert np.max(np.abs(got - expected)[mask]) <= 1e-4
    arch = prepared.model.architecture
    assert arch.attention.sliding_window == overrides.get("sliding_window", 5 if family in WINDOWED else None)
    assert arch.attention.qk_norm == (
        family
        in (
            "qwen3",
            "olmo2",
            "olmo3",
            "olmo_hybrid",
            "gemma3_text",
            "qwen3_next",
            "minimax_m2",
            "lfm2",
            "qwen4_exp_text",
            *QWEN3_5_FAMILIES,
        )
        or family in GEMMA4_FAMILIES
        or overrides.get("use_qk_norm", family == "glm4_moe")
    )
    assert (arch.attention.qk_norm_span, arch.norm.placement) == (
        ("projection", "post")
        if family in ("olmo2", "olmo3", "olmo_hybrid")
        else ("projection", "pre")
        if family == "minimax_m2"
        else ("head", "sandwich" if family in GEMMA else "none" if family == "qwen4_exp_text" else "pre")
    )
    if arch.attention.sliding_window is not None:  # not a vacuous match: without the window the logits differ
        assert np.max(np.abs(got - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2
    tied = family in ("gpt2", "qwen3", "smollm3", "lfm2", *GEMMA)
    assert arch.tied_embeddings == bool(overrides.get("tie_word_embeddings", tied))
    if family == "olmo3":
        assert arch.layer_types == ("sliding_attention", "full_attention")
        assert (arch.position.scaling.kind, arch.position.theta, arch.position.local_theta) == ("yarn", 1e4, 1e3)
    if family == "qwen2":
        assert (arch.attention.qkv_bias, arch.attention.has_out_bias, arch.feed_forward.bias) == (True, False, False)
    if family == "gpt_oss":
        assert arch.layer_types == ("sliding_attention", "full_attention") and arch.moe is not None
        assert (arch.position.scaling.kind, arch.position.scaling.truncate, arch.position.theta) == (
            "yarn",
            False,
            1.5e5,
        )
        for layer in model.model.layers:  # not a vacuous match: the clamp binds
            layer.mlp.experts.limit = 1e9
        assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
    if family == "llama4_text":
        assert arch.layer_types == ("chunked_attention", "full_attention") * 2 and arch.mixture_layers == (1, 3)
        model.config.attention_chunk_size = 64  # not a vacuous match: without chunks the logits differ
        assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
        model.config.attention_chunk_size = 5
        for layer in model.model.layers:  # nor without the temperature
            layer.self_attn.attn_temperature_tuning = False
        assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
    if family == "qwen3_next":
        assert arch.layer_types == ("linear_attention", "full_attention") * 2 and arch.norm.zero_centred
        assert (arch.moe is not None and arch.moe.first_k_dense, arch.shared_expert_hidden) == (1, 20)
        chunked = prepared.model.clone(linear_chunk=4)  # the prompt of 12 in 3 chunks: the state carried
        short = forward(chunked, read_params(prepared), ids, mask)
        assert np.max(np.abs(short - expected)[mask]) <= 1e-4
    if family == "glm4_moe":
        moe, partial = arch.moe, overrides.get("partial_rotary_factor", 0.5)
        assert (arch.attention.qkv_bias, arch.attention.has_out_bias, arch.head_dim) == (True, False, 16)
        assert prepared.config["architecture/partial_rotary_factor"] == partial
        assert moe is not None and (moe.router, moe.first_k_dense, moe.n_shared) == ("sigmoid", 1, 1)
        routing = (overrides.get("n_group", 2), overrides.get("routed_scaling_factor", 2.5))
        assert (moe.n_group, moe.routed_scaling_factor) == routing
        whole, _ = imported_logits(tmp_path, ids, mask, **{"architecture/partial_rotary_factor": 1.0})
        assert np.max(np.abs(whole - got)[mask]) > 1e-2  # not a vacuous match: rotating whole heads differs
    if family == "smollm3":
        rope = tuple(bool(f) for f in overrides.get("no_rope_layers", [1, 0]))
        assert arch.rope_layers == rope and (arch.attention.qkv_bias, arch.attention.has_out_bias) == (True, True)
        assert arch.position.theta == 5e6
        for layer in model.model.layers:  # not a vacuous match: with RoPE on every layer the logits differ
            layer.self_attn.use_rope = 1
        assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
    if family == "minimax_m2":
        assert arch.moe is not None and (arch.moe.router, arch.moe.norm_topk_prob) == ("sigmoid", True)
        assert prepared.config["architecture/partial_rotary_factor"] == 0.5
        whole, _ = imported_logits(tmp_path, ids, mask, **{"architecture/partial_rotary_factor": 1.0})
        assert np.max(np.abs(whole - expected)[mask]) > 1e-2  # not vacuous: rotating whole heads differs
        params = read_params(prepared)
        for layer in range(arch.n_layers):  # nor without the router's bias
            mlp = params[f"blocks_{layer}"]["mlp"]
            mlp["router_bias"] = np.zeros_like(mlp["router_bias"])
        unbiased = forward(prepared.model, params, ids, mask)
        assert np.max(np.abs(unbiased - expected)[mask]) > 1e-2
    if family in ("deepseek_v32", "glm_moe_dsa"):
        dsa, mla = arch.dsa, arch.mla
        assert (dsa.index_topk, dsa.index_n_heads, dsa.index_head_dim, dsa.phase) == (4, 8, 16, "sparse")
        assert (dsa.rope_interleave, mla.rope_interleave, mla.q_lora_rank) == (family == "glm_moe_dsa", True, 12)
        params = read_params(prepared)  # not a vacuous match: with every key kept (dense) the logits differ
        dense = forward(prepared.model.clone(index_topk=64), params, ids, mask)
        assert np.max(np.abs(dense - expected)[mask]) > 1e-2
        other = forward(prepared.model.clone(index_rope_interleave=not dsa.rope_interleave), params, ids, mask)
        assert np.max(np.abs(other - expected)[mask]) > 1e-2  # nor with the other rotary layout in the indexer
    if family in QWEN3_5_FAMILIES:
        assert arch.layer_types == ("linear_attention", "full_attention") * 2 and arch.norm.zero_centred
        assert prepared.config["architecture/partial_rotary_factor"] == 0.25
        assert (arch.moe is not None) == ("moe" in family) and arch.feed_forward.d_ff == (24 if arch.moe else 48)
        if family in VISION_LANGUAGE:  # the checkpoint's vision tower is set aside
            assert any(name.startswith("model.visual.") for name in prepared.checkpoint.tensors)
        if arch.moe is not None:
            assert arch.moe.first_k_dense == 0 and arch.moe.norm_topk_prob and arch.shared_expert_hidden == 20
            fuse_experts(tmp_path / "model.safetensors")
            fused, _ = imported_logits(tmp_path, ids, mask)
            assert np.max(np.abs(fused - expected)[mask]) <= 1e-4
    if family == "lfm2":
        assert (arch.layer_types, arch.feed_forward.d_ff, arch.conv_kernel, arch.position.theta) == (
            ("conv", "full_attention"),
            48,
            3,
            1e6,
        )
        params = read_params(prepared)  # not a vacuous match: without the convolution's history the logits differ
        params["blocks_0"]["attn"]["conv"] = np.asarray(params["blocks_0"]["attn"]["conv"]) * np.array([[0], [0], [1]])
        assert np.max(np.abs(forward(prepared.model, params, ids, mask) - expected)[mask]) > 1e-2
    if family == "nemotron_h":
        check_nemotron_h(prepared, ids, mask, expected)
    if family == "falcon_h1":
        check_falcon_h1(prepared, ids, mask, expected)
    if family == "olmo_hybrid":
        check_olmo_hybrid(prepared, ids, mask, expected, overrides)
    if family == "granitemoehybrid":
        check_granite(prepared, ids, mask, expected, overrides)
    if family == "kimi_linear":
        check_kimi_linear(prepared, ids, mask, expected)
    if family in GEMMA4_FAMILIES:
        check_gemma4(prepared, model, ids, mask, expected, overrides)
    if family == "qwen4_exp_text":
        check_qwen4_exp(tmp_path, model, prepared, ids, mask, expected)
    if "head_dim" in overrides:
        assert arch.head_dim == overrides["head_dim"] and arch.n_embd == 32
    if overrides.get("rope_parameters", {}).get("rope_type") == "yarn":
        assert (arch.position.scaling.kind, arch.position.scaling.original_max_positions) == ("yarn", 8)
        assert abs(arch.position.scaling.magnitude - 1.1386294361119891) <= 1e-12


def check_nemotron_h(prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray) -> None:
    """The layer kinds and the mixer's shape as transformers built them, and the Mamba-2 state matters: with
    fast decays (the state forgets each step) the logits differ."""
    arch = prepared.model.architecture
    assert (arch.layer_types, arch.position.kind, arch.feed_forward.activation) == (
        ("mamba", "full_attention", "mlp"),
        "none",
        "relu2",
    )
    assert (arch.mamba.n_heads, arch.mamba.head_dim, arch.mamba.state_size, arch.mamba.n_groups) == (4, 8, 8, 2)
    params = read_params(prepared)
    assert sorted(params["blocks_0"]) == ["attn", "attn_norm"] and sorted(params["blocks_2"]) == ["mlp", "mlp_norm"]
    params["blocks_0"]["attn"]["A_log"] = np.asarray(params["blocks_0"]["attn"]["A_log"]) + 6.0
    assert np.max(np.abs(forward(prepared.model, params, ids, mask) - expected)[mask]) > 1e-2


def check_falcon_h1(prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray) -> None:
    """The mixer's shape and the multipliers as transformers built them, both parallel mixers in one layer, and
    not a vacuous match: without the Mamba-2 mixer's output the logits differ."""
    arch = prepared.model.architecture
    assert (arch.mamba.n_heads, arch.mamba.head_dim, arch.mamba.n_groups, arch.mamba_rms_norm) == (4, 8, 2, False)
    scales = arch.multipliers
    assert (scales.embedding, scales.key, scales.ssm_out, scales.ssm, scales.mlp) == (
        2.5,
        0.4,
        0.6,
        (0.35, 0.25, 0.5, 0.7, 0.3),
        (0.9, 0.6),
    )
    params = read_params(prepared)
    assert sorted(params["blocks_0"]) == ["attn", "attn_norm", "mamba", "mlp", "mlp_norm"]
    params["blocks_0"]["mamba"]["out_proj"] = np.zeros_like(params["blocks_0"]["mamba"]["out_proj"])
    assert np.max(np.abs(forward(prepared.model, params, ids, mask) - expected)[mask]) > 1e-2


def check_olmo_hybrid(
    prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray, overrides: dict[str, Any]
) -> None:
    """The layer kinds, the Gated DeltaNet's shape as transformers' defaults give it and RoPE only with a base;
    without RoPE (once is enough) the state carried across chunks of 4 gives the same logits, and the doubled
    write strength matters."""
    arch = prepared.model.architecture
    rotary = overrides["rope_parameters"]["rope_theta"] is not None
    assert (arch.layer_types, arch.position.kind, arch.linear_beta_scale) == (
        ("linear_attention", "full_attention"),
        "rope" if rotary else "none",
        2.0,
    )
    assert (arch.linear_key_heads, arch.linear_key_dim, arch.linear_value_heads, arch.linear_value_dim) == (4, 6, 4, 12)
    params = read_params(prepared)
    assert sorted(params["blocks_0"]) == ["attn", "attn_norm", "mlp", "mlp_norm"]
    if rotary:
        return
    chunked = forward(prepared.model.clone(linear_chunk=4), params, ids, mask)
    assert np.max(np.abs(chunked - expected)[mask]) <= 1e-4
    halved = forward(prepared.model.clone(linear_allow_neg_eigval=False), params, ids, mask)
    assert np.max(np.abs(halved - expected)[mask]) > 1e-2


def check_granite(
    prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray, overrides: dict[str, Any]
) -> None:
    """The layer kinds, RoPE only with position_embedding_type rope, the mixture and its shared MLP (or the shared
    MLP alone as the dense one) and the multipliers as transformers built them; not a vacuous match: without
    the shared MLP's output the logits differ."""
    arch, params = prepared.model.architecture, read_params(prepared)
    rotary, dense = "rope_parameters" in overrides, overrides.get("num_local_experts") == 0
    assert (arch.layer_types, arch.position.kind) == (("mamba", "full_attention"), "rope" if rotary else "none")
    assert (arch.mamba.n_heads, arch.mamba.head_dim, arch.mamba.n_groups, arch.mamba.state_size) == (4, 8, 2, 8)
    assert (arch.embedding_multiplier, arch.residual_multiplier, arch.logits_multiplier) == (12.0, 0.22, 0.25)
    assert arch.attention.score_scale() == 0.25
    if dense:
        assert arch.moe is None and arch.feed_forward.d_ff == 24
        shared = params["blocks_0"]["mlp"]
    else:
        moe = arch.moe
        assert moe is not None and (moe.n_experts, moe.top_k, moe.expert_hidden, moe.shared_width) == (4, 2, 16, 24)
        shared = params["blocks_0"]["mlp"]["shared"]
    assert sorted(params["blocks_0"]) == ["attn", "attn_norm", "mlp", "mlp_norm"]
    shared["down"]["kernel"] = np.zeros_like(shared["down"]["kernel"])
    assert np.max(np.abs(forward(prepared.model, params, ids, mask) - expected)[mask]) > 1e-2


def check_kimi_linear(prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray) -> None:
    """The layer kinds, no position embedding, the chunks of 4 (SETTINGS), the shapes and the mixture as transformers
    built them (the per-channel decay against transformers' rule: tests/models/test_qwen3_next_deltanet.py)."""
    arch = prepared.model.architecture
    assert (arch.layer_types, arch.position.kind, arch.linear_chunk, arch.linear_heads, arch.linear_head_dim) == (
        ("linear_attention", "full_attention"),
        "none",
        4,
        2,
        8,
    )
    moe = arch.moe
    assert moe is not None and (moe.router, moe.first_k_dense, moe.n_shared, moe.n_group) == ("sigmoid", 1, 1, 2)
    assert sorted(read_params(prepared)["blocks_0"]["attn"]) == [
        *("A_log", "b", "conv_key", "conv_query", "conv_value", "dt_bias", "f_down", "f_up", "g_down", "g_up"),
        *("key", "norm", "out", "query", "value"),
    ]


def check_qwen4_exp(
    folder: Path, model: Any, prepared: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray
) -> None:
    """The streams, n-gram tables and indexer as transformers built them; each matters in transformers' logits
    (the indexer's selection, the n-gram tables: the match is not vacuous); rows with end-of-text ids and the
    scanned layout give transformers' logits too."""
    import torch

    arch = prepared.model.architecture
    assert (arch.layer_types, arch.hyper.streams, arch.hyper.rank) == (("linear_attention", "full_attention"), 3, 8)
    assert (arch.ngram.layers, arch.ngram.table_rows(0), arch.qsa.blocks) == ((0,), 272, 2)
    indexer = model.model.layers[1].self_attn.indexer
    indexer.token_budget, indexer.block_topk = 64, 32  # every block kept: dense attention
    assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
    indexer.token_budget, indexer.block_topk = 4, 2
    table = model.model.layers[0].ple.ple_embedding.ngram_embedding.weight
    kept = table.detach().clone()
    with torch.no_grad():
        table.zero_()
        assert np.max(np.abs(hf_logits(model, ids, mask) - expected)[mask]) > 1e-2
        table.copy_(kept)
    documents = ids.copy()  # end-of-text ids inside a row: the n-grams restart after each (transformers' rule)
    documents[1, [3, 4, 8]] = 256
    ours = forward(prepared.model, read_params(prepared), documents, mask)
    assert np.max(np.abs(ours - hf_logits(model, documents, mask))[mask]) <= 1e-4
    scanned, again = imported_logits(folder, ids, mask, **{"model/scan_layers": True})
    assert again.model.stacked_layers[0].name == "linear_ngram0_blocks"
    assert np.max(np.abs(scanned - expected)[mask]) <= 1e-4


def check_gemma4(
    prepared: Any, model: Any, ids: np.ndarray, mask: np.ndarray, expected: np.ndarray, overrides: dict[str, Any]
) -> None:
    """Gemma 4's mapped fields, each of which changes the logits (not a vacuous match)."""
    arch, params = prepared.model.architecture, read_params(prepared)
    k_eq_v = overrides.get("attention_k_eq_v", False)
    assert (arch.head_dim, arch.global_head_dim, arch.full_attention().kv_heads) == (8, 16, 1 if k_eq_v else 2)
    assert (arch.per_layer_dim, arch.per_layer_vocab, arch.rope_fraction, arch.k_eq_v) == (8, 320, 0.5, k_eq_v)
    assert not arch.norm.zero_centred and arch.attention.score_scale() == 1.0 and arch.final_softcap == 5.0
    assert (arch.position.theta, arch.position.local_theta) == (1e4, 1e3)
    assert "value" not in params["blocks_1"]["attn"] if k_eq_v else "value" in params["blocks_1"]["attn"]
    for changed in (
        {"partial_rotary_factor": 1.0},  # every pair turning
        {"per_layer_input_dim": 0},  # no per-layer inputs (their parameters then unused)
        {"final_softcap": 0.0},
    ):
        other = forward(prepared.model.clone(**changed), params, ids, mask)
        assert np.max(np.abs(other - expected)[mask]) > 1e-2, changed
    scaled = {**params, "blocks_0": {**params["blocks_0"], "layer_scalar": {"scale": np.ones(1, np.float32)}}}
    assert np.max(np.abs(forward(prepared.model, scaled, ids, mask) - expected)[mask]) > 1e-2
    if prepared.checkpoint.family.model_type == "gemma4":  # the towers are in the checkpoint, skipped
        assert any(name.startswith("model.vision_tower.") for name in prepared.checkpoint.tensors)
        assert any(name.startswith("model.audio_tower.") for name in prepared.checkpoint.tensors)


def test_llama4_every_layer_a_mixture_scans_with_transformers_logits(tmp_path: Path) -> None:
    """Llama 4 Scout's layout (every layer a mixture) at a small scale: the layers scan one period of a
    chunked RoPE layer and a NoPE one per step and compute transformers' logits."""
    model = save_model(tmp_path, "llama4_text", interleave_moe_layer_step=1)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False
    prepared = prepare(tmp_path, {"model/scan_layers": True})
    assert prepared.model.scans_layers and prepared.model.scan_period == 2
    logits = forward(prepared.model, read_params(prepared), ids, mask)
    assert np.max(np.abs(logits - hf_logits(model, ids, mask))[mask]) <= 1e-4


#: Units whose positions differ in shape: Llama 4's dense and mixture layers interleaved (a unit of two),
#: and Qwen3-Next's Gated DeltaNet and full-attention layers, every layer a mixture (a unit of two, then
#: a linear-attention layer left over); with the largest difference from transformers' logits allowed
#: (that Qwen3-Next's unrolled import differs by 4.9e-4 too: its zero-centred norms amplify rounding).
SHAPED_UNITS = {
    "llama4": ("llama4_text", {}, 1e-4),
    "qwen3-next": (
        "qwen3_next",
        {"num_hidden_layers": 5, "layer_types": ["linear_attention", "full_attention"] * 2 + ["linear_attention"]}
        | {"mlp_only_layers": []},
        1e-3,
    ),
    # Gemma 4's sliding and full layers (wider heads, the full ones' keys as their values), per-layer inputs
    # read by each layer from the carry
    "gemma4": (
        "gemma4_text",
        {"num_hidden_layers": 4, "layer_types": ["sliding_attention", "full_attention"] * 2}
        | {"attention_k_eq_v": True, "num_global_key_value_heads": 1},
        1e-4,
    ),
    # LFM2's short-convolution and attention layers (a cache of a conv state and one of keys), one left over
    "lfm2": ("lfm2", {"num_hidden_layers": 5, "layer_types": ["conv", "full_attention"] * 2 + ["conv"]}, 1e-4),
    # Nemotron-H's Mamba-2, attention and MLP layers, each one branch alone (a unit of three, NEMOTRON_H's kinds)
    "nemotron_h": (
        "nemotron_h",
        {"num_hidden_layers": 6, "layers_block_type": NEMOTRON_H["layers_block_type"] * 2},
        1e-4,
    ),
}
#: The layers of a scan step where SHAPED_UNITS's are not two.
UNIT_PERIODS = {"nemotron_h": 3}


@pytest.mark.parametrize("case", list(SHAPED_UNITS))
def test_units_of_layers_that_differ_in_shape_scan_with_transformers_logits(case: str, tmp_path: Path) -> None:
    """Scanned one unit per step, each position a layer of its own: the unrolled import's logits and
    transformers'."""
    from theseus.checkpoint.layers import LayerRun, per_layer

    family, overrides, tolerance = SHAPED_UNITS[case]
    model = save_model(tmp_path, family, **overrides)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False
    logits, imported = {}, {}
    for scan in (False, True):
        prepared = prepare(tmp_path, {"model/scan_layers": scan})
        imported[scan] = params = read_params(prepared)
        logits[scan] = forward(prepared.model, params, ids, mask)
    n_layers = prepared.model.architecture.n_layers
    period = UNIT_PERIODS.get(case, 2)
    assert prepared.model.scans_layers and prepared.model.scan_period == period
    assert prepared.model.stacked_layers == (LayerRun("blocks", "blocks", 0, n_layers, period),)
    assert sorted(params["blocks"]) == ["periods", *(["rest_0"] if n_layers % period else [])]
    view = per_layer(jax.tree.map(np.asarray, params), prepared.model.stacked_layers)  # as the export reads it
    assert jax.tree.structure(view) == jax.tree.structure(imported[False])
    for a, b in zip(jax.tree.leaves(view), jax.tree.leaves(imported[False]), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))
    assert np.max(np.abs(logits[True] - logits[False])[mask]) <= 1e-4
    assert np.max(np.abs(logits[True] - hf_logits(model, ids, mask))[mask]) <= tolerance


def test_long_sequence_blocked_attention(tmp_path: Path) -> None:
    model = save_model(tmp_path, "llama", head_dim=16, rope_parameters=LLAMA3)
    ids = np.random.default_rng(3).integers(0, VOCAB, (1, 264))
    got, _ = imported_logits(tmp_path, ids)
    assert np.max(np.abs(got - hf_logits(model, ids))) <= 1e-4


def test_long_sequence_blocked_attention_within_a_window(tmp_path: Path) -> None:
    """300 tokens in query blocks of 128 against a window of 100: each block reads only the keys it can
    see, and a left-padded row keeps transformers' index-based window."""
    model = save_model(tmp_path, "mistral", sliding_window=100)
    ids = np.random.default_rng(4).integers(0, VOCAB, (2, 300))
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :40] = False
    got, prepared = imported_logits(tmp_path, ids, mask)
    assert prepared.model.architecture.block_size == 512  # max_position_embeddings, not the window
    assert np.max(np.abs(got - hf_logits(model, ids, mask))[mask]) <= 1e-4
    assert np.max(np.abs(got - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2


@pytest.mark.parametrize("family", [f for f in GEMMA if f not in GEMMA4_FAMILIES])  # Gemma 4: SHAPED_UNITS
def test_gemma_layer_types_in_both_layouts_on_the_blocked_path(family: str, tmp_path: Path) -> None:
    """300 tokens (query blocks of 128) against a window of 100 on the sliding layers only: the
    unrolled layers (static windows, keys outside skipped) and the scanned ones (window and RoPE base
    picked per layer at run time) both give transformers' logits."""
    model = save_model(tmp_path, family, sliding_window=100, tokenizer=False)
    ids = np.random.default_rng(5).integers(0, VOCAB, (2, 300))
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :30] = False
    expected = hf_logits(model, ids, mask)
    for scan in (False, True):
        prepared = prepare(tmp_path, {"model/scan_layers": scan})
        assert prepared.model.stacked_layers == (("blocks",) if scan else ())
        assert prepared.model.architecture.layer_types == ("sliding_attention", "full_attention")
        logits = forward(prepared.model, read_params(prepared), ids, mask)
        assert np.max(np.abs(logits - expected)[mask]) <= 1e-4, scan
    assert np.max(np.abs(logits - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2


#: Gemma 3 layers in periods of 3 (two sliding, one full) with two layers left over: 2 scan steps, then
#: 2 sliding layers unrolled.
PERIODIC_TYPES = ["sliding_attention", "sliding_attention", "full_attention"] * 2 + ["sliding_attention"] * 2


def test_scanned_gemma3_generates_past_the_window_with_window_sized_caches(tmp_path: Path) -> None:
    """A scanned Gemma 3 whose layer_types repeat runs one period per scan step: its sliding layers keep
    ring buffers of the window (4) and the full ones the whole length, and greedy generation of 16 tokens
    after a prompt of 6 (past the window) gives transformers' tokens. Unrolled, the same layers keep the
    same caches per layer. (Unrolled Gemma 3 generation past its window against transformers:
    test_cli_roundtrip.py.)"""
    import torch

    from theseus.model.generation.decode import generate_tokens
    from theseus.model.generation.sampling import SamplingParams
    from theseus.model.models import init_cache

    model = save_model(
        tmp_path, "gemma3_text", tokenizer=False, num_hidden_layers=8, layer_types=PERIODIC_TYPES, sliding_window=4
    )
    prompt = np.random.default_rng(7).integers(0, VOCAB, (1, 6))
    with torch.no_grad():
        generated = model.generate(
            torch.tensor(prompt), do_sample=False, max_new_tokens=16, min_new_tokens=16, pad_token_id=256
        )
    expected = generated[0, prompt.shape[1] :].tolist()
    total = prompt.shape[1] + 16 - 1
    prepared = prepare(tmp_path, {"model/scan_layers": True})
    params = read_params(prepared)
    tokens = generate_tokens(prepared.model, params, prompt.tolist(), 16, sampling=SamplingParams(temperature=0.0))
    assert tokens[0].tokens == expected
    # parameters stacked per layer as ever; the cache held per position of the period
    assert prepared.model.scan_period == 3 and prepared.model.stacked_layers == ("blocks",)
    assert {leaf.shape[0] for leaf in jax.tree.leaves(params["blocks"])} == {8}
    cache = init_cache(prepared.model, 1, total)["blocks"]
    keys = [cache["periods"][f"layers_{i}"]["attn"]["key"].shape for i in range(3)]
    assert keys == [(2, 1, 2, 4, 16), (2, 1, 2, 4, 16), (2, 1, 2, total, 16)]  # [periods, B, heads, slots, ...]
    assert [cache[f"rest_{j}"]["attn"]["key"].shape for j in range(2)] == [(1, 2, 4, 16)] * 2
    cache = init_cache(prepare(tmp_path, {"model/scan_layers": False}).model, 1, total)
    assert [cache[f"blocks_{i}"]["attn"]["key"].shape[2] for i in range(8)] == [4, 4, total] * 2 + [4, 4]
    # not a vacuous match: without the window (the family's 512: longer than the text) greedy decoding takes
    # another token somewhere. Run whole over the prompt and the tokens above, the windowless model picks
    # another one at some position (it would pick each of them if its greedy decoding gave them all).
    windowless = prepared.model.clone(sliding_window=None)
    text = np.concatenate([prompt, [expected]], axis=1)
    picks = forward(windowless, params, text).argmax(-1)[0, prompt.shape[1] - 1 : -1]
    assert picks.tolist() != expected


@pytest.mark.parametrize("family", ["llama", "phi3"])  # phi3: each fused tensor's parts placed one by one
def test_parameters_land_on_the_given_shardings(family: str, tmp_path: Path) -> None:
    save_model(tmp_path, family, tokenizer=False)
    prepared = prepare(tmp_path)
    device = jax.devices()[0]
    from theseus.model.huggingface.importer import abstract_params

    shardings = {path: jax.sharding.SingleDeviceSharding(device) for path in abstract_params(prepared.model)}
    params = read_params(prepared, shardings)
    leaves = jax.tree.leaves(params)
    assert len(leaves) == len(shardings)
    assert all(leaf.sharding == jax.sharding.SingleDeviceSharding(device) for leaf in leaves)
    assert prepared.tokenizer is None


#: LongRoPE as the 128k Phi-3 releases have it, at a small scale: 4 frequencies (head_dim 8), trained on 8
#: positions, stretched to max_position_embeddings 512 (attention factor sqrt(1 + log 64 / log 8) = sqrt 3).
LONGROPE = {
    "rope_type": "longrope",
    "rope_theta": 10000.0,
    "short_factor": [1.0, 1.3, 1.9, 2.6],
    "long_factor": [1.1, 2.5, 7.0, 19.0],
    "original_max_position_embeddings": 8,
}


def test_phi3_longrope_short_and_long_factors(tmp_path: Path) -> None:
    """Prompts that fit the original 8 positions use the short factors, longer ones the long factors for
    every position, as transformers chooses them per call; both within 1e-4."""
    model = save_model(tmp_path, "phi3", rope_parameters=LONGROPE, original_max_position_embeddings=8)
    ids = np.random.default_rng(5).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :6] = False  # 6 real tokens in this row; the longest row (12) decides, as in transformers
    long, prepared = imported_logits(tmp_path, ids, mask)
    assert np.max(np.abs(long - hf_logits(model, ids, mask))[mask]) <= 1e-4
    short, _ = imported_logits(tmp_path, ids[:, -6:])
    expected_short = hf_logits(model, ids[:, -6:])
    assert np.max(np.abs(short - expected_short)) <= 1e-4
    assert np.max(np.abs(long[0, -6:] - expected_short[0])) > 1e-2  # the same 6 tokens, the other factors
    scaling = prepared.model.architecture.position.scaling
    assert (scaling.kind, scaling.original_max_positions, scaling.long_factor) == ("longrope", 8, (1.1, 2.5, 7.0, 19.0))
    assert abs(scaling.attention_factor - 3**0.5) <= 1e-12
    # generation may not cross the switch (transformers re-encodes the sequence there): one line
    check_rope_switch(prepared.model, 6, 3)  # lengths 6..8: short factors throughout
    check_rope_switch(prepared.model, 9, 16)  # long throughout
    with pytest.raises(ConfigError, match="crosses architecture/rope_original_max_positions=8, where longrope"):
        check_rope_switch(prepared.model, 6, 4)


def test_a_window_longer_than_the_context_imports_as_full_attention(tmp_path: Path) -> None:
    """Phi-3-mini-128k's window (262144) is longer than its context: the import reads no window, and
    the logits are transformers'."""
    model = save_model(tmp_path, "phi3", sliding_window=1024, tokenizer=False)
    ids = np.random.default_rng(6).integers(0, VOCAB, (1, 12))
    got, prepared = imported_logits(tmp_path, ids)
    assert (prepared.model.architecture.attention.sliding_window, prepared.model.architecture.block_size) == (None, 512)
    assert np.max(np.abs(got - hf_logits(model, ids))) <= 1e-4
