"""The layers on their own: configuration keys, parameters, masks, FLOPs and numbers."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models import reference
from tests.models.conftest import jitted
from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.config import Schema, configuration, configure
from theseus.errors import ConfigError
from theseus.model.layers import (
    MLP,
    CausalSelfAttention,
    LayerNorm,
    PositionEmbedding,
    PositionSpec,
    RMSNorm,
    RotaryEmbedding,
    TokenEmbedding,
    attention_mask,
    dot_product_attention,
)
from theseus.model.models import GPT


def test_mlp_variants_parameters_and_flops() -> None:
    x = jnp.ones((2, 3, 16))
    with configuration({"architecture/activation": "swiglu", "architecture/d_ff": 40}):
        swiglu = configure(MLP)
    params = jax.eval_shape(lambda: swiglu.init(jax.random.key(0), x))["params"]
    assert {k: v["kernel"].value.shape for k, v in params.items()} == {
        "gate": (16, 40),
        "up": (16, 40),
        "down": (40, 16),
    }
    assert params["up"]["kernel"].names == (Axis.EMBED, Axis.MLP)
    assert params["down"]["bias"].names == (Axis.EMBED,)
    assert configure(MLP, n_embd=16, d_ff=40, activation="swiglu").flops(7) == 6 * 7 * 3 * 16 * 40
    assert configure(MLP, n_embd=16).flops(7) == 6 * 7 * 2 * 16 * 64  # default ratio 4, gelu
    assert configure(MLP, n_embd=16, mlp_ratio=2.5).flops(1) == 6 * 2 * 16 * 40
    assert configure(MLP).sharding == ShardingPlan(embed=MeshAxis.DATA, mlp=MeshAxis.MODEL)
    with pytest.raises(ConfigError, match="architecture/n_embd"):
        configure(MLP).flops(3)


@pytest.mark.parametrize(
    ("layer", "values", "message"),
    [
        (
            CausalSelfAttention,
            {"architecture/dropout": 1.5},
            "architecture/dropout=1.5 is out of range; it must be >= 0 and < 1",
        ),
        (
            MLP,
            {"architecture/activation": "swish"},
            "architecture/activation='swish' is not accepted; use one of: gelu,",
        ),
        (RMSNorm, {"architecture/norm_eps": 0.0}, "architecture/norm_eps=0.0 is out of range; it must be > 0"),
    ],
)
def test_a_layer_alone_refuses_what_the_model_refuses(layer: type, values: dict, message: str) -> None:
    """The architecture keys that layers share with the models are declared once, bounds included: a layer
    configured on its own refuses a value as the model around it does, and every declaration is the same."""
    with configuration(values), pytest.raises(ConfigError) as refused:
        configure(layer)
    assert str(refused.value).startswith(message)
    key = next(iter(values))
    shared = [s for cls in (layer, GPT) for s in Schema.build(cls.gather()) if s.key == key]
    assert len(shared) == 2 and len({(s.default, s.constraints, s.help) for s in shared}) == 1


def test_mlp_computes_gelu_mlp() -> None:
    mlp = configure(MLP, n_embd=8, d_ff=12)
    x = np.random.default_rng(0).normal(size=(1, 4, 8)).astype(np.float32)
    variables = jax.jit(mlp.init)(jax.random.key(0), x)
    p = jax.tree.map(np.asarray, nn.unbox(variables["params"]))
    expected = reference.gelu_tanh(x @ p["up"]["kernel"] + p["up"]["bias"]) @ p["down"]["kernel"] + p["down"]["bias"]
    np.testing.assert_allclose(mlp.apply(variables, x), expected, atol=1e-6)


def test_attention_keys_gqa_and_flops() -> None:
    keys = set(Schema.build(CausalSelfAttention.gather()).keys())
    assert {"architecture/n_heads", "architecture/n_kv_heads", "architecture/attention_impl"} <= keys
    with configuration({"architecture/n_heads": 4, "architecture/n_kv_heads": 2}):
        attn = configure(CausalSelfAttention)
    params = jax.eval_shape(lambda: attn.init(jax.random.key(0), jnp.ones((1, 3, 16))))["params"]
    assert params["query"].value.shape == (16, 4, 4) and params["key"].value.shape == (16, 2, 4)
    assert params["key"].names == (Axis.EMBED, Axis.KV_HEADS, Axis.HEAD_DIM)
    assert params["out"].names == (Axis.HEADS, Axis.HEAD_DIM, Axis.EMBED)
    seq = 9
    projections = 2 * 16 * 16 + 2 * 16 * 8
    assert configure(CausalSelfAttention, n_embd=16, n_heads=4, n_kv_heads=2).flops(seq) == (
        6 * seq * projections + 12 * seq * seq * 16
    )
    with pytest.raises(ConfigError, match="architecture/n_heads"):
        configure(CausalSelfAttention).init(jax.random.key(0), jnp.ones((1, 2, 8)))
    with pytest.raises(ConfigError, match="must divide"):
        configure(CausalSelfAttention, n_heads=4, n_kv_heads=3).init(jax.random.key(0), jnp.ones((1, 2, 8)))


def test_attention_is_causal_and_ignores_padded_keys() -> None:
    attn = configure(CausalSelfAttention, n_heads=2, n_kv_heads=1, position=PositionSpec())
    rng = np.random.default_rng(1)
    x = rng.normal(size=(1, 6, 8)).astype(np.float32)
    variables = jax.jit(attn.init)(jax.random.key(0), x)
    apply = jax.jit(lambda x, m: attn.apply(variables, x, padding_mask=m))
    full = np.ones((1, 6), bool)
    base = np.asarray(apply(x, full))
    future = x.copy()
    future[:, 4:] += 1.0  # changing later tokens leaves earlier outputs alone
    np.testing.assert_allclose(np.asarray(apply(future, full))[:, :4], base[:, :4], atol=1e-6)
    mask = full.copy()
    mask[0, 1] = False  # a padded key: its content no longer matters to anyone
    changed = x.copy()
    changed[:, 1] += 5.0
    a, b = np.asarray(apply(x, mask)), np.asarray(apply(changed, mask))
    np.testing.assert_allclose(np.delete(a, 1, axis=1), np.delete(b, 1, axis=1), atol=1e-6)
    assert not np.allclose(a, base)


def test_rotary_scores_depend_on_relative_position_only() -> None:
    rope = RotaryEmbedding(theta=100.0)
    rng = np.random.default_rng(2)
    q = rng.normal(size=(1, 1, 1, 8)).astype(np.float32)
    k = rng.normal(size=(1, 1, 1, 8)).astype(np.float32)

    def score(pq: int, pk: int) -> float:
        rq = rope.apply({}, q, jnp.array([[pq]]))
        rk = rope.apply({}, k, jnp.array([[pk]]))
        return float(jnp.sum(rq * rk))

    assert score(5, 2) == pytest.approx(score(13, 10), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)
    np.testing.assert_allclose(rope.apply({}, q, jnp.array([[0]])), q)  # position 0 is the identity
    expected = reference.rope(q.astype(np.float64), np.array([[7]]), 100.0)
    np.testing.assert_allclose(rope.apply({}, q, jnp.array([[7]])), expected, atol=1e-5)


def test_norms_match_their_definitions() -> None:
    x = np.random.default_rng(3).normal(2.0, 3.0, size=(2, 5)).astype(np.float32)
    ln = configure(LayerNorm)
    rms = configure(RMSNorm)
    ones = {"scale": np.ones(5), "bias": np.zeros(5)}
    np.testing.assert_allclose(
        ln.apply(ln.init(jax.random.key(0), x), x), reference.layer_norm(x, ones, 1e-5), atol=1e-5
    )
    np.testing.assert_allclose(
        rms.apply(rms.init(jax.random.key(0), x), x), reference.rms_norm(x, ones, 1e-5), atol=1e-5
    )
    with configuration({"architecture/norm_eps": 0.5}):
        assert configure(RMSNorm).eps == 0.5
    bf16 = configure(LayerNorm, activation_dtype="bfloat16")
    out = bf16.apply(bf16.init(jax.random.key(0), x), x)
    assert out.dtype == jnp.bfloat16
    assert jax.eval_shape(lambda: bf16.init(jax.random.key(0), x))["params"]["scale"].value.dtype == jnp.float32


def test_embeddings_lookup_attend_and_axes() -> None:
    with configuration({"architecture/vocab_size": 10, "architecture/n_embd": 4, "architecture/block_size": 6}):
        tok = configure(TokenEmbedding)
        pos = configure(PositionEmbedding)
    ids = jnp.array([[1, 2, 9]])
    variables = tok.init(jax.random.key(0), ids)
    table = np.asarray(nn.unbox(variables["params"]["embedding"]))
    assert variables["params"]["embedding"].names == (Axis.VOCAB, Axis.EMBED)
    np.testing.assert_allclose(tok.apply(variables, ids), table[[[1, 2, 9]]])
    h = np.ones((1, 3, 4), np.float32)
    logits = tok.apply(variables, h, method=TokenEmbedding.attend)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, h @ table.T, atol=1e-6)
    pvars = pos.init(jax.random.key(0), 3)
    ptable = np.asarray(nn.unbox(pvars["params"]["embedding"]))
    assert ptable.shape == (6, 4)
    np.testing.assert_allclose(pos.apply(pvars, 3), ptable[None, :3])
    np.testing.assert_allclose(pos.apply(pvars, jnp.array([[2, 0]])), ptable[None, [2, 0]])
    with pytest.raises(ConfigError, match="architecture/n_embd"):
        configure(TokenEmbedding).init(jax.random.key(0), ids)


def test_blocked_causal_attention_matches_the_full_square() -> None:
    rng = np.random.default_rng(4)
    steps = 300  # long enough for query blocks, not a multiple of the block
    q = jnp.asarray(rng.normal(size=(2, steps, 4, 8)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(2, steps, 2, 8)), jnp.float32)
    v = jnp.asarray(rng.normal(size=(2, steps, 2, 8)), jnp.float32)
    key_mask = np.ones((2, steps), bool)
    key_mask[1, :7] = False
    mask = attention_mask(jnp.asarray(key_mask))

    weight = jnp.asarray(key_mask, jnp.float32)[:, :, None, None]  # padded query rows never reach a loss

    def loss(fn):
        return lambda q, k, v: jnp.sum(jnp.sin(fn(q, k, v)) * weight)

    blocked = lambda q, k, v: dot_product_attention(q, k, v, mask=mask, is_causal=True)  # noqa: E731
    full = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=True)  # noqa: E731
    run = jax.jit(
        lambda q, k, v: (
            blocked(q, k, v),
            full(q, k, v),
            jax.grad(loss(blocked), (0, 1, 2))(q, k, v),
            jax.grad(loss(full), (0, 1, 2))(q, k, v),
        )
    )
    out_b, out_f, grads_b, grads_f = run(q, k, v)
    real = key_mask  # rows of padded queries are unspecified
    np.testing.assert_allclose(np.asarray(out_b)[real], np.asarray(out_f)[real], atol=1e-5)
    for gb, gf in zip(grads_b, grads_f, strict=True):
        np.testing.assert_allclose(gb, gf, atol=1e-4)


@pytest.mark.parametrize("window", [None, 37])
def test_attention_sinks_in_query_blocks_match_the_softmax_with_a_sink_column(window: int | None) -> None:
    """GPT-OSS's sinks through the blocked XLA path (no fused kernel takes them): each row's softmax has
    one more logit per head, taking probability but adding no value."""
    rng = np.random.default_rng(5)
    steps, heads, kv, width = 300, 4, 2, 8
    q = rng.normal(size=(1, steps, heads, width)).astype(np.float32)
    k = rng.normal(size=(1, steps, kv, width)).astype(np.float32)
    v = rng.normal(size=(1, steps, kv, width)).astype(np.float32)
    sinks = rng.normal(size=(heads,)).astype(np.float32) * 3
    ours = jitted(
        dot_product_attention,
        jnp.asarray(q),
        jnp.asarray(k),
        jnp.asarray(v),
        mask=None,
        is_causal=True,
        window=window,
        sinks=jnp.asarray(sinks),
    )
    position = np.arange(steps)
    allowed = position[None, :] <= position[:, None]
    if window is not None:
        allowed &= position[None, :] > position[:, None] - window
    expected = np.empty_like(q)
    for head in range(heads):
        group = head // (heads // kv)
        scores = np.where(allowed, q[0, :, head] @ k[0, :, group].T / np.sqrt(width), -np.inf)
        top = np.maximum(scores.max(axis=1, keepdims=True), sinks[head])
        weights = np.exp(scores - top)
        weights /= weights.sum(axis=1, keepdims=True) + np.exp(sinks[head] - top)
        expected[0, :, head] = weights @ v[0, :, group]
    np.testing.assert_allclose(np.asarray(ours), expected, atol=2e-5)
