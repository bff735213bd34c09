"""Vocabulary padding: the padded ids never reach the loss, the logits or a sample."""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np
import pytest

from tests.models.conftest import build, jitted, random_params
from tests.tolerances import float32_tolerance, model_ops
from theseus.checkpoint import CheckpointStore
from theseus.config import configuration, configure
from theseus.errors import CheckpointError
from theseus.model.generation.decode import generate_tokens
from theseus.model.generation.sampling import SamplingParams
from theseus.model.models import GPT, TransformerLM

VOCAB, MULTIPLE, PADDED = 61, 16, 64


def padded_and_plain(family: type[TransformerLM]) -> tuple[TransformerLM, dict, TransformerLM, dict]:
    """A model padded 61 -> 64 whose padded rows/columns are large (they would win any argmax if they
    were not masked), and the unpadded model holding the same real weights."""
    padded = build(family, architecture__vocab_size=VOCAB, architecture__vocab_multiple=MULTIPLE)
    plain = build(family, architecture__vocab_size=VOCAB, architecture__vocab_multiple=1)
    params = random_params(padded, seed=3)
    table = np.asarray(params["token_embedding"]["embedding"]).copy()
    assert table.shape[0] == PADDED and padded.architecture.padded_vocab_size == PADDED
    table[VOCAB:] *= 40.0
    params = {**params, "token_embedding": {"embedding": table}}
    plain_params = {**params, "token_embedding": {"embedding": table[:VOCAB]}}
    if "lm_head" in params:
        head = np.asarray(params["lm_head"]).copy()
        head[:, VOCAB:] = 40.0 * np.abs(head[:, VOCAB:])
        params["lm_head"] = head
        plain_params["lm_head"] = head[:, :VOCAB]
    return padded, params, plain, plain_params


def tokens(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (2, 17)).astype(np.int32)
    return ids[:, :-1], ids[:, 1:]


def test_loss_and_logits_equal_the_unpadded_model(family: type[TransformerLM]) -> None:
    padded, params, plain, plain_params = padded_and_plain(family)
    x, y = tokens()
    logits, loss = jitted(padded.apply, {"params": params}, x, y, deterministic=True)
    plain_logits, plain_loss = jitted(plain.apply, {"params": plain_params}, x, y, deterministic=True)
    assert logits.shape == (2, 16, VOCAB)
    np.testing.assert_allclose(np.asarray(logits), np.asarray(plain_logits), atol=1e-5)
    tolerance = float32_tolerance(model_ops(plain), scale=float(np.asarray(plain_loss)))
    assert abs(float(np.asarray(loss)) - float(np.asarray(plain_loss))) <= tolerance

    # The premise: read as real ids, the padded rows would dominate the distribution.
    as_real = build(family, architecture__vocab_size=PADDED, architecture__vocab_multiple=1)
    unmasked, unmasked_loss = jitted(as_real.apply, {"params": params}, x, y, deterministic=True)
    assert np.mean(np.asarray(unmasked).argmax(-1) >= VOCAB) >= 0.25
    assert float(np.asarray(unmasked_loss)) > float(np.asarray(loss)) + 1.0


def test_padded_ids_never_win_a_sample(family: type[TransformerLM]) -> None:
    padded, params, _, _ = padded_and_plain(family)
    x, _ = tokens(1)
    prompts = [list(map(int, x[0, :4]))]
    done = generate_tokens(padded, params, prompts, 12, sampling=SamplingParams(temperature=2.0), seed=7)
    drawn = np.asarray(done[0].tokens)
    assert len(drawn) == 12 and int(drawn.max()) < VOCAB and len(np.unique(drawn)) > 4


def test_flops_and_parameters_count_the_padded_head() -> None:
    padded = build(GPT, architecture__vocab_size=VOCAB, architecture__vocab_multiple=MULTIPLE)
    plain = build(GPT, architecture__vocab_size=VOCAB, architecture__vocab_multiple=1)
    width = padded.architecture.n_embd
    assert padded.flops(8) - plain.flops(8) == 6 * 8 * width * (PADDED - VOCAB)
    assert padded.parameter_count() - plain.parameter_count() == width * (PADDED - VOCAB)
    with configuration({"architecture/vocab_size": 257}):  # the default multiple: 128
        assert configure(GPT).architecture.padded_vocab_size == 384


def test_resuming_an_unpadded_checkpoint_names_the_key(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path, keep=1, async_save=False)
    store.save(1, {"params": {"token_embedding": {"embedding": np.zeros((VOCAB, 4), np.float32)}}}, {"step": 1})
    wanted = {"token_embedding": {"embedding": jax.ShapeDtypeStruct((PADDED, 4), np.float32)}}
    with pytest.raises(CheckpointError, match=r"expects \(64, 4\).*architecture/vocab_multiple=1"):
        store.check_shapes(1, wanted)
    store.close()
