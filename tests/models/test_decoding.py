"""KV-cache decoding: greedy tokens and logits equal those of re-running the whole prefix."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import build, random_params
from theseus.checkpoint.layers import per_layer
from theseus.errors import ConfigError
from theseus.model.generation.decode import generate_tokens
from theseus.model.generation.sampling import SamplingParams
from theseus.model.models import TransformerLM, decode_step, init_cache

NEW = 6


def prompts() -> tuple[np.ndarray, np.ndarray]:
    """Two prompts, the second two tokens shorter and padded on the left."""
    x = np.array([[3, 14, 15, 9, 26], [0, 0, 53, 58, 9]], np.int32)
    mask = np.array([[True] * 5, [False, False, True, True, True]])
    return x, mask


def test_greedy_with_cache_equals_rerunning_the_prefix(family: type[TransformerLM]) -> None:
    model = build(family)
    params = random_params(model, seed=1)
    prompt, prompt_mask = prompts()
    batch, plen = prompt.shape
    total = plen + NEW

    # Without a cache: every step runs the model over the whole sequence so far. The sequence is
    # kept at a fixed length (not yet generated slots are padding after the prefix) so it compiles once.
    @jax.jit
    def full(p: dict, tokens: jax.Array, mask: jax.Array) -> jax.Array:
        return model.apply({"params": p}, tokens, padding_mask=mask, deterministic=True)[0]

    tokens = np.zeros((batch, total), np.int32)
    mask = np.zeros((batch, total), bool)
    tokens[:, :plen], mask[:, :plen] = prompt, prompt_mask
    expected_tokens, expected_logits = [], []
    for step in range(NEW):
        logits = np.asarray(full(params, tokens, mask))[:, plen + step - 1]
        nxt = logits.argmax(-1)
        expected_tokens.append(nxt)
        expected_logits.append(logits)
        tokens[:, plen + step], mask[:, plen + step] = nxt, True

    # With the cache: prefill the prompt, then one token per step (the last token is not fed back).
    cache = init_cache(model, batch, total - 1)
    logits, cache = decode_step(model, params, cache, prompt, prompt_mask)
    got_tokens, got_logits = [], []
    for step in range(NEW):
        last = np.asarray(logits)[:, -1]
        got_logits.append(last)
        got_tokens.append(last.argmax(-1))
        if step + 1 < NEW:
            logits, cache = decode_step(model, params, cache, got_tokens[-1][:, None])

    np.testing.assert_array_equal(np.stack(got_tokens, 1), np.stack(expected_tokens, 1))
    np.testing.assert_allclose(np.stack(got_logits), np.stack(expected_logits), atol=2e-5)
    assert len({int(t) for t in np.stack(expected_tokens).ravel()}) > 2  # a non-trivial continuation
    # every slot was written; the left-padded row counted only its real tokens
    assert int(per_layer(cache, model.stacked_layers)["blocks_0"]["attn"]["index"]) == total - 1
    np.testing.assert_array_equal(cache["decode_positions"]["length"], [total - 1, total - 3])

    # the decoder (one jitted loop over the same cache) picks the same tokens
    rows = [row[keep].tolist() for row, keep in zip(prompt, prompt_mask, strict=True)]
    generated = generate_tokens(model, params, rows, NEW, sampling=SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(np.asarray([c.tokens for c in generated]), np.stack(expected_tokens, 1))


def test_cache_holds_activation_dtype_and_grouped_heads(family: type[TransformerLM]) -> None:
    model = build(family, model__activation_dtype="bfloat16")
    cache = init_cache(model, 2, 16)
    arch = model.architecture
    attn = per_layer(cache, model.stacked_layers)["blocks_1"]["attn"]
    assert attn["key"].shape == (2, arch.attention.kv_heads, 16, arch.head_dim)  # heads-major
    assert attn["key"].dtype == jnp.bfloat16 and attn["mask"].dtype == jnp.bool_
    assert not bool(attn["mask"].any()) and int(attn["index"]) == 0


def test_cache_longer_than_block_size_is_refused(family: type[TransformerLM]) -> None:
    model = build(family)
    with pytest.raises(ConfigError, match="block_size=32"):
        init_cache(model, 1, 33)


def test_decode_without_cache_is_a_clear_error(family: type[TransformerLM]) -> None:
    model = build(family)
    params = random_params(model)
    with pytest.raises(ConfigError, match="init_cache"):
        model.apply({"params": params}, jnp.zeros((1, 2), jnp.int32), decode=True, mutable=["cache"])
