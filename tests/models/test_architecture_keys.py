"""Architecture switches that pretrained checkpoints need: biases, head width, tied heads, RoPE scaling."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import build
from theseus.checkpoint.layers import per_layer, stacked
from theseus.errors import ConfigError
from theseus.model.huggingface.config_fields import yarn_keys
from theseus.model.layers.rotary import RopeScaling, rotary_angles
from theseus.model.models import GPT, Llama, TransformerLM


def shapes(model: TransformerLM) -> dict:
    tree = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])
    return per_layer(nn.unbox(tree), model.stacked_layers)  # the per-layer view of any layout


def test_qwen2_style_biases_on_query_key_value_only() -> None:
    params = shapes(build(Llama, architecture__attention_bias=True, architecture__attention_out_bias=False))
    attn = params["blocks_0"]["attn"]
    assert {"query_bias", "key_bias", "value_bias"} <= set(attn)
    assert "out_bias" not in attn
    assert attn["key_bias"].shape == (2, 8)
    assert not any("bias" in name for name in params["blocks_0"]["mlp"]["up"])


def test_gpt_without_mlp_bias_keeps_attention_biases() -> None:
    params = shapes(build(GPT, architecture__mlp_bias=False))
    assert set(params["blocks_0"]["mlp"]["up"]) == {"kernel"}
    assert {"query_bias", "out_bias"} <= set(params["blocks_0"]["attn"])


def test_head_dim_independent_of_width() -> None:
    model = build(Llama, architecture__head_dim=16)  # 4 heads x 16 != 32 wide
    attn = shapes(model)["blocks_0"]["attn"]
    assert attn["query"].shape == (32, 4, 16)
    assert attn["key"].shape == (32, 2, 16)
    assert attn["out"].shape == (4, 16, 32)
    attention, mlp = 2 * 32 * 4 * 16 + 2 * 32 * 2 * 16, 3 * 32 * model.architecture.feed_forward.d_ff
    assert model.layer_flops(1)[0] == 6 * (attention + mlp) + 12 * 4 * 16
    params = stacked(shapes(model), model.stacked_layers)  # the model's own layout again
    logits, _ = jax.eval_shape(
        lambda p: model.apply({"params": p}, jnp.ones((2, 5), jnp.int32), deterministic=True), params
    )
    assert logits.shape == (2, 5, 64)


def test_tied_and_untied_heads_per_family() -> None:
    assert "lm_head" in shapes(build(Llama))
    assert "lm_head" not in shapes(build(Llama, architecture__tied_embeddings=True))
    assert shapes(build(GPT, architecture__tied_embeddings=False))["lm_head"].shape == (32, 64)


def test_defaults_keep_the_family_shapes() -> None:
    gpt, llama = build(GPT).architecture, build(Llama).architecture
    assert (gpt.attention.qkv_bias, gpt.attention.has_out_bias, gpt.feed_forward.bias, gpt.tied_embeddings) == (
        True,
        True,
        True,
        True,
    )
    assert (llama.attention.qkv_bias, llama.attention.has_out_bias, llama.feed_forward.bias, llama.tied_embeddings) == (
        False,
        False,
        False,
        False,
    )


@pytest.mark.parametrize(
    ("kind", "extra"),
    [
        ("linear", {"factor": 4.0}),
        (
            "llama3",
            {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        ),
        ("yarn", {"factor": 16.0, "original_max_position_embeddings": 256}),
        (
            "yarn",
            {
                "factor": 4.0,
                "original_max_position_embeddings": 64,
                "beta_fast": 16.0,
                "beta_slow": 2.0,
                "truncate": False,
                "mscale": 1.0,
                "mscale_all_dim": 0.5,
            },
        ),
    ],
)
def test_rope_scaling_matches_transformers(kind: str, extra: dict) -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    head_dim, theta = 16, 10000.0
    config = LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=512,
        rope_parameters={"rope_type": kind, "rope_theta": theta, **extra},
    )
    expected, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    if kind == "yarn":  # through the import's resolution of the defaults and the attention factor
        keys = yarn_keys({"max_position_embeddings": 512}, extra)
        scaling = RopeScaling(
            kind=kind,
            factor=keys["architecture/rope_factor"],
            original_max_positions=keys["architecture/rope_original_max_positions"],
            beta_fast=keys["architecture/rope_beta_fast"],
            beta_slow=keys["architecture/rope_beta_slow"],
            truncate=keys["architecture/rope_truncate"],
            attention_factor=keys["architecture/rope_attention_factor"],
        )
    else:
        scaling = RopeScaling(
            kind=kind,
            factor=extra["factor"],
            low_freq_factor=extra.get("low_freq_factor", 1.0),
            high_freq_factor=extra.get("high_freq_factor", 4.0),
            original_max_positions=extra.get("original_max_position_embeddings", 8192),
        )
    got = np.asarray(rotary_angles(jnp.ones((1,), jnp.int32), head_dim, theta, scaling.validate()))[0]
    plain = np.asarray(rotary_angles(jnp.ones((1,), jnp.int32), head_dim, theta))[0]
    np.testing.assert_allclose(got, expected.numpy(), rtol=1e-6)
    assert not np.allclose(got, plain)
    assert abs(scaling.magnitude - attention_factor) <= 1e-12
    if kind == "yarn":  # some frequencies kept, some divided by the factor, some in between
        ratio = plain / got
        assert ratio[0] == 1.0 and abs(ratio[-1] - extra["factor"]) < 1e-5
        assert np.any((ratio > 1.0 + 1e-6) & (ratio < extra["factor"] - 1e-6))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"architecture/sliding_window": 0}, "architecture/sliding_window must be a positive integer or null"),
        (
            {"architecture/sliding_window": 128, "architecture/block_size": 64},
            "architecture/sliding_window=128 is longer than architecture/block_size=64, so it never limits",
        ),
        ({"architecture/rope_scaling": "ntk"}, "unknown architecture/rope_scaling 'ntk'"),
        (
            {
                "architecture/rope_scaling": "yarn",
                "architecture/rope_beta_fast": 1.0,
                "architecture/rope_beta_slow": 2.0,
            },
            "yarn rope scaling needs architecture/rope_beta_fast > architecture/rope_beta_slow > 0, got 1.0 and 2.0",
        ),
        ({"architecture/head_dim": 0}, "architecture/head_dim must be a positive integer"),
        ({"architecture/n_embd": 30, "architecture/n_heads": 4}, "or set architecture/head_dim"),
    ],
)
def test_bad_switches_are_one_line_errors(values: dict, message: str) -> None:
    model = build(Llama, **{k.replace("/", "__"): v for k, v in values.items()})
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")) as info:
        _ = model.architecture
    assert "\n" not in str(info.value)


def test_sequences_longer_than_the_sliding_window_work() -> None:
    model = build(Llama, architecture__sliding_window=32, architecture__block_size=64)
    assert (model.architecture.attention.sliding_window, model.architecture.block_size) == (32, 64)


def test_the_original_context_is_read_where_transformers_reads_it() -> None:
    """A top-level original_max_position_embeddings wins over the rope entry's, and without either
    the scaled kinds fall back to max_position_embeddings, as transformers' standardisation does."""
    from theseus.model.huggingface.config_fields import rope_keys

    yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8}
    both = rope_keys({"max_position_embeddings": 64, "original_max_position_embeddings": 16, "rope_parameters": yarn})
    assert both["architecture/rope_original_max_positions"] == 16
    llama3 = {"rope_type": "llama3", "factor": 8.0}
    assert (
        rope_keys({"max_position_embeddings": 64, "rope_parameters": llama3})[
            "architecture/rope_original_max_positions"
        ]
        == 64
    )
