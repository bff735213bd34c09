"""Imported checkpoints compute what transformers computes (float32 logits within 1e-4)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.huggingface.conftest import VOCAB, hf_logits, save_model
from theseus.model.huggingface.importer import prepare, read_params

LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

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
    # norms after each branch, q/k RMSNorm over the whole projection (GQA: 4 query, 2 key heads)
    "olmo2": ("olmo2", {}),
    "olmo2-tied-bias": ("olmo2", {"tie_word_embeddings": True, "attention_bias": True}),
}


def full_attention_logits(prepared: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The imported model's logits with its window switched off (the same weights)."""
    params = read_params(prepared)
    logits, _ = prepared.model.clone(sliding_window=None).apply(
        {"params": params}, jnp.asarray(ids), padding_mask=jnp.asarray(mask), deterministic=True
    )
    return np.asarray(logits)


def ours(folder: Path, ids: np.ndarray, mask: np.ndarray | None = None) -> tuple[np.ndarray, Any]:
    prepared = prepare(folder)
    params = read_params(prepared)
    logits, _ = prepared.model.apply(
        {"params": params},
        jnp.asarray(ids),
        padding_mask=None if mask is None else jnp.asarray(mask),
        deterministic=True,
    )
    return np.asarray(logits), prepared


@pytest.mark.parametrize("case", list(CASES))
def test_logits_match_transformers(case: str, tmp_path: Path) -> None:
    family, overrides = CASES[case]
    model = save_model(tmp_path, family, **overrides)
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False  # a left-padded row: positions count real tokens only
    got, prepared = ours(tmp_path, ids, mask)
    expected = hf_logits(model, ids, mask)
    assert np.max(np.abs(got - expected)[mask]) <= 1e-4
    arch = prepared.model.architecture
    assert arch.sliding_window == overrides.get("sliding_window")
    assert arch.qk_norm == (family in ("qwen3", "olmo2"))
    assert (arch.qk_norm_span, arch.norm_placement) == (
        ("projection", "post") if family == "olmo2" else ("head", "pre")
    )
    if arch.sliding_window is not None:  # not a vacuous match: without the window the logits differ
        assert np.max(np.abs(got - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2
    assert arch.tied_embeddings == bool(overrides.get("tie_word_embeddings", family in ("gpt2", "qwen3")))
    if family == "qwen2":
        assert (arch.qkv_bias, arch.out_bias, arch.ffn_bias) == (True, False, False)
    if "head_dim" in overrides:
        assert arch.head_dim == overrides["head_dim"] and arch.n_embd == 32


def test_long_sequence_blocked_attention(tmp_path: Path) -> None:
    model = save_model(tmp_path, "llama", head_dim=16, rope_parameters=LLAMA3)
    ids = np.random.default_rng(3).integers(0, VOCAB, (1, 264))
    got, _ = ours(tmp_path, ids)
    assert np.max(np.abs(got - hf_logits(model, ids))) <= 1e-4


def test_long_sequence_blocked_attention_within_a_window(tmp_path: Path) -> None:
    """300 tokens in query blocks of 128 against a window of 100: each block reads only the keys it can
    see, and a left-padded row keeps transformers' index-based window."""
    model = save_model(tmp_path, "mistral", sliding_window=100)
    ids = np.random.default_rng(4).integers(0, VOCAB, (2, 300))
    mask = np.ones_like(ids, dtype=bool)
    mask[1, :40] = False
    got, prepared = ours(tmp_path, ids, mask)
    assert prepared.model.architecture.block_size == 512  # max_position_embeddings, not the window
    assert np.max(np.abs(got - hf_logits(model, ids, mask))[mask]) <= 1e-4
    assert np.max(np.abs(got - full_attention_logits(prepared, ids, mask))[mask]) > 1e-2


def test_parameters_land_on_the_given_shardings(tmp_path: Path) -> None:
    save_model(tmp_path, "llama", tokenizer=False)
    prepared = prepare(tmp_path)
    device = jax.devices()[0]
    from theseus.model.huggingface.importer import abstract_params

    shardings = {path: jax.sharding.SingleDeviceSharding(device) for path in abstract_params(prepared.model)}
    params = read_params(prepared, shardings)
    leaves = jax.tree.leaves(params)
    assert len(leaves) == len(shardings)
    assert all(leaf.sharding == jax.sharding.SingleDeviceSharding(device) for leaf in leaves)
    assert prepared.tokenizer is None
