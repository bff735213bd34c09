"""The Mamba-2 mixer (``layers/mamba2.py``): transformers' Nemotron-H mixer on the same weights (its PyTorch
path: chunked scan, grouped B and C, gated group norm), the chunked scan against the plain recurrence,
cached decoding from its state, left padding and packed examples; the Nemotron-H presets' published counts."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import decoded_after_left_padding, jitted
from theseus.config import configuration, configure
from theseus.model.layers.mamba2 import Mamba2, ssd

WIDTH, HEADS, HEAD_DIM, STATE, GROUPS, TAPS, CHUNK = 24, 4, 6, 8, 2, 4, 4


def layer_and_params(**fields: object) -> tuple[Mamba2, dict]:
    layer = Mamba2(
        n_heads=HEADS,
        head_dim=HEAD_DIM,
        state_size=STATE,
        n_groups=GROUPS,
        conv_kernel=TAPS,
        chunk_size=CHUNK,
        **fields,  # type: ignore[arg-type]
    )
    params = nn.unbox(jitted(layer.init, jax.random.key(1), jnp.zeros((1, 4, WIDTH)))["params"])
    rng = np.random.default_rng(0)

    def spread(path: tuple, p: jax.Array) -> jax.Array:
        name = path[-1].key
        if name == "A_log":  # decays of a few tenths to a few per step
            return jnp.asarray(rng.uniform(-1.0, 1.0, size=p.shape), jnp.float32)
        scale = 0.5 if name in ("dt_bias", "D", "norm", "conv1d_bias") else 0.3
        centre = 1.0 if name == "norm" else 0.0
        return jnp.asarray(centre + scale * rng.normal(size=p.shape), jnp.float32)

    return layer, jax.tree_util.tree_map_with_path(spread, params)


def test_the_mixer_computes_transformers_nemotron_h_mixer() -> None:
    """NemotronHMamba2Mixer (PyTorch path) on the same weights, a length no chunk divides."""
    import torch
    from transformers import NemotronHConfig
    from transformers.models.nemotron_h.modeling_nemotron_h import NemotronHMamba2Mixer

    layer, params = layer_and_params()
    config = NemotronHConfig(
        hidden_size=WIDTH,
        mamba_num_heads=HEADS,
        mamba_head_dim=HEAD_DIM,
        ssm_state_size=STATE,
        n_groups=GROUPS,
        conv_kernel=TAPS,
        chunk_size=CHUNK,
        use_conv_bias=True,
        use_bias=False,
        layer_norm_epsilon=1e-5,
        hybrid_override_pattern="M",
        num_hidden_layers=1,
    )
    theirs = NemotronHMamba2Mixer(config, layer_idx=0).eval()
    ours = jax.tree.map(np.asarray, params)
    state = {
        "in_proj.weight": ours["in_proj"].T,
        "conv1d.weight": ours["conv1d"].T[:, None, :],
        "conv1d.bias": ours["conv1d_bias"],
        "dt_bias": ours["dt_bias"],
        "A_log": ours["A_log"],
        "D": ours["D"],
        "norm.weight": ours["norm"],
        "out_proj.weight": ours["out_proj"].T,
    }
    theirs.load_state_dict({k: torch.tensor(np.ascontiguousarray(v)) for k, v in state.items()})
    x = np.random.default_rng(2).normal(size=(2, 11, WIDTH)).astype(np.float32)
    with torch.no_grad():
        expected = theirs(torch.tensor(x)).numpy()
    got = np.asarray(jitted(layer.apply, {"params": params}, jnp.asarray(x)))
    assert np.max(np.abs(expected)) > 0.1
    # float32, about 11 positions x 8 state entries summed per output, through two projections
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.max(np.abs(expected)), rtol=0)


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_the_chunked_scan_is_the_recurrence(chunk: int) -> None:
    """``ssd`` in chunks of any size equals the scan written one position at a time, resets included."""
    rng = np.random.default_rng(4)
    batch, steps, heads, width, size = 2, 10, 3, 2, 5
    x = jnp.asarray(rng.normal(size=(batch, steps, heads, width)), jnp.float32)
    b, c = (jnp.asarray(rng.normal(size=(batch, steps, heads, size)), jnp.float32) for _ in range(2))
    log_decay = jnp.asarray(-rng.uniform(0.05, 1.5, size=(batch, steps, heads)), jnp.float32)
    log_decay = log_decay.at[1, 6].set(-jnp.inf)  # a new example starts at position 6 of row 1
    start = jnp.asarray(rng.normal(size=(batch, heads, width, size)), jnp.float32)

    state, want = np.asarray(start), []
    for t in range(steps):
        decay = np.exp(np.asarray(log_decay[:, t]))[..., None, None]
        state = decay * state + np.einsum("bhp,bhn->bhpn", np.asarray(x[:, t]), np.asarray(b[:, t]))
        want.append(np.einsum("bhpn,bhn->bhp", state, np.asarray(c[:, t])))
    y, last = ssd(x, log_decay, b, c, chunk, start)
    np.testing.assert_allclose(np.asarray(y), np.stack(want, axis=1), atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(last), state, atol=1e-5, rtol=1e-5)
    grads = jax.grad(lambda s: jnp.sum(ssd(x, log_decay, b, c, chunk, s)[0]))(start)
    assert bool(jnp.all(jnp.isfinite(grads)))  # the reset's -inf leaves no NaN in the backward pass


def test_cached_decoding_continues_the_state_and_left_padding_starts_empty() -> None:
    """A left-padded prompt of 5, then one token at a time, gives the unpadded rows' whole-sequence outputs."""
    layer, params = layer_and_params()
    x = jax.random.normal(jax.random.key(0), (2, 9, WIDTH))
    whole = np.asarray(jitted(layer.apply, {"params": params}, x))
    decoded, cache = decoded_after_left_padding(layer, params, x)
    assert cache["conv"].shape == (2, TAPS - 1, HEADS * HEAD_DIM + 2 * GROUPS * STATE)
    assert cache["ssm"].shape == (2, HEADS, HEAD_DIM, STATE)
    np.testing.assert_allclose(decoded, whole, atol=2e-5 * np.max(np.abs(whole)), rtol=0)


