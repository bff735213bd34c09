"""Decoding with the KV cache through ``generate_tokens``, and the token samplers."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.generation.conftest import build, spread_params, tiny_values
from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.model.generation import (
    SamplingParams,
    decode,
    filter_top_k,
    filter_top_p,
    generate_tokens,
    left_pad,
    sample_logits,
)
from theseus.model.generation.decode import check_fits
from theseus.model.models import Llama, OLMo3, TransformerLM
from theseus.model.stack.decoding import loops_layers

PROMPTS = [[256, 100, 101, 102, 32, 40], [256, 105, 109], [7]]
NEW = 10
#: Shared by the sampled tests, so they share one compiled generation loop per model family.
SAMPLED = SamplingParams(temperature=1.5, top_k=50, top_p=0.98)


def greedy_without_cache(model: TransformerLM, params: Any, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Re-run every row's whole prefix each step and take the most likely next token.

    Each row holds its prefix at the start of a fixed-length sequence (so this compiles once); causal
    attention keeps the zeros after the prefix from affecting the logits of its last token.
    """
    total = max(len(p) for p in prompts) + steps

    @jax.jit
    def logits_of(tokens: jax.Array) -> jax.Array:
        return model.apply({"params": params}, tokens, deterministic=True)[0]

    tokens = np.zeros((len(prompts), total), np.int32)
    lengths = [len(p) for p in prompts]
    for row, prompt in enumerate(prompts):
        tokens[row, : len(prompt)] = prompt
    for _ in range(steps):
        logits = np.asarray(logits_of(jnp.asarray(tokens)))
        for row, length in enumerate(lengths):
            tokens[row, length] = int(logits[row, length - 1].argmax())
        lengths = [n + 1 for n in lengths]
    return [tokens[row, len(p) : len(p) + steps].tolist() for row, p in enumerate(prompts)]


def test_greedy_with_cache_equals_rerunning_the_prefix(family: type[TransformerLM]) -> None:
    model = build(family)
    params = spread_params(model, seed=3)
    got = generate_tokens(model, params, PROMPTS, NEW, sampling=SamplingParams(temperature=0.0))
    expected = greedy_without_cache(model, params, PROMPTS, NEW)
    assert [c.tokens for c in got] == expected
    assert not any(c.stopped for c in got)
    assert len({t for c in got for t in c.tokens}) > 3  # a non-trivial continuation


def test_stops_at_end_of_text_without_changing_the_tokens_before_it(family: type[TransformerLM]) -> None:
    model = build(family)
    params = spread_params(model, seed=5)
    sampling = SAMPLED
    free = generate_tokens(model, params, PROMPTS, NEW, sampling=sampling, seed=11)
    # make the fourth token of the first row the end-of-text token: that row stops there
    eot = free[0].tokens[3]
    stopped = generate_tokens(model, params, PROMPTS, NEW, sampling=sampling, seed=11, eot_id=eot)
    first = free[0].tokens.index(eot)
    assert stopped[0].tokens == free[0].tokens[:first] and stopped[0].stopped
    for before, after in zip(free[1:], stopped[1:], strict=True):
        if eot in before.tokens:
            assert after.tokens == before.tokens[: before.tokens.index(eot)] and after.stopped
        else:  # rows that never produce it run to max_new_tokens, unaffected by the others stopping
            assert after.tokens == before.tokens and not after.stopped
            assert len(after.tokens) == NEW


def test_same_seed_same_tokens_other_seed_other_tokens(family: type[TransformerLM]) -> None:
    model = build(family)
    params = spread_params(model, seed=1)
    sampling = SAMPLED
    a = generate_tokens(model, params, PROMPTS, NEW, sampling=sampling, seed=0)
    programs, shapes = decode._sample._cache_size(), decode.cache_shapes.cache_info().misses
    b = generate_tokens(model, params, PROMPTS, NEW, sampling=sampling, seed=0)
    c = generate_tokens(model, params, PROMPTS, NEW, sampling=sampling, seed=1)
    # the same sizes again (a rollout per step): no new program, and the empty cache's shapes not traced again
    assert (decode._sample._cache_size(), decode.cache_shapes.cache_info().misses) == (programs, shapes)
    assert a == b
    assert [x.tokens for x in a] != [x.tokens for x in c]
    assert all(len(x.tokens) == NEW for x in a)


def test_context_overflow_is_a_config_error(family: type[TransformerLM]) -> None:
    model = build(family)
    params = spread_params(model)
    with pytest.raises(ConfigError, match="block_size=32"):
        generate_tokens(model, params, [[1] * 20], 14)
    check_fits(model, 20, 13)  # the prompt's 20 tokens and 12 fed back fill the 32 positions exactly


def test_left_pad() -> None:
    ids, mask = left_pad([[5, 6, 7], [9]])
    np.testing.assert_array_equal(ids, [[5, 6, 7], [0, 0, 9]])
    np.testing.assert_array_equal(mask, [[True] * 3, [False, False, True]])
    with pytest.raises(ConfigError):
        left_pad([[1], []])


# -- samplers --------------------------------------------------------------------------------------
LOGITS = jnp.log(jnp.asarray([[0.5, 0.25, 0.15, 0.1]], jnp.float32))


def test_top_k_keeps_the_k_largest() -> None:
    kept = np.isfinite(np.asarray(filter_top_k(LOGITS, 2)))
    np.testing.assert_array_equal(kept, [[True, True, False, False]])
    np.testing.assert_array_equal(np.asarray(filter_top_k(LOGITS, 0)), np.asarray(LOGITS))


@pytest.mark.parametrize(
    ("p", "kept"),
    [(0.4, [True, False, False, False]), (0.7, [True, True, False, False]), (0.8, [True, True, True, False])],
)
def test_top_p_keeps_the_smallest_nucleus(p: float, kept: list[bool]) -> None:
    np.testing.assert_array_equal(np.isfinite(np.asarray(filter_top_p(LOGITS, p))), [kept])


