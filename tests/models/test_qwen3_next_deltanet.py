"""Qwen3-Next's gated delta rule: the chunked form equals the recurrent one and transformers' torch
fallbacks on the same random inputs; the layer's cached decode equals its whole-sequence output."""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import jitted
from theseus.config import configuration, configure
from theseus.model.layers.deltanet import (
    GatedDeltaNet,
    _doubling_inverse,
    chunk_gated_delta_rule,
    recurrent_gated_delta_rule,
    unit_lower_inverse,
)
from theseus.plan.hlo import analyse


def random_inputs(steps: int, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Two rows, 2 query/key heads of 8 serving 4 value heads of 6, decays and strengths that bind."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(2, steps, 2, 8)).astype(np.float32)
    k = rng.normal(size=(2, steps, 2, 8)).astype(np.float32)
    v = rng.normal(size=(2, steps, 4, 6)).astype(np.float32)
    g = -rng.uniform(0.01, 0.5, size=(2, steps, 4)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, size=(2, steps, 4)).astype(np.float32)
    state = rng.normal(size=(2, 4, 8, 6)).astype(np.float32)
    return q, k, v, g, beta, state


@pytest.mark.parametrize("chunk", [4, 64])
def test_chunked_rule_equals_recurrent_and_transformers(chunk: int) -> None:
    import torch
    from transformers.models.qwen3_next import modeling_qwen3_next as hf

    q, k, v, g, beta, state = random_inputs(19)
    # each rule compiled whole (run eagerly, every operation would be a program of its own)
    out_c, s_c = jitted(chunk_gated_delta_rule, *map(jnp.asarray, (q, k, v, g, beta, state)), chunk_size=chunk)
    out_r, s_r = jitted(recurrent_gated_delta_rule, *map(jnp.asarray, (q, k, v, g, beta, state)))
    assert np.max(np.abs(np.asarray(out_c) - np.asarray(out_r))) <= 1e-5
    assert np.max(np.abs(np.asarray(s_c) - np.asarray(s_r))) <= 1e-5
    t = [torch.tensor(x) for x in (q, k, v, g, beta, state)]
    kwargs = {"initial_state": t[5], "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    out_t, s_t = hf.torch_chunk_gated_delta_rule(*t[:3], g=t[3], beta=t[4], chunk_size=chunk, **kwargs)
    assert np.max(np.abs(np.asarray(out_c) - out_t.numpy())) <= 1e-5
    assert np.max(np.abs(np.asarray(s_c) - s_t.numpy())) <= 1e-5
    out_t, s_t = hf.torch_recurrent_gated_delta_rule(*t[:3], g=t[3], beta=t[4], **kwargs)
    assert np.max(np.abs(np.asarray(out_r) - out_t.numpy())) <= 1e-5
    assert np.max(np.abs(np.asarray(s_r) - s_t.numpy())) <= 1e-5


def test_per_channel_decay_equals_transformers_kimi_delta_attention() -> None:
    """With a decay per key channel (Kimi Delta Attention) the chunked rule (chunks of 4 over 19 positions) and
    the recurrent one compute transformers' torch fallbacks."""
    import torch
    from transformers.models.kimi_linear import modeling_kimi_linear as hf

    q, k, _, _, beta, state = random_inputs(19)
    q, k = np.repeat(q, 2, axis=2), np.repeat(k, 2, axis=2)  # [2, 19, 4, 8]: one query/key head per value head
    v = np.random.default_rng(1).normal(size=(2, 19, 4, 8)).astype(np.float32)
    g = -np.random.default_rng(2).uniform(0.01, 0.8, size=(2, 19, 4, 8)).astype(np.float32)
    state = np.random.default_rng(3).normal(size=(2, 4, 8, 8)).astype(np.float32)
    out_c, s_c = jitted(chunk_gated_delta_rule, *map(jnp.asarray, (q, k, v, g, beta, state)), chunk_size=4)
    out_r, s_r = jitted(recurrent_gated_delta_rule, *map(jnp.asarray, (q, k, v, g, beta, state)))
    t = [torch.tensor(x) for x in (q, k, v, g, beta, state)]
    kwargs = {"initial_state": t[5], "output_final_state": True, "use_qk_l2norm_in_kernel": True}
    out_t, s_t = hf.chunk_kimi_delta_attention(*t[:3], g=t[3], beta=t[4], chunk_size=4, **kwargs)
    assert np.max(np.abs(np.asarray(out_c) - out_t.numpy())) <= 1e-5
    assert np.max(np.abs(np.asarray(s_c) - s_t.numpy())) <= 1e-5
    out_t, s_t = hf.recurrent_kimi_delta_attention(*t[:3], g=t[3], beta=t[4], **kwargs)
    assert np.max(np.abs(np.asarray(out_r) - out_t.numpy())) <= 1e-5
    assert np.max(np.abs(np.asarray(s_r) - s_t.numpy())) <= 1e-5


@pytest.mark.parametrize("size", [1, 6, 64])
def test_unit_lower_inverse_and_its_gradient(size: int) -> None:
    rng = np.random.default_rng(size)
    t = np.tril(rng.normal(0.0, 0.3, (3, 2, size, size)), -1) + np.eye(size)
    got = np.asarray(jax.jit(unit_lower_inverse)(jnp.asarray(t, jnp.float32)))
    np.testing.assert_allclose(got, np.linalg.inv(t), atol=1e-5, rtol=1e-5)
    # the closed-form gradient equals differentiating the doubling itself; nothing on or above the diagonal
    weights = jnp.asarray(rng.normal(size=t.shape), jnp.float32)
    closed, traced = (
        np.asarray(jax.jit(jax.grad(lambda x, f=f: jnp.sum(f(x) * weights)))(jnp.asarray(t, jnp.float32)))
        for f in (unit_lower_inverse, _doubling_inverse)
    )
    np.testing.assert_allclose(closed, traced, atol=1e-5, rtol=1e-4)
    assert not np.any(np.triu(closed))


def test_chunked_rule_and_its_gradient_are_xla_operations_only() -> None:
    """No library call (LAPACK's batched triangular solve, parallelised over the pool of the XLA:CPU thunks
    calling it, deadlocked when two ran at once on a two-thread pool)."""
    inputs = tuple(map(jnp.asarray, random_inputs(19)[:5]))

    def loss(*xs: jax.Array) -> jax.Array:
        return jnp.sum(chunk_gated_delta_rule(*xs, chunk_size=4)[0])

    text = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3, 4))).lower(*inputs).as_text()
    assert "custom_call" not in text