def test_packed_examples_do_not_read_each_other() -> None:
    """Segment ids: two examples packed in one row give each example's own outputs (state and taps reset)."""
    layer, params = layer_and_params()
    x = jax.random.normal(jax.random.key(3), (1, 10, WIDTH))
    segments = jnp.asarray([[1, 1, 1, 1, 2, 2, 2, 2, 2, 0]], jnp.int32)
    packed = np.asarray(jitted(layer.apply, {"params": params}, x, segments))
    first = np.asarray(jitted(layer.apply, {"params": params}, x[:, :4]))
    second = np.asarray(jitted(layer.apply, {"params": params}, x[:, 4:9]))
    scale = np.max(np.abs(packed))
    np.testing.assert_allclose(packed[:, :4], first, atol=2e-5 * scale, rtol=0)
    np.testing.assert_allclose(packed[:, 4:9], second, atol=2e-5 * scale, rtol=0)


def test_lora_adapts_in_proj_and_out_proj_as_their_merged_kernels() -> None:
    """Adapters on ``in_proj`` (target value) and ``out_proj`` (target out) compute what the plain layer computes
    with the kernels ``W + (alpha / rank) A B``; with key alone only ``in_proj`` is adapted."""
    from theseus.model.layers import lora

    adapted, params = layer_and_params(lora_rank=2, lora_alpha=4.0, lora_targets=("value", "out"))
    assert lora.adapter_names(params) == {"in_proj", "out_proj"}
    plain, _ = layer_and_params()
    x = jax.random.normal(jax.random.key(5), (2, 7, WIDTH))
    got = np.asarray(jitted(adapted.apply, {"params": params}, x, deterministic=True))
    merged = np.asarray(jitted(plain.apply, {"params": lora.merge(params, 4.0, 2)}, x))
    base = {k: v for k, v in params.items() if "lora" not in k}
    unadapted = np.asarray(jitted(plain.apply, {"params": base}, x))
    scale = np.max(np.abs(merged))
    np.testing.assert_allclose(got, merged, atol=2e-5 * scale, rtol=0)
    assert np.max(np.abs(got - unadapted)) > 0.1 * scale
    _, key_only = layer_and_params(lora_rank=2, lora_targets=("key",))
    assert lora.adapter_names(key_only) == {"in_proj"}


