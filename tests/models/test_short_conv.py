"""The gated short convolution (LFM2's ``conv`` layers): transformers' layer on the same weights, cached
decoding through its rolling state, left padding, packed examples, and the LFM2 presets' published counts."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from tests.models.conftest import decoded_after_left_padding, jitted
from theseus.config import configuration, configure
from theseus.model.layers.short_conv import ShortConv

WIDTH, TAPS = 16, 3


def layer_and_params(bias: bool = False) -> tuple[ShortConv, dict]:
    layer = ShortConv(conv_kernel=TAPS, use_bias=bias)
    x = jnp.zeros((1, 4, WIDTH))
    params = nn.unbox(jitted(layer.init, jax.random.key(1), x)["params"])
    rng = np.random.default_rng(0)
    return layer, jax.tree.map(lambda p: jnp.asarray(0.4 * rng.normal(size=p.shape), jnp.float32), params)


def test_the_layer_computes_transformers_short_conv_with_biases() -> None:
    """Lfm2ShortConv with conv_bias (every projection and the convolution biased) on the same weights."""
    import torch
    from transformers import Lfm2Config
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    from theseus.model.models.lfm2.hf import conv_map, in_proj_map

    layer, params = layer_and_params(bias=True)
    config = Lfm2Config(hidden_size=WIDTH, conv_L_cache=TAPS, conv_bias=True, num_hidden_layers=1)
    theirs = Lfm2ShortConv(config, 0).eval()
    ours = jax.tree.map(np.asarray, params)
    state = {
        "in_proj.weight": in_proj_map("", ("in_proj",), WIDTH).to_hf([ours["in_proj"]]),
        "in_proj.bias": ours["in_proj_bias"].reshape(-1),
        "conv.weight": conv_map("", ("conv",), WIDTH, TAPS).to_hf([ours["conv"]]),
        "conv.bias": ours["conv_bias"],
        "out_proj.weight": ours["out_proj"].T,
        "out_proj.bias": ours["out_proj_bias"],
    }
    theirs.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()})
    x = np.random.default_rng(2).normal(size=(2, 9, WIDTH)).astype(np.float32)
    with torch.no_grad():
        expected = theirs(torch.tensor(x)).numpy()
    got = np.asarray(jitted(layer.apply, {"params": params}, jnp.asarray(x)))
    assert np.max(np.abs(got - expected)) <= 1e-5 and np.max(np.abs(expected)) > 1e-1


def test_cached_decoding_rolls_the_state_and_left_padding_starts_empty() -> None:
    """A left-padded prompt of 5 then one token at a time gives the unpadded rows' whole-sequence outputs."""
    layer, params = layer_and_params()
    x = jax.random.normal(jax.random.key(0), (2, 9, WIDTH))
    whole = np.asarray(jitted(layer.apply, {"params": params}, x))
    decoded, cache = decoded_after_left_padding(layer, params, x)
    assert cache["conv"].shape == (2, TAPS - 1, WIDTH)
    assert np.max(np.abs(decoded - whole)) <= 1e-5


def test_packed_examples_do_not_read_each_other() -> None:
    """Segment ids: two examples packed in one row give each example's own outputs."""
    layer, params = layer_and_params()
    x = jax.random.normal(jax.random.key(3), (1, 10, WIDTH))
    segments = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]], jnp.int32)
    packed = np.asarray(jitted(layer.apply, {"params": params}, x, segments))
    first = np.asarray(jitted(layer.apply, {"params": params}, x[:, :4]))
    second = np.asarray(jitted(layer.apply, {"params": params}, x[:, 4:9]))
    assert np.max(np.abs(packed[:, :4] - first)) <= 1e-5
    assert np.max(np.abs(packed[:, 4:9] - second)) <= 1e-5
    unpacked = np.asarray(jitted(layer.apply, {"params": params}, x))
    assert np.max(np.abs(unpacked[:, 4:9] - second)) > 1e-2  # not vacuous: across the boundary it differs


def test_the_lfm2_presets_have_the_published_shapes_and_counts() -> None:
    """lfm2-350m and lfm2-1.2b against transformers' LFM2 built from the releases' config fields (meta device)."""
    import torch
    from transformers import AutoModelForCausalLM, Lfm2Config

    from theseus.model.models.lfm2.model import Lfm2

    releases = {  # LiquidAI/LFM2-350M and LFM2-1.2B: block_ff_dim 6656 and 12288, auto-adjusted
        "lfm2-350m": ({"hidden_size": 1024, "num_attention_heads": 16, "intermediate_size": 6656}, 354_483_968),
        "lfm2-1.2b": ({"hidden_size": 2048, "num_attention_heads": 32, "intermediate_size": 12288}, 1_170_340_608),
    }
    for preset, (fields, count) in releases.items():
        values = {"architecture/preset": preset, "architecture/vocab_size": 65536, "architecture/block_size": 4096}
        with configuration(values):
            model = configure(Lfm2)
            arch, total = model.architecture, model.parameter_count()
        config = Lfm2Config(
            vocab_size=65536,
            num_hidden_layers=16,
            num_key_value_heads=8,
            full_attn_idxs=[2, 5, 8, 10, 12, 14],
            **fields,
        )
        assert arch.layer_types == tuple(config.layer_types) and arch.tied_embeddings
        with torch.device("meta"):
            reference = AutoModelForCausalLM.from_config(config)
        assert total == sum(p.numel() for p in reference.parameters()) == count, preset
