"""Imported checkpoints compute what transformers computes (float32 logits within 1e-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.huggingface.conftest import GEMMA, GEMMA3_LINEAR, VOCAB, hf_logits, imported_logits, save_model
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
    # fused qkv_proj (GQA: 4 query, 2 key/value heads) and gate_up_proj split on import
    "phi3-fused": ("phi3", {}),
    "phi3-window": ("phi3", {"sliding_window": 5}),
}


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
    got, prepared = imported_logits(tmp_path, ids, mask)
    expected = hf_logits(model, ids, mask)
    assert np.max(np.abs(got - expected)[mask]) <= 1e-4
    arch = prepared.model.architecture
    assert arch.attention.sliding_window == overrides.get("sliding_window", 5 if family in WINDOWED else None)
    assert arch.attention.qk_norm == (family in ("qwen3", "olmo2", "olmo3", "gemma3_text", "qwen3_next"))
    assert (arch.attention.qk_norm_span, arch.norm.placement) == (
        ("projection", "post") if family in ("olmo2", "olmo3") else ("head", "sandwich" if family in GEMMA else "pre")
    )
    if arch.attention.sliding_window is not None:  # not a vacuous match: without the window the logits differ
        assert np.max(np.abs(got - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2
    assert arch.tied_embeddings == bool(overrides.get("tie_word_embeddings", family in ("gpt2", "qwen3", *GEMMA)))
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
    if "head_dim" in overrides:
        assert arch.head_dim == overrides["head_dim"] and arch.n_embd == 32
    if overrides.get("rope_parameters", {}).get("rope_type") == "yarn":
        assert (arch.position.scaling.kind, arch.position.scaling.original_max_positions) == ("yarn", 8)
        assert abs(arch.position.scaling.magnitude - 1.1386294361119891) <= 1e-12


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
}


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
    assert prepared.model.scans_layers and prepared.model.scan_period == 2
    assert prepared.model.stacked_layers == (LayerRun("blocks", "blocks", 0, n_layers, 2),)
    assert sorted(params["blocks"]) == ["periods", *(["rest_0"] if n_layers % 2 else [])]
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


@pytest.mark.parametrize("family", list(GEMMA))
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
    after a prompt of 6 (past the window) gives the unrolled model's tokens and transformers'."""
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
    greedy = SamplingParams(temperature=0.0)
    total = prompt.shape[1] + 16 - 1
    for scan in (True, False):
        prepared = prepare(tmp_path, {"model/scan_layers": scan})
        params = read_params(prepared)
        tokens = generate_tokens(prepared.model, params, prompt.tolist(), 16, sampling=greedy)[0].tokens
        assert tokens == expected, scan
        if scan:  # parameters stacked per layer as ever; the cache held per position of the period
            assert prepared.model.scan_period == 3 and prepared.model.stacked_layers == ("blocks",)
            assert {leaf.shape[0] for leaf in jax.tree.leaves(params["blocks"])} == {8}
            cache = init_cache(prepared.model, 1, total)["blocks"]
            keys = [cache["periods"][f"layers_{i}"]["attn"]["key"].shape for i in range(3)]
            assert keys == [(2, 1, 2, 4, 16), (2, 1, 2, 4, 16), (2, 1, 2, total, 16)]  # [periods, B, heads, slots, ...]
            assert [cache[f"rest_{j}"]["attn"]["key"].shape for j in range(2)] == [(1, 2, 4, 16)] * 2
        else:
            cache = init_cache(prepared.model, 1, total)
            assert [cache[f"blocks_{i}"]["attn"]["key"].shape[2] for i in range(8)] == [4, 4, total] * 2 + [4, 4]
            windowless = prepared.model.clone(sliding_window=None)  # the family's 512: longer than the text
            assert generate_tokens(windowless, params, prompt.tolist(), 16, sampling=greedy)[0].tokens != expected


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