def test_the_nemotron_h_presets_have_the_published_shapes_and_counts() -> None:
    """nemotron-h-8b and -4b against transformers' Nemotron-H built from the releases' config fields (meta
    device). Ours is counted on one layer of each kind with the preset's shapes (the release pattern's 52
    layers are 24 Mamba-2, 4 attention and 24 MLP ones), so that nothing traces 52 layers."""
    import torch
    from transformers import AutoModelForCausalLM, NemotronHConfig

    from theseus.model.models.nemotron_h.model import RELEASE_PATTERN, NemotronH, pattern_types

    releases = {  # nvidia/Nemotron-H-8B-Base-8K and -4B-Base-8K
        "nemotron-h-8b": ({"hidden_size": 4096, "intermediate_size": 21504, "mamba_num_heads": 128}, 8_100_852_736),
        "nemotron-h-4b": ({"hidden_size": 3072, "intermediate_size": 12288, "mamba_num_heads": 112}, 4_489_223_040),
    }
    kinds = pattern_types(RELEASE_PATTERN)
    for preset, (fields, count) in releases.items():
        values = {
            "architecture/preset": preset,
            "architecture/vocab_size": 131072,
            "architecture/block_size": 8192,
            "architecture/n_layers": 3,
            "architecture/layer_types": ["mamba", "full_attention", "mlp"],
        }
        with configuration(values):
            model = configure(NemotronH)
            shapes = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
        sizes = {
            k: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(v)) for k, v in nn.unbox(shapes["params"]).items()
        }
        per_kind = {kind: sizes.pop(f"blocks_{i}") for i, kind in enumerate(("mamba", "full_attention", "mlp"))}
        total = sum(sizes.values()) + sum(per_kind[kind] for kind in kinds)
        config = NemotronHConfig(
            vocab_size=131072,
            hybrid_override_pattern=RELEASE_PATTERN,
            num_attention_heads=32,
            num_key_value_heads=8,
            head_dim=128,
            mamba_head_dim=64,
            ssm_state_size=128,
            n_groups=8,
            **fields,
        )
        assert [{"linear_attention": "mamba"}.get(t, t) for t in config.layers_block_type] == list(kinds)
        with torch.device("meta"):
            reference = AutoModelForCausalLM.from_config(config)
        assert total == sum(p.numel() for p in reference.parameters()) == count, preset


def test_the_falcon_h1_preset_has_the_published_shape_and_count() -> None:
    """falcon-h1-0.5b against transformers' Falcon-H1 built from the release's config fields (meta device).
    Every layer is alike (attention and Mamba-2 in parallel, then the MLP): ours is counted on one."""
    import torch
    from transformers import AutoModelForCausalLM, FalconH1Config

    from theseus.model.models.falcon_h1.model import FalconH1

    values = {
        "architecture/preset": "falcon-h1-0.5b",
        "architecture/vocab_size": 32784,
        "architecture/vocab_multiple": 1,  # the release's vocabulary, not padded
        "architecture/block_size": 16384,
        "architecture/n_layers": 1,
    }
    with configuration(values):
        model = configure(FalconH1)
        shapes = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
    sizes = {k: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(v)) for k, v in nn.unbox(shapes["params"]).items()}
    total = sum(sizes.values()) + 35 * sizes["blocks_0"]
    config = FalconH1Config(  # tiiuae/Falcon-H1-0.5B-Base
        vocab_size=32784,
        hidden_size=1024,
        intermediate_size=2048,
        num_hidden_layers=36,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        mamba_d_ssm=1536,
        mamba_n_heads=24,
        mamba_d_head=64,
        mamba_n_groups=1,
        mamba_d_state=128,
        mamba_rms_norm=False,
        mamba_norm_before_gate=False,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    assert total == sum(p.numel() for p in reference.parameters())
    assert total == 521_411_104


def test_the_granitemoehybrid_preset_has_transformers_default_shape_and_count() -> None:
    """granitemoehybrid-defaults against transformers' Granite 4 hybrid of its configuration's defaults (meta
    device; the class states no released size). Every layer is alike (Mamba-2, then 8 experts beside the shared
    MLP): ours is counted on one."""
    import torch
    from transformers import AutoModelForCausalLM, GraniteMoeHybridConfig

    from theseus.model.models.granitemoehybrid.model import GraniteMoeHybrid

    values = {
        "architecture/preset": "granitemoehybrid-defaults",
        "architecture/vocab_size": 32000,
        "architecture/block_size": 2048,
        "architecture/n_layers": 1,
        "architecture/layer_types": ["mamba"],
    }
    with configuration(values):
        model = configure(GraniteMoeHybrid)
        shapes = jax.eval_shape(lambda m=model: m.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
    sizes = {k: sum(int(np.prod(x.shape)) for x in jax.tree.leaves(v)) for k, v in nn.unbox(shapes["params"]).items()}
    total = sum(sizes.values()) + 31 * sizes["blocks_0"]
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(GraniteMoeHybridConfig())
    assert total == sum(p.numel() for p in reference.parameters()) == 38_601_064_448
