"""``theseus.base.logprobs``: target log-probabilities against a numpy log-softmax."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from theseus.base.logprobs import IGNORED, cross_entropy, scored_positions, sequence_logps, token_logps


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
