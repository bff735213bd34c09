"""DeepSeek Sparse Attention (:mod:`theseus.model.layers.sparse_attention`): the indexer loss is the
DeepSeek-V3.2 paper's, the top-k selection keeps the best visible keys, and the training phases route
each loss to its own parameters."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import forward, jitted
from theseus.base.sown import AUX_LOSSES
from theseus.config import configuration, configure
from theseus.model.layers.sparse_attention import INDEXER_AUX_LOSS, indexer_loss, top_k_selection


def paper_loss(scores: np.ndarray, attention: np.ndarray, keys: np.ndarray, rows: np.ndarray) -> float:
    """sum_t KL(p_t,S || softmax(I_t,S)), p_t the head-summed attention on S_t, L1-normalised; by loops."""
    total = 0.0
    for b in range(scores.shape[0]):
        for t in range(scores.shape[1]):
            chosen = np.flatnonzero(keys[b, t])
            if not rows[b, t] or chosen.size == 0:
                continue
            p = attention[b, t, chosen] / attention[b, t, chosen].sum()
            q = np.exp(scores[b, t, chosen] - scores[b, t, chosen].max())
            q = q / q.sum()
            total += float(np.sum(p * np.log(p / q)))
    return total


@pytest.mark.parametrize("phase", ["dense_warmup", "sparse"])
def test_the_indexer_loss_is_the_papers_kl(phase: str) -> None:
    rng = np.random.default_rng(0)
    batch, steps, heads, topk = 2, 7, 3, 3
    scores = rng.normal(size=(batch, steps, steps)).astype(np.float32)
    visible = np.broadcast_to(np.tril(np.ones((steps, steps), bool)), (batch, steps, steps)).copy()
    visible[1, :, :2] = False  # a left-padded row
    logits = rng.normal(size=(batch, heads, steps, steps))
    probs = np.where(visible[:, None], np.exp(logits), 0.0)
    probs = probs / np.maximum(probs.sum(-1, keepdims=True), 1e-30)
    attention = probs.sum(1).astype(np.float32)  # summed over heads
    rows = np.ones((batch, steps), bool)
    rows[1, :2] = False
    keys = visible
    if phase == "sparse":
        keys = np.asarray(top_k_selection(jnp.asarray(scores), jnp.asarray(visible), topk))
        assert keys.sum(-1).max() == topk and np.all(keys <= visible)
        best = np.sort(np.where(visible, scores, -np.inf), -1)[..., -topk:]  # the selection keeps the best
        kept = np.where(keys, scores, np.inf).min(-1)
        assert np.allclose(kept[visible.sum(-1) >= topk], best[..., 0][visible.sum(-1) >= topk])
    got = float(indexer_loss(jnp.asarray(scores), jnp.asarray(attention), jnp.asarray(keys), jnp.asarray(rows)))
    expected = paper_loss(scores, attention, keys, rows)
    assert expected > 0.1 and abs(got - expected) <= 1e-5 * max(1.0, expected)


@functools.cache  # one object per setting: the tests share its compiled forward pass (conftest.forward)
def dsa_model(phase: str, topk: int = 4) -> Any:
    from theseus.model.models import DeepseekV32

    keys = {
        "architecture/preset": "tiny",
        "architecture/n_layers": 1,  # one layer, a mixture: the attention is what is checked
        "architecture/moe/first_k_dense": 0,
        "architecture/block_size": 16,
        "architecture/vocab_size": 64,
        "architecture/dsa/phase": phase,
        "architecture/dsa/index_topk": topk,
    }
    with configuration(keys):
        return configure(DeepseekV32)


def indexer_part(path: tuple[Any, ...]) -> bool:
    return any(getattr(k, "key", None) == "indexer" for k in path)


@pytest.mark.parametrize("phase", ["dense_warmup", "sparse"])
def test_each_loss_trains_only_its_own_parameters(phase: str) -> None:
    """The indexer reads detached inputs and a detached target: its loss reaches the indexer alone, and the
    language-modelling loss never reaches the indexer (the selection is discrete). The warm-up's attention
    is dense: the logits are those of a top-k past the sequence."""
    model = dsa_model(phase)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 64, (2, 12)))
    y = jnp.roll(x, -1, axis=1)
    params = nn.unbox(jitted(model.init, jax.random.key(0), x)["params"])

    def losses(p: Any) -> tuple[jax.Array, jax.Array]:
        (_, lm), sown = model.apply({"params": p}, x, y, deterministic=True, mutable=[AUX_LOSSES])
        sown_losses = jax.tree_util.tree_flatten_with_path(sown[AUX_LOSSES])[0]
        return lm, sum(jnp.sum(v) for path, v in sown_losses if INDEXER_AUX_LOSS in str(path))

    lm_grads, index_grads = jax.jit(
        lambda p: (jax.grad(lambda q: losses(q)[0])(p), jax.grad(lambda q: losses(q)[1])(p))
    )(params)
    for path, g in jax.tree_util.tree_flatten_with_path(lm_grads)[0]:
        if indexer_part(path):
            assert float(jnp.max(jnp.abs(g))) == 0.0, path
    assert float(jnp.max(jnp.abs(lm_grads["blocks_0"]["attn"]["query"]))) > 0
    for path, g in jax.tree_util.tree_flatten_with_path(index_grads)[0]:
        if not indexer_part(path):
            assert float(jnp.max(jnp.abs(g))) == 0.0, path
    attn = index_grads["blocks_0"]["attn"]["indexer"]
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(attn))
    logits, dense, sparse = (forward(m, params, x) for m in (model, dsa_model("sparse", topk=64), dsa_model("sparse")))
    assert float(jnp.max(jnp.abs(sparse - dense))) > 1e-3  # the selection binds on 12 tokens
    reference = dense if phase == "dense_warmup" else sparse
    np.testing.assert_allclose(np.asarray(logits), np.asarray(reference), atol=1e-5)
