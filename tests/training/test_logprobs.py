"""``theseus.base.logprobs``: target log-probabilities against a numpy log-softmax."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tolerances import float32_tolerance
from theseus.base.logprobs import (
    IGNORED,
    chunk_layout,
    chunked_cross_entropy,
    chunked_token_logps,
    cross_entropy,
    scored_positions,
    sequence_logps,
    token_entropy,
    token_logps,
)


def numpy_logps(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    return np.take_along_axis(logp, np.maximum(targets, 0)[..., None], -1)[..., 0]


def test_target_logps_skip_ignored_targets_and_masked_positions() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (3, 7, 11)).astype(np.float32)
    targets = rng.integers(0, 11, (3, 7))
    targets[0, :2] = IGNORED
    mask = np.ones((3, 7), bool)
    mask[1, 5:] = False
    scored = (targets != IGNORED) & mask

    token = token_logps(jnp.asarray(logits, jnp.bfloat16), targets, mask)
    assert token.dtype == jnp.float32
    expected = np.where(scored, numpy_logps(np.asarray(jnp.asarray(logits, jnp.bfloat16), np.float32), targets), 0.0)
    np.testing.assert_allclose(token, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(scored_positions(targets, mask), scored)
    expected = np.where(scored, numpy_logps(logits, targets), 0.0)
    total, count = sequence_logps(logits, targets, mask)
    np.testing.assert_allclose(total, expected.sum(-1), rtol=1e-5)
    np.testing.assert_array_equal(count, scored.sum(-1).astype(np.float32))
    assert float(cross_entropy(logits, targets, mask)) == pytest.approx(-expected.sum() / scored.sum(), rel=1e-5)
    assert float(cross_entropy(logits, np.full((3, 7), IGNORED))) == 0.0


def test_chunk_layout_splits_positions_of_every_row() -> None:
    assert chunk_layout(8, 1024, 2048) == (4, 256)  # 8 rows x 256 positions per chunk
    assert chunk_layout(3, 13, 7) == (7, 2)  # 2 positions per chunk; the last chunk holds one padded
    assert chunk_layout(64, 4, 16) == (4, 1)  # more rows than a chunk's tokens: one position at a time
    assert chunk_layout(8, 256, 2048) is None  # one chunk holds every token
    assert chunk_layout(8, 4096, 0) is None and chunk_layout(8, 4096, None) is None


@pytest.mark.parametrize("chunk_tokens", [5, 12])
def test_chunked_loss_and_scores_equal_the_full_logits(chunk_tokens: int) -> None:
    """Chunks of 1 or 4 positions of 3 rows (the last padded): every value and gradient of the full
    logits' within float32 rounding, the gradient of the summed loss scaled by the cotangent it is given."""
    rng = np.random.default_rng(1)
    hidden = jnp.asarray(rng.normal(size=(3, 13, 8)), jnp.float32)
    weights = {"w": jnp.asarray(rng.normal(size=(8, 11)), jnp.float32), "cap": jnp.asarray(4.0)}
    targets = rng.integers(0, 11, (3, 13))
    targets[0, :3] = IGNORED
    mask = np.ones((3, 13), bool)
    mask[2, 9:] = False
    # what the chunks reorder: the head's contraction over 8, the log-softmax over 11, the sum over 39 tokens
    ops = 8 + 11 + targets.size
    tolerance, grad_tolerance = float32_tolerance(ops), float32_tolerance(3 * ops)  # 3: forward and backward

    def head(w: dict, h: jax.Array) -> jax.Array:
        return jnp.tanh(h @ w["w"] / w["cap"]) * w["cap"]

    def full(w: dict, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = head(w, h)
        return 3.0 * cross_entropy(logits, targets, mask), jnp.sum(token_logps(logits, targets, mask) ** 2)

    def chunked(w: dict, h: jax.Array) -> tuple[jax.Array, jax.Array]:
        loss = chunked_cross_entropy(head, w, h, targets, mask, chunk_tokens=chunk_tokens)
        logps, _ = chunked_token_logps(head, w, h, targets, mask, chunk_tokens=chunk_tokens)
        return 3.0 * loss, jnp.sum(logps**2)

    for which in (0, 1):  # the loss (gradients taken chunk by chunk), then the scores (recomputed)
        grad = jax.jit(jax.value_and_grad(lambda w, h, f, i: f(w, h)[i], argnums=(0, 1)), static_argnums=(2, 3))
        value, grads = grad(weights, hidden, full, which)
        chunk_value, chunk_grads = grad(weights, hidden, chunked, which)
        assert abs(float(value - chunk_value)) <= tolerance * max(1.0, abs(float(value)))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(chunk_grads), strict=True):
            np.testing.assert_allclose(b, a, rtol=0, atol=grad_tolerance * max(1.0, float(jnp.max(jnp.abs(a)))))
    logps, entropy = jax.jit(
        lambda w, h: chunked_token_logps(head, w, h, targets, mask, chunk_tokens=chunk_tokens, entropy=True)
    )(weights, hidden)
    logits = head(weights, hidden)
    np.testing.assert_allclose(logps, token_logps(logits, targets, mask), rtol=tolerance, atol=tolerance)
    np.testing.assert_allclose(entropy, token_entropy(logits), rtol=tolerance, atol=tolerance)
    assert float(jnp.min(entropy)) > 0.0