def test_layer_decodes_through_its_state_as_it_reads_the_whole_sequence() -> None:
    """A prompt of 7 (chunks of 4) then one token at a time gives the whole sequence's outputs."""
    layer = GatedDeltaNet(key_heads=2, value_heads=4, key_dim=8, value_dim=6, conv_kernel=4, chunk_size=4)
    x = jax.random.normal(jax.random.key(0), (2, 11, 16))
    params = jitted(layer.init, jax.random.key(1), x)["params"]
    params = jax.tree.map(lambda p: p * 4.0, params)  # larger weights: the state matters
    whole = jitted(layer.apply, {"params": params}, x)
    cache = jitted(layer.init, jax.random.key(1), x, decode=True)["cache"]
    cache = jax.tree.map(jnp.zeros_like, cache)
    out, mutated = jitted(layer.apply, {"params": params, "cache": cache}, x[:, :7], decode=True, mutable=["cache"])
    outs = [out]
    for t in range(7, 11):
        out, mutated = jitted(
            layer.apply, {"params": params, "cache": mutated["cache"]}, x[:, t : t + 1], decode=True, mutable=["cache"]
        )
        outs.append(out)
    assert np.max(np.abs(np.concatenate(outs, axis=1) - np.asarray(whole))) <= 1e-4
    assert np.max(np.abs(np.asarray(whole))) > 1e-2


@pytest.mark.parametrize(
    ("sizes", "steps"),
    [
        ({"key_dim": 16, "value_dim": 16, "chunk_size": 16}, 40),  # padded to three chunks
        ({"key_dim": 32, "value_dim": 64, "chunk_size": 16}, 48),
    ],
)
def test_layer_flops_count_the_compiled_program(sizes: dict[str, int], steps: int) -> None:
    """``GatedDeltaNet.flops`` against the FLOPs of its compiled forward and backward (every loop
    iteration counted, as ``theseus plan`` counts them): the chunked rule's products and the doubling
    inverse are counted (before, a tiny Qwen3-Next's H100 step compiled 2.16 times what it counted)."""
    with configuration({}):
        layer = configure(GatedDeltaNet, key_heads=2, value_heads=4, n_embd=32, **sizes)
    x = jnp.zeros((1, steps, 32), jnp.float32)
    params = jax.eval_shape(lambda: layer.init(jax.random.key(0), x))["params"]

    def loss(p: Any, x: jax.Array) -> jax.Array:
        return jnp.sum(layer.apply({"params": p}, x))

    program = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(nn.unbox(params), x).compile().as_text()
    assert 0.9 <= layer.flops(steps) / analyse(program, 1).flops <= 1.1