def test_sampling_frequencies_follow_temperature_and_filters() -> None:
    logits = jnp.tile(LOGITS, (4000, 1))
    key = jax.random.key(0)
    counts = np.bincount(np.asarray(sample_logits(logits, key, SamplingParams(1.0))), minlength=4) / 4000
    np.testing.assert_allclose(counts, [0.5, 0.25, 0.15, 0.1], atol=0.03)
    top2 = np.bincount(np.asarray(sample_logits(logits, key, SamplingParams(1.0, top_k=2))), minlength=4) / 4000
    np.testing.assert_allclose(top2, [2 / 3, 1 / 3, 0, 0], atol=0.03)
    cold = np.bincount(np.asarray(sample_logits(logits, key, SamplingParams(0.25))), minlength=4) / 4000
    assert cold[0] > 0.9  # p^4 renormalised: 0.5^4 / sum = 0.92
    greedy = np.asarray(sample_logits(logits, key, SamplingParams(0.0, top_k=3, top_p=0.2)))
    assert (greedy == 0).all()


@pytest.mark.parametrize(
    "bad", [{"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}, {"temperature": float("nan")}]
)
def test_invalid_sampling_settings(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        SamplingParams(**bad)  # type: ignore[arg-type]


def test_a_generation_in_stretches_equals_one_that_reads_the_whole_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stretches of a long generation read only the filled part of the cache; the tokens, greedy and
    sampled, are those of reading all of it at every step. On Llama: the views are cut in the attention
    layer's cache, which GPT shares; Llama's keys are cached rotated, and fewer key/value heads than query
    heads. (GPT's learned positions lie outside the cache: test_greedy_with_cache_equals_rerunning_the_prefix.)"""
    model = build(Llama)
    params = spread_params(model, seed=3)
    whole = [generate_tokens(model, params, PROMPTS, NEW, sampling=s, seed=4) for s in (SamplingParams(0.0), SAMPLED)]
    assert decode.decode_stretches("cpu") == 1  # on the CPU a stretch's view of the cache is a copy per step
    monkeypatch.setattr(decode, "SHORTEST_STRETCH", 3)
    assert decode.view_limits(6, NEW) == [9, 12, 15]  # 6 prompt slots + 9 fed back
    stretched = [
        generate_tokens(model, params, PROMPTS, NEW, sampling=s, seed=4, stretches=decode.decode_stretches("tpu"))
        for s in (SamplingParams(0.0), SAMPLED)
    ]
    assert stretched == whole  # whole[0]: test_greedy_with_cache_equals_rerunning_the_prefix's tokens


def test_a_scanned_model_decodes_unrolled_with_the_same_tokens() -> None:
    """Decoding unrolls a scanned model's layers (per-layer caches updated in place); its tokens are those
    of the scanned model re-run on each prefix."""
    with configuration({**tiny_values(Llama), "model/scan_layers": True}):
        model = configure(Llama)
    assert model.stacked_layers
    params = spread_params(model, seed=3)
    got = generate_tokens(model, params, PROMPTS, NEW, sampling=SamplingParams(temperature=0.0))
    assert [c.tokens for c in got] == greedy_without_cache(model, params, PROMPTS, NEW)


def test_a_scanned_model_decodes_with_its_layers_in_a_loop_with_the_same_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The decoder can run a scanned model's layers in one loop over the stacked parameters and cache (one
    layer in the program instead of every layer per stretch): greedy in stretches, the tokens of rerunning
    each prefix; sampled reading the whole cache, the tokens of the unrolled layers. (The layer loop computes
    the logits; greedy or sampled only picks from them, so each setting is met once: the stretches change the
    cache views the loop reads, the sampled tokens any difference in the logits.) A TPU loops by default, the
    CPU does not (decode.LOOPED_PLATFORMS). On Llama: the loop picks each layer's entry of the stacked cache in
    the attention layer GPT shares; Llama's keys enter it rotated, with fewer key/value heads than query heads."""
    assert decode.layer_loop("tpu") and not decode.layer_loop("cpu")
    with configuration({**tiny_values(Llama), "architecture/n_layers": 3, "model/scan_layers": True}):
        model = configure(Llama)
    assert loops_layers(model)
    params = spread_params(model, seed=5)
    monkeypatch.setattr(decode, "SHORTEST_STRETCH", 3)
    greedy = generate_tokens(model, params, PROMPTS, NEW, sampling=SamplingParams(0.0), stretches=3, loop_layers=True)
    assert [c.tokens for c in greedy] == greedy_without_cache(model, params, PROMPTS, NEW)
    sampled = [
        generate_tokens(model, params, PROMPTS, NEW, sampling=SAMPLED, seed=2, stretches=1, loop_layers=loop)
        for loop in (False, True)
    ]
    assert sampled[0] == sampled[1]


def test_layers_loop_only_where_each_layer_keeps_a_plain_cache() -> None:
    """An unscanned model, one with ``layer_types`` and a cache longer than the attention window (a ring
    buffer per layer) keep their layers unrolled."""
    values = {**tiny_values(Llama), "model/scan_layers": True}
    with configuration({**values, "model/scan_layers": False}):
        assert not loops_layers(configure(Llama))
    with configuration({**values, "architecture/layer_types": ["sliding_attention", "full_attention"]}):
        interleaved = configure(OLMo3)
    assert interleaved.architecture.layer_types and not loops_layers(interleaved)
    with configuration({**values, "architecture/sliding_window": 8}):
        windowed = configure(Llama)
    assert loops_layers(windowed, 8) and not loops_layers(windowed, 9)
