"""``model/loss_chunk``: the loss and the targets' log-probabilities computed a chunk of logits at a time
equal those of the full logits, and the compiled training step no longer holds the full logits."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.models.conftest import build, parameter_shapes, random_params
from tests.tolerances import float32_tolerance, magnitude, model_ops
from theseus.model.models import GPT, Gemma2, TransformerLM
from theseus.training import steps
from theseus.training.state import TrainState

VOCAB = 61  # padded to 64: the padded ids are masked in every chunk


def batch(rows: int, steps: int, vocab: int = VOCAB) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    y = rng.integers(0, vocab, (rows, steps)).astype(np.int32)
    y[0, :3] = -1
    mask = np.ones((rows, steps), bool)
    mask[1, steps - 4 :] = False
    return {"x": rng.integers(0, vocab, (rows, steps)).astype(np.int32), "y": y, "padding_mask": mask}


def loss_and_grads(model: TransformerLM, params: Any, data: dict[str, np.ndarray]) -> Any:
    def loss(p: Any) -> jax.Array:
        return model.apply({"params": p}, data["x"], data["y"], data["padding_mask"], True)[1]

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize(("cls", "tied"), [(GPT, True), (Gemma2, False)], ids=["gpt", "gemma2-untied-softcap"])
def test_chunked_loss_scores_and_gradients_equal_the_full_logits(cls: type[TransformerLM], tied: bool) -> None:
    """2 rows x 13 positions in chunks of 8 tokens (4 positions each, the last chunk padded), through a
    tied head, and an untied one with Gemma 2's final softcap."""
    keys = {
        "architecture__vocab_size": VOCAB,
        "architecture__vocab_multiple": 16,
        "architecture__n_layers": 1,
        "architecture__tied_embeddings": tied,
    }
    full, chunked = build(cls, model__loss_chunk=0, **keys), build(cls, model__loss_chunk=8, **keys)
    params = random_params(full, seed=1)
    data = batch(2, 13)
    loss, grads = loss_and_grads(full, params, data)
    chunk_loss, chunk_grads = loss_and_grads(chunked, params, data)
    # the chunks change the head's and the loss's order of operations: the head over the width, the
    # log-softmax over the vocabulary and the sum over the tokens; the gradient flows on through the model
    tokens = data["y"].size
    head_ops = full.architecture.n_embd + full.architecture.padded_vocab_size + tokens
    assert abs(float(loss - chunk_loss)) <= float32_tolerance(head_ops, scale=float(loss))
    difference = jax.tree.map(lambda a, b: a - b, grads, chunk_grads)
    assert magnitude(difference) <= float32_tolerance(3 * model_ops(full), scale=magnitude(grads))

    def scores(model: TransformerLM) -> Any:
        args = (data["x"], data["y"], data["padding_mask"], True, True)
        return jax.jit(lambda p: model.apply({"params": p}, *args, method="target_scores"))(params)

    logits, logps, entropy = scores(full)
    chunk_logits, chunk_logps, chunk_entropy = scores(chunked)
    np.testing.assert_array_equal(chunk_logits, logits)
    assert logits.shape == (2, 13, VOCAB)
    vocab = full.architecture.padded_vocab_size  # the logits are equal: only the log-softmax differs
    np.testing.assert_allclose(chunk_logps, logps, rtol=0, atol=float32_tolerance(vocab, scale=magnitude(logps)))
    np.testing.assert_allclose(chunk_entropy, entropy, rtol=0, atol=float32_tolerance(vocab, scale=magnitude(entropy)))
    scored = (data["y"] != -1) & data["padding_mask"]
    assert float(-jnp.sum(logps) / scored.sum()) == pytest.approx(float(loss), rel=float32_tolerance(vocab + tokens))
    assert np.all(np.asarray(logps)[~scored] == 0.0)


def test_the_chunk_counts_tokens_per_device() -> None:
    """Rows split over ``data``, sequences over ``context``: each device's share of a chunk is the key's
    value; the vocabulary split over ``model`` does not change how many tokens a chunk holds."""
    model = build(GPT)
    assert model.loss_chunk_tokens() == 2048  # on by default
    with jax.sharding.use_abstract_mesh(jax.sharding.AbstractMesh((2, 4, 2), ("data", "context", "model"))):
        assert model.loss_chunk_tokens() == 2048 * 8
    assert build(GPT, model__loss_chunk=0).loss_chunk_tokens() is None


def test_the_compiled_step_holds_one_chunk_of_logits_not_all() -> None:
    """4 rows x 256 positions at a vocabulary of 4096: the full float32 logits are 16 MiB. In chunks of 128
    tokens (2 MiB of logits) the training step's temporaries shed more than the logits and their gradient."""
    keys = {"architecture__n_layers": 1, "architecture__vocab_size": 4096, "architecture__block_size": 256}
    logits_bytes = 4 * 256 * 4096 * 4

    def temporaries(chunk: int) -> int:
        model = build(GPT, model__loss_chunk=chunk, **keys)
        params = parameter_shapes(model)
        x = jax.ShapeDtypeStruct((4, 256), jnp.int32)

        def step(p: Any, x: jax.Array, y: jax.Array) -> Any:
            return jax.value_and_grad(lambda p: model.apply({"params": p}, x, y, deterministic=True)[1])(p)

        return int(jax.jit(step).lower(params, x, x).compile().memory_analysis().temp_size_in_bytes)

    assert temporaries(0) - temporaries(128) > 2 * logits_bytes


def test_trainers_score_targets_by_chunks_and_any_other_model_from_its_logits() -> None:
    """``steps.target_scores`` (DPO, GRPO): a TransformerLM's chunked scores; a model known only by its
    ``apply`` gets the same numbers from the logits it returns."""
    model = build(GPT, model__loss_chunk=8, architecture__n_layers=1)
    params = random_params(model, seed=2)
    data = batch(2, 13, vocab=64)
    scores = {}
    for name, known in (("chunks", model), ("logits", None)):
        state = TrainState.create(apply_fn=model.apply, params=params, tx=optax.sgd(0.1), model=known)
        scores[name] = jax.jit(lambda s: steps.target_scores(s, s.params, data, deterministic=True, entropy=True))(
            state
        )
    tolerance = float32_tolerance(model.architecture.n_embd + model.architecture.padded_vocab_size)  # the head's
    for chunked, full in zip(scores["chunks"][:3], scores["logits"][:3], strict=True):
        np.testing.assert_allclose(chunked, full, rtol=tolerance, atol=tolerance)
