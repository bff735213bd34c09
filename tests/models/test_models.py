"""GPT and Llama: parity with a numpy reference, the masked loss, FLOPs, dtypes, presets, sharding."""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models import reference
from tests.models.conftest import build, logits_loss_grads, random_params
from tests.tolerances import float32_tolerance
from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.config import Schema, configuration, configure
from theseus.errors import ConfigError
from theseus.model.models import GPT, Llama, OLMo2, Phi3, Qwen3, TransformerLM, cross_entropy
from theseus.model.stack.architecture import Architecture
from theseus.registry import get_registry

B, T = 3, 12


def sizes(arch: Architecture) -> tuple[int, ...]:
    """Layers, heads, key/value heads, head width and model width."""
    return arch.n_layers, arch.attention.n_heads, arch.attention.kv_heads, arch.head_dim, arch.n_embd


def batch(vocab: int = 64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    x = rng.integers(0, vocab, (B, T)).astype(np.int32)
    y = rng.integers(0, vocab, (B, T)).astype(np.int32)
    mask = np.ones((B, T), bool)
    mask[1, 9:] = False  # right padding
    mask[2, :4] = False  # left padding
    y[0, 0] = -1
    y[0, 5] = -1
    return x, y, mask


def reference_logits(model: TransformerLM, params: dict, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    p64 = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
    arch = model.architecture
    if isinstance(model, Llama):
        return reference.llama_logits(
            p64, x, mask, n_heads=arch.attention.n_heads, n_kv=arch.attention.kv_heads, theta=arch.position.theta
        )
    return reference.gpt_logits(p64, x, mask, n_heads=arch.attention.n_heads)


@pytest.mark.parametrize("scan", [True, False], ids=["stacked", "per-layer"])
def test_parity_with_numpy_reference(family: type[TransformerLM], scan: bool) -> None:
    model = build(family, model__scan_layers=scan)
    x, y, mask = batch()
    params = random_params(model)
    logits, loss = jax.jit(lambda p: model.apply({"params": p}, x, y, padding_mask=mask, deterministic=True))(params)
    assert logits.dtype == jnp.float32 and logits.shape == (B, T, 64)
    expected = reference_logits(model, params, x, mask)
    real = mask  # padded positions' outputs are unspecified
    error = float(np.max(np.abs(np.asarray(logits)[real] - expected[real])))
    assert float(np.std(expected[real])) > 0.5  # weights spread enough for the comparison to mean something
    # float32 against float64: a few float32 roundings per layer, relative to the logits' scale
    # (measured 0.9-1.8e-6 of it, depending on XLA's optimisation level and the layer layout)
    scale = float(np.max(np.abs(expected[real])))
    assert error <= 4e-6 * scale, f"max abs logit difference {error:.2e} at logit scale {scale:.2f}"
    assert loss.dtype == jnp.float32
    assert float(loss) == pytest.approx(reference.masked_cross_entropy(expected, y, mask), rel=1e-5)


def test_cross_entropy_masks_ignored_targets_and_padding() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 2, (2, 5, 7)).astype(np.float32)
    y = rng.integers(0, 7, (2, 5)).astype(np.int32)
    y[0, 1] = -1
    mask = np.ones((2, 5), bool)
    mask[1, 3:] = False
    full = np.ones((2, 5), bool)
    rel = float32_tolerance(logits.shape[-1] + y.size)  # the log-softmax over the vocabulary, the mean over tokens
    assert float(cross_entropy(logits, y)) == pytest.approx(reference.masked_cross_entropy(logits, y, full), rel=rel)
    masked = float(cross_entropy(logits, y, mask))
    assert masked == pytest.approx(reference.masked_cross_entropy(logits, y, mask), rel=rel)
    y_changed = y.copy()
    y_changed[1, 3:] = (y[1, 3:] + 1) % 7  # targets under padding do not matter
    assert float(cross_entropy(logits, y_changed, mask)) == masked
    assert float(cross_entropy(logits, np.full((2, 5), -1, np.int32))) == 0.0


def test_without_targets_the_loss_is_none(family: type[TransformerLM]) -> None:
    model = build(family)
    x = jnp.zeros((2, 6), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), x)["params"])
    logits, loss = jax.eval_shape(lambda p: model.apply({"params": p}, x, deterministic=True), params)
    assert loss is None and logits.shape == (2, 6, 64) and logits.dtype == jnp.float32


def test_padding_does_not_change_real_tokens(family: type[TransformerLM]) -> None:
    model = build(family)
    x, _, _ = batch()
    params = random_params(model)
    row = x[:1, :8]
    padded_x = np.concatenate([np.full((1, 3), 5, np.int32), row], axis=1)
    padded_mask = np.concatenate([np.zeros((1, 3), bool), np.ones((1, 8), bool)], axis=1)

    @jax.jit
    def both(p: dict) -> tuple[jax.Array, jax.Array]:
        alone = model.apply({"params": p}, row, deterministic=True)[0]
        left = model.apply({"params": p}, padded_x, padding_mask=padded_mask, deterministic=True)[0]
        return alone, left

    alone, left = both(params)
    np.testing.assert_allclose(np.asarray(left)[:, 3:], np.asarray(alone), atol=2e-5)


def analytic_flops(n_layers: int, width: int, d_ff: int, vocab: int, seq: int, kv_width: int, gated: bool) -> int:
    per_layer = 2 * width * width + 2 * width * kv_width + (3 if gated else 2) * width * d_ff
    return 6 * seq * (n_layers * per_layer + width * vocab) + 12 * n_layers * width * seq * seq


def test_flops_formula_and_xla_cost_analysis() -> None:
    # unrolled: XLA's cost analysis counts the body of a scan over layers once
    model = build(
        GPT,
        architecture__n_embd=128,
        architecture__vocab_size=256,
        architecture__block_size=128,
        model__scan_layers=False,
    )
    seq = 128
    assert model.flops(seq) == analytic_flops(2, 128, 512, 256, seq, 128, gated=False)

    x = jnp.zeros((1, seq), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), x)["params"])

    def train_step(p: dict, x: jax.Array) -> tuple[jax.Array, dict]:
        return jax.value_and_grad(lambda p: model.apply({"params": p}, x, x, deterministic=True)[1])(p)

    cost = jax.jit(train_step).lower(params, x).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    ratio = model.flops(seq) / cost["flops"]
    assert 0.9 <= ratio <= 1.1, f"flops(seq) / XLA = {ratio:.3f}"


def test_llama_flops_count_grouped_heads_and_swiglu() -> None:
    model = build(Llama, architecture__n_embd=64, architecture__d_ff=96)
    arch = model.architecture
    assert (arch.attention.kv_heads, arch.head_dim) == (2, 16)
    assert model.flops(20) == analytic_flops(2, 64, 96, 64, 20, 2 * 16, gated=True)


def test_layer_flops_add_up_to_the_model() -> None:
    model = build(GPT, model__scan_layers=False)
    arch = model.architecture
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    block = model.bind(variables).blocks[0]
    seq = 10
    layers = block.attn.flops(seq) + block.mlp.flops(seq)
    assert block.flops(seq) == layers
    assert model.flops(seq) == arch.n_layers * layers + 6 * seq * arch.n_embd * arch.padded_vocab_size


def test_bf16_activations_with_f32_params_stay_finite(family: type[TransformerLM]) -> None:
    x, y, mask = batch()
    model = build(family, model__activation_dtype="bfloat16", architecture__n_layers=1)  # bf16 compiles slowly on CPU
    params = random_params(model, std=0.1)
    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x))
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree.leaves(shapes))

    def loss_fn(p: dict) -> tuple[jax.Array, jax.Array]:
        logits, loss = model.apply({"params": p}, x, y, padding_mask=mask, deterministic=True)
        return loss, logits

    (loss, logits), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params)
    assert logits.dtype == jnp.float32 and loss.dtype == jnp.float32
    assert np.isfinite(float(loss)) and bool(jnp.all(jnp.isfinite(logits)))
    assert all(bool(jnp.all(jnp.isfinite(g))) and g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    exact = reference.masked_cross_entropy(reference_logits(model, params, x, mask), y, mask)
    assert float(loss) == pytest.approx(exact, rel=0.05)


def test_dropout_needs_rng_only_when_training() -> None:
    model = build(GPT, architecture__dropout=0.2)
    plain = build(GPT)
    x, _, _ = batch()
    params = random_params(model, std=0.1)

    @jax.jit
    def run(p: dict) -> tuple[jax.Array, ...]:
        eval_a = model.apply({"params": p}, x, deterministic=True)[0]
        eval_b = plain.apply({"params": p}, x)[0]  # no dropout: no rng needed even when training
        train_a = model.apply({"params": p}, x, rngs={"dropout": jax.random.key(1)})[0]
        train_b = model.apply({"params": p}, x, rngs={"dropout": jax.random.key(2)})[0]
        return eval_a, eval_b, train_a, train_b

    eval_a, eval_b, train_a, train_b = run(params)
    np.testing.assert_array_equal(eval_a, eval_b)
    assert not np.allclose(train_a, train_b) and not np.allclose(train_a, eval_a)


def count(cls: type[TransformerLM], **values: object) -> int:
    with configuration(values):
        return configure(cls).parameter_count()


def test_preset_parameter_counts() -> None:
    assert (
        count(
            GPT,
            **{
                "architecture/preset": "gpt2-124m",
                "architecture/vocab_size": 50257,
                "architecture/vocab_multiple": 1,
                "architecture/block_size": 1024,
            },
        )
        == 124_439_808
    )
    padded = count(
        GPT, **{"architecture/preset": "gpt2-124m", "architecture/vocab_size": 50257, "architecture/block_size": 1024}
    )
    assert padded == 124_439_808 + (50304 - 50257) * 768  # nanoGPT's padded vocabulary
    tiny = count(GPT)
    assert 0.8e6 <= tiny <= 1.2e6, tiny
    llama_tiny = count(Llama)
    assert 0.7e6 <= llama_tiny <= 1.2e6, llama_tiny
    llama_124m = count(Llama, **{"architecture/preset": "llama-124m", "architecture/vocab_size": 32000})
    assert 120e6 <= llama_124m <= 130e6, llama_124m


def test_the_qwen3_preset_has_the_published_shape_and_count() -> None:
    """qwen3-0.6b against transformers' Qwen3 built from Qwen3-0.6B's config.json fields (on the meta
    device: shapes only): the same 596.0M parameters (440.5M without the embedding, as published)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    values = {"architecture/preset": "qwen3-0.6b", "architecture/vocab_size": 151936}
    with configuration(values):
        arch = configure(Qwen3).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff) == (
        28, 16, 8, 128, 1024, 3072
    )  # fmt: skip
    assert arch.tied_embeddings and arch.attention.qk_norm
    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(Qwen3, **values) == expected == 596_049_920
    assert expected - 151936 * 1024 == 440_467_456


def test_the_olmo2_preset_has_the_published_shape_and_count() -> None:
    """olmo2-1b against transformers' OLMo 2 built from OLMo-2-0425-1B's config.json fields (meta device)."""
    import torch
    from transformers import AutoModelForCausalLM, Olmo2Config

    values = {"architecture/preset": "olmo2-1b", "architecture/vocab_size": 100352}
    with configuration(values):
        arch = configure(OLMo2).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff) == (
        16, 16, 16, 128, 2048, 8192
    )  # fmt: skip
    assert not arch.tied_embeddings and (arch.attention.qk_norm_span, arch.norm.placement) == ("projection", "post")
    config = Olmo2Config(
        vocab_size=100352,
        hidden_size=2048,
        intermediate_size=8192,
        num_hidden_layers=16,
        num_attention_heads=16,
        num_key_value_heads=16,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(OLMo2, **values) == expected == 1_484_916_736


def test_the_olmo3_preset_has_the_published_shape_and_count() -> None:
    """olmo3-7b against transformers' OLMo 3 built from Olmo-3-1025-7B's config.json fields (meta device)."""
    import torch
    from transformers import AutoModelForCausalLM, Olmo3Config

    from theseus.model.models.olmo3.model import OLMo3

    values = {"architecture/preset": "olmo3-7b", "architecture/vocab_size": 100352, "architecture/block_size": 8192}
    with configuration(values):
        arch = configure(OLMo3).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff) == (
        32, 32, 32, 128, 4096, 11008
    )  # fmt: skip
    assert arch.layer_types == ("sliding_attention",) * 3 + ("full_attention",) + arch.layer_types[:28]
    assert (arch.attention.sliding_window, arch.layer_types[3], arch.layer_types[-1]) == (
        4096,
        "full_attention",
        "full_attention",
    )
    config = Olmo3Config(
        vocab_size=100352,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        tie_word_embeddings=False,
    )
    assert tuple(config.layer_types) == arch.layer_types  # transformers' default pattern
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(OLMo3, **values) == expected == 7_298_617_344


def test_the_olmo_hybrid_preset_has_the_published_shape_and_count() -> None:
    """olmo-hybrid-7b against transformers' OLMo Hybrid built from its configuration's defaults (meta device)."""
    import torch
    from transformers import AutoModelForCausalLM, OlmoHybridConfig

    from theseus.model.models.olmo_hybrid.model import OLMoHybrid

    values = {"architecture/preset": "olmo-hybrid-7b", "architecture/vocab_size": 100352}
    with configuration(values):
        arch = configure(OLMoHybrid).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff, arch.position.kind) == (32, 30, 30, 128, 3840, 11008, "none")
    config = OlmoHybridConfig()
    assert tuple(config.layer_types) == arch.layer_types  # every 4th layer full attention
    assert (arch.linear_key_heads, arch.linear_value_heads, arch.linear_key_dim, arch.linear_value_dim) == (
        config.linear_num_key_heads,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(OLMoHybrid, **values) == expected == 7_430_870_688


def test_the_kimi_linear_preset_has_the_published_shape_and_count() -> None:
    """kimi-linear-48b-a3b against transformers' Kimi Linear built from its configuration's defaults and the
    release's layer placement (linear_attn_config, counted from 1; meta device); the routers' balancing biases
    count as parameters (transformers keeps them as buffers)."""
    import torch
    from transformers import AutoModelForCausalLM, KimiLinearConfig

    from theseus.model.models.kimi_linear.model import KimiLinear

    values = {"architecture/preset": "kimi-linear-48b-a3b", "architecture/vocab_size": 163840}
    with configuration(values):
        arch = configure(KimiLinear).architecture
    full = [4, 8, 12, 16, 20, 24, 27]
    placement = {"full_attn_layers": full, "kda_layers": [i for i in range(1, 28) if i not in full]}
    config = KimiLinearConfig(linear_attn_config=placement)
    assert tuple(config.layer_types) == arch.layer_types and arch.position.kind == "none"
    assert (arch.n_layers, arch.n_embd, arch.linear_heads, arch.linear_head_dim, arch.conv_kernel) == (
        config.num_hidden_layers,
        config.hidden_size,
        config.linear_num_heads,
        config.linear_head_dim,
        config.linear_conv_kernel_dim,
    )
    moe = arch.moe
    assert moe is not None and (moe.n_experts, moe.top_k, moe.expert_hidden, moe.first_k_dense) == (256, 8, 1024, 1)
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    biases = sum(b.numel() for n, b in reference.named_buffers() if n.endswith("e_score_correction_bias"))
    expected = sum(p.numel() for p in reference.parameters()) + biases
    assert count(KimiLinear, **values) == expected == 49_122_681_728


#: Gemma presets and the config.json fields of the releases they copy (google/gemma-2-2b, google/gemma-3-1b-pt).
GEMMA_RELEASES = {
    "gemma2-2b": (
        "gemma2",
        {"vocab_size": 256000, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26}
        | {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256},
    ),
    "gemma3-1b": (
        "gemma3_text",
        {"vocab_size": 262144, "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26}
        | {"num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "sliding_window": 512},
    ),
}


@pytest.mark.parametrize("preset", list(GEMMA_RELEASES))
def test_the_gemma_presets_have_the_published_shapes_and_counts(preset: str) -> None:
    """Each Gemma preset against transformers' model of the release's config.json fields (meta device):
    the same shape, the same parameter count, and that count in the preset's description."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from theseus.model.models import Gemma2, Gemma3

    model_type, fields = GEMMA_RELEASES[preset]
    cls = Gemma2 if model_type == "gemma2" else Gemma3
    values = {"architecture/preset": preset, "architecture/vocab_size": fields["vocab_size"]}
    with configuration({**values, "architecture/block_size": 8192}):  # the releases' context: the whole window
        arch = configure(cls).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff) == (
        fields["num_hidden_layers"], fields["num_attention_heads"], fields["num_key_value_heads"],
        fields["head_dim"], fields["hidden_size"], fields["intermediate_size"],
    )  # fmt: skip
    assert arch.tied_embeddings and (arch.feed_forward.activation, arch.norm.placement) == ("geglu", "sandwich")
    assert arch.attention.qk_norm == (cls is Gemma3) and arch.norm.zero_centred and arch.scale_embeddings
    config = AutoConfig.for_model(model_type, **fields)
    assert list(arch.layer_types) == config.layer_types  # every 2nd (Gemma 2) / 6th (Gemma 3) layer full
    assert arch.attention.sliding_window == config.sliding_window
    with configuration(values):  # a block shorter than the family's window: the window is the block
        assert configure(cls).architecture.attention.sliding_window == 256
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(cls, **values) == expected
    published = f"{expected / 1e9:.3f}B" if expected >= 1e9 else f"{expected / 1e6:.1f}M"
    assert f" {published} parameters" in cls.PRESETS[preset].description, (published, expected)
    tiny = count(cls)  # the tiny preset's description too, at the default vocabulary
    assert cls.PRESETS["tiny"].description.startswith(f"~{tiny / 1e6:.2f}M parameters at vocab 257"), tiny


def test_bad_gemma_layer_types_are_one_line_config_errors() -> None:
    from theseus.model.models import Gemma3

    for layer_types, message in (
        (["sliding_attention"] * 3, r"must list 6 entries \(one per layer\)"),
        (["sliding_attention"] * 5 + ["global"], "each 'sliding_attention' or 'full_attention'"),
    ):
        with (
            configuration({"architecture/layer_types": layer_types}),
            pytest.raises(ConfigError, match=message) as info,
        ):
            configure(Gemma3).flops(8)
        assert "\n" not in str(info.value) and "architecture/layer_types=" in str(info.value)


def test_repeating_gemma_layer_types_scan_whole_periods_like_unrolled_layers() -> None:
    """Gemma's ``layer_types`` repeat (every 2nd / 6th layer full: the releases scan in periods of 2 / 6);
    5 layers of period 2 scan 2 periods and run the last layer unrolled, with remat: the same logits, loss
    and gradients as unrolled layers, and parameters stacked per layer with the ``layers`` axis as ever.
    Types that do not repeat twice scan a layer per step."""
    from theseus.checkpoint.layers import stacked
    from theseus.model.models import Gemma2, Gemma3

    for cls, preset, period in ((Gemma2, "gemma2-2b", 2), (Gemma3, "gemma3-1b", 6)):
        with configuration({"architecture/preset": preset}):
            assert configure(cls).scan_period == period
    types = ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"]
    values: dict[str, object] = {"architecture__n_layers": 5, "architecture__n_kv_heads": 2}
    values |= {"architecture__sliding_window": 3, "architecture__layer_types": types}
    values["architecture__rope_local_theta"] = 100.0
    unrolled = build(Gemma3, model__scan_layers=False, **values)
    scanned = build(Gemma3, model__scan_layers=True, model__remat="full", **values)
    short = build(Gemma3, **{**values, "architecture__n_layers": 3, "architecture__layer_types": types[:3]})
    assert (scanned.scan_period, short.scan_period) == (2, None)
    boxed = jax.eval_shape(lambda: scanned.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32)))["params"]
    query = boxed["blocks"]["attn"]["query"]
    assert (query.value.shape, query.names) == ((5, 32, 4, 32), (Axis.LAYERS, Axis.EMBED, Axis.HEADS, Axis.HEAD_DIM))
    params = random_params(unrolled, std=0.1)
    x, y, mask = batch()

    logits_a, loss_a, grads_a = logits_loss_grads(unrolled, params, x, y, mask)
    logits_b, loss_b, grads_b = logits_loss_grads(scanned, stacked(params, ["blocks"]), x, y, mask)
    # two compiled programs of five layers (float32 sums in another order): within a few 1e-5
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=5e-5, rtol=0)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-5
    for a, b in zip(jax.tree.leaves(stacked(grads_a, ["blocks"])), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=5e-5, rtol=1e-4)


def test_the_phi3_preset_has_the_published_shape_and_count() -> None:
    """phi-3-mini against transformers' Phi-3 built from Phi-3-mini-4k-instruct's config.json fields (meta
    device): the same 3.821B parameters at the unpadded vocabulary, and the count the description prints."""
    import torch
    from transformers import AutoModelForCausalLM, Phi3Config

    from theseus.model.models import PHI3_PRESETS

    values = {"architecture/preset": "phi-3-mini", "architecture/vocab_size": 32064, "architecture/vocab_multiple": 1}
    with configuration(values):
        arch = configure(Phi3).architecture
    assert (*sizes(arch), arch.feed_forward.d_ff) == (
        32, 32, 32, 96, 3072, 8192
    )  # fmt: skip
    assert not arch.tied_embeddings and arch.feed_forward.activation == "swiglu" and arch.norm.kind == "rmsnorm"
    config = Phi3Config(
        vocab_size=32064,
        hidden_size=3072,
        intermediate_size=8192,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        max_position_embeddings=4096,
        sliding_window=2047,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(Phi3, **values) == expected
    assert f"{expected / 1e9:.3f}B parameters at vocab 32064" in PHI3_PRESETS["phi-3-mini"].description
    padded = count(Phi3, **{**values, "architecture/vocab_multiple": 128})  # 32128 rows of embedding and head
    assert padded - expected == 2 * (32128 - 32064) * 3072


def test_explicit_keys_override_the_preset() -> None:
    with configuration({"architecture/preset": "gpt2-124m", "architecture/n_layers": 3}):
        arch = configure(GPT).architecture
    assert (arch.n_layers, arch.attention.n_heads, arch.n_embd, arch.feed_forward.d_ff) == (3, 12, 768, 3072)
    with configuration({"architecture/n_embd": 64}):
        arch = configure(GPT).architecture
    assert (arch.n_layers, arch.n_embd, arch.feed_forward.d_ff) == (4, 64, 256)  # d_ff follows n_embd
    with configuration({"architecture/n_heads": 8}):
        arch = configure(Llama).architecture
    assert (arch.attention.n_heads, arch.attention.kv_heads) == (8, 4)  # the preset's 2:1 query/kv ratio is kept
    with configuration({"architecture/activation": "swiglu", "architecture/d_ff": 100}):
        arch = configure(GPT).architecture
    assert (arch.feed_forward.activation, arch.feed_forward.d_ff, arch.gated) == ("swiglu", 100, True)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"architecture/preset": "huge"}, "unknown architecture/preset 'huge'"),
        ({"architecture/n_embd": 30, "architecture/n_heads": 4}, "not divisible"),
        ({"architecture/n_kv_heads": 3}, "must divide"),
        ({"architecture/activation": "tanh"}, "architecture/activation='tanh' is not accepted"),
        ({"architecture/dropout": 1.5}, "dropout"),
    ],
)
def test_bad_architectures_are_one_line_config_errors(values: dict, message: str) -> None:
    with configuration(values), pytest.raises(ConfigError, match=message) as info:
        configure(GPT).flops(8)
    assert "\n" not in str(info.value)


def test_sequence_longer_than_block_size_is_an_error() -> None:
    model = build(GPT)
    with pytest.raises(ConfigError, match="exceeds architecture/block_size=32"):
        model.init(jax.random.key(0), jnp.zeros((1, 33), jnp.int32))


def test_every_parameter_has_logical_axes_and_the_plan_covers_them(family: type[TransformerLM]) -> None:
    model = build(family, model__scan_layers=True)
    variables = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32)))
    boxed = jax.tree.leaves(variables["params"], is_leaf=lambda v: isinstance(v, nn.LogicallyPartitioned))
    assert boxed and all(isinstance(v, nn.LogicallyPartitioned) for v in boxed)
    known = {v for k, v in vars(Axis).items() if k.isupper()}
    for leaf in boxed:
        assert len(leaf.names) == leaf.value.ndim and set(leaf.names) <= known, leaf.names
    plan = model.sharding
    assert plan == ShardingPlan(embed="data", mlp="model", heads="model", kv_heads="model", vocab="model", layers=None)
    specs = nn.logical_to_mesh(nn.get_partition_spec(variables["params"]), plan.rules())
    embedding = specs["token_embedding"]["embedding"]
    assert tuple(embedding) == (MeshAxis.MODEL, MeshAxis.DATA)
    up = specs["blocks"]["mlp"]["up"]["kernel"]  # [layers, embed, mlp]: the stacked layer axis is never sharded
    assert tuple(up) == (None, MeshAxis.DATA, MeshAxis.MODEL)
    fsdp = nn.logical_to_mesh(nn.get_partition_spec(variables["params"]), plan.restricted(["data"]).rules())
    assert tuple(fsdp["blocks"]["mlp"]["up"]["kernel"]) == (None, MeshAxis.DATA, None)


def test_models_and_layers_are_registered_components() -> None:
    registry = get_registry()
    assert registry.load_component("model", "gpt") is GPT
    assert registry.load_component("model", "llama") is Llama
    from theseus.model import layers

    for name, cls in [
        ("mlp", layers.MLP),
        ("attention", layers.CausalSelfAttention),
        ("rotary", layers.RotaryEmbedding),
        ("layernorm", layers.LayerNorm),
        ("rmsnorm", layers.RMSNorm),
        ("token_embedding", layers.TokenEmbedding),
        ("position_embedding", layers.PositionEmbedding),
    ]:
        assert registry.load_component("layer", name) is cls


def test_model_schema_holds_every_key_it_honours() -> None:
    keys = set(Schema.build(Llama.gather()).keys())
    for key in (
        "preset",
        "vocab_size",
        "block_size",
        "n_layers",
        "n_heads",
        "n_kv_heads",
        "n_embd",
        "d_ff",
        "rope_theta",
    ):
        assert f"architecture/{key}" in keys
    assert "architecture/rope_theta" not in set(Schema.build(GPT.gather()).keys())
    assert math.isclose(Schema.build(GPT.gather())["architecture/norm_eps"].default, 1e-5)


def test_the_gpt_oss_preset_has_the_published_shape_and_count() -> None:
    """gpt-oss-20b against transformers' GPT-OSS built from gpt-oss-20b's config.json fields (meta device):
    every bias, sink and expert tensor counted, 20.9B in all."""
    import torch
    from transformers import AutoModelForCausalLM, GptOssConfig

    from theseus.model.models.gpt_oss.model import GptOss

    values = {"architecture/preset": "gpt-oss-20b", "architecture/vocab_size": 201088, "architecture/block_size": 4096}
    with configuration(values):
        arch = configure(GptOss).architecture
    assert arch.moe is not None
    assert (*sizes(arch), arch.moe.expert_hidden) == (
        24, 64, 8, 64, 2880, 2880
    )  # fmt: skip
    assert (
        arch.moe.n_experts,
        arch.moe.top_k,
        arch.attention.sliding_window,
        arch.attention.qkv_bias,
        arch.attention.has_out_bias,
    ) == (
        32,
        4,
        128,
        True,
        True,
    )
    config = GptOssConfig(
        vocab_size=201088,
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=24,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=64,
        num_local_experts=32,
        num_experts_per_tok=4,
    )
    assert tuple(config.layer_types) == arch.layer_types  # transformers' default pattern: sliding first
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert count(GptOss, **values) == expected == 20_914_757_184


def test_the_llama4_scout_preset_has_the_published_shape_and_count() -> None:
    """llama4-scout against transformers' Llama 4 text model built from Scout's config fields (meta device):
    107.8B parameters (the release's 109B includes the vision encoder), 17.2B active per token; every
    layer a mixture, so the layers scan, one period of three chunked RoPE layers and a NoPE one a step."""
    import torch
    from transformers import AutoModelForCausalLM, Llama4TextConfig

    from theseus.model.models.llama4.model import Llama4

    values = {
        "architecture/preset": "llama4-scout",
        "architecture/vocab_size": 202048,
        "architecture/vocab_multiple": 1,
        "architecture/block_size": 8192,
    }
    with configuration(values):
        model = configure(Llama4)
        arch, total, inactive = model.architecture, model.parameter_count(), model.inactive_parameter_count()
        scans, period = model.scans_layers, model.scan_period
    assert arch.moe is not None and (arch.n_layers, arch.attention.n_heads, arch.attention.kv_heads, arch.head_dim) == (
        48,
        40,
        8,
        128,
    )
    assert (arch.n_embd, arch.moe.n_experts, arch.moe.top_k, arch.moe.expert_hidden, arch.moe.n_shared) == (
        5120, 16, 1, 8192, 1
    )  # fmt: skip
    assert (scans, period) == (True, 4)
    config = Llama4TextConfig(
        vocab_size=202048,
        hidden_size=5120,
        intermediate_size=8192,
        intermediate_size_mlp=16384,
        num_hidden_layers=48,
        num_attention_heads=40,
        num_key_value_heads=8,
        head_dim=128,
        num_local_experts=16,
        num_experts_per_tok=1,
        interleave_moe_layer_step=1,
    )
    assert arch.layer_types == tuple(config.layer_types)  # chunked_attention on the RoPE layers
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert total == expected == 107_769_861_120
    assert total - inactive == 17_172_894_720


def test_llama4_interleaved_dense_and_mixture_layers_scan_one_unit_per_step() -> None:
    """Dense and mixture layers under three chunked RoPE layers and a NoPE one: eight layers repeat a unit
    of four, one per scan step, each position held apart; four layers do not repeat and refuse a scan in
    one line."""
    from theseus.checkpoint.layers import LayerRun
    from theseus.model.models.llama4.model import Llama4

    with configuration({"architecture/preset": "tiny", "architecture/n_layers": 8}):
        model = configure(Llama4)
        assert model.architecture.mixture_layers == (1, 3, 5, 7)  # type: ignore[attr-defined]
        assert model.scans_layers and model.scan_period == 4  # scanned by default from 8 layers on
        assert model.stacked_layers == (LayerRun("blocks", "blocks", 0, 8, 4),)
    with configuration({"architecture/preset": "tiny", "model/scan_layers": True}):
        model = configure(Llama4)
        assert model.architecture.mixture_layers == (1, 3)  # type: ignore[attr-defined]
        with pytest.raises(ConfigError, match="set model/scan_layers=false") as info:
            _ = model.stacked_layers
        assert "\n" not in str(info.value)


def test_the_smollm3_preset_has_the_published_shape_and_count() -> None:
    """smollm3-3b against transformers' SmolLM3 built from the release's config fields (meta device):
    3.075B parameters, every 4th layer NoPE."""
    import torch
    from transformers import AutoModelForCausalLM, SmolLM3Config

    from theseus.model.models.smollm3.model import SmolLM3

    values = {
        "architecture/preset": "smollm3-3b",
        "architecture/vocab_size": 128256,
        "architecture/vocab_multiple": 1,
        "architecture/block_size": 4096,
    }
    with configuration(values):
        model = configure(SmolLM3)
        arch, total = model.architecture, model.parameter_count()
    config = SmolLM3Config(
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    assert arch.rope_layers == tuple(bool(flag) for flag in config.no_rope_layers)  # every 4th layer NoPE
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    assert total == sum(p.numel() for p in reference.parameters()) == 3_075_098_624


def test_the_glm4_moe_preset_has_the_published_shape_and_count() -> None:
    """glm-4.5-air against transformers' GLM-4.5 built from the release's config fields (meta device; the
    router's selection bias is a buffer there, a parameter here): 106.9B parameters, 13.4B active."""
    import torch
    from transformers import AutoModelForCausalLM, Glm4MoeConfig

    from theseus.model.models.glm4_moe.model import Glm4Moe

    values = {
        "architecture/preset": "glm-4.5-air",
        "architecture/vocab_size": 151552,
        "architecture/vocab_multiple": 1,
        "architecture/block_size": 4096,
    }
    with configuration(values):
        model = configure(Glm4Moe)
        arch, total, inactive = model.architecture, model.parameter_count(), model.inactive_parameter_count()
    assert (arch.attention.qkv_bias, arch.attention.has_out_bias, arch.attention.qk_norm) == (True, False, False)
    config = Glm4MoeConfig(  # zai-org/GLM-4.5-Air's config.json
        vocab_size=151552,
        hidden_size=4096,
        intermediate_size=10944,
        num_hidden_layers=46,
        num_attention_heads=96,
        num_key_value_heads=8,
        head_dim=128,
        attention_bias=True,
        n_routed_experts=128,
        num_experts_per_tok=8,
        moe_intermediate_size=1408,
        n_shared_experts=1,
        first_k_dense_replace=1,
        use_qk_norm=False,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    biases = sum(b.numel() for name, b in reference.named_buffers() if name.endswith("e_score_correction_bias"))
    assert total == sum(p.numel() for p in reference.parameters()) + biases == 106_852_251_264
    assert total - inactive == 13_424_129_664


def test_the_qwen3_next_preset_has_the_published_shape_and_count() -> None:
    """qwen3-next-80b-a3b against transformers' Qwen3-Next built from the release's config fields (meta
    device): 79.7B parameters, 3.9B active per token (3.3B without the embedding and the head)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3NextConfig

    from theseus.model.models.qwen3_next.model import Qwen3Next

    values = {
        "architecture/preset": "qwen3-next-80b-a3b",
        "architecture/vocab_size": 151936,
        "architecture/vocab_multiple": 1,
        "architecture/block_size": 4096,
    }
    with configuration(values):
        model = configure(Qwen3Next)
        arch, total, inactive = model.architecture, model.parameter_count(), model.inactive_parameter_count()
    config = Qwen3NextConfig(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5120,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        num_experts=512,
        num_experts_per_tok=10,
        moe_intermediate_size=512,
        shared_expert_intermediate_size=512,
    )
    assert arch.layer_types == tuple(config.layer_types)  # every 4th layer full attention
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    expected = sum(p.numel() for p in reference.parameters())
    assert total == expected == 79_674_391_296
    assert total - inactive == 3_874_929_408


#: Qwen3.5's presets: the language models of the releases' config.json (text_config), transformers' count of
#: the same fields on the meta device, and the parameters a token passes through.
QWEN3_5_RELEASES = {
    "qwen3.5-9b": (
        {"intermediate_size": 12288, "hidden_size": 4096, "num_hidden_layers": 32, "num_key_value_heads": 4},
        8_953_803_264,
        8_953_803_264,
    ),
    "qwen3.5-35b-a3b": (
        {"hidden_size": 2048, "num_hidden_layers": 40, "num_key_value_heads": 2}
        | {"num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512}
        | {"shared_expert_intermediate_size": 512},
        34_660_610_688,
        3_454_988_928,
    ),
}


@pytest.mark.parametrize("preset", list(QWEN3_5_RELEASES))
def test_the_qwen3_5_presets_have_the_published_shape_and_count(preset: str) -> None:
    """qwen3.5-9b (dense) and qwen3.5-35b-a3b (every layer a mixture) against transformers' Qwen3.5 text
    models built from the releases' config fields (meta device); the releases' vision encoders and
    multi-token-prediction layers are not part of either."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

    from theseus.model.models.qwen3_5.model import Qwen35, Qwen35MoE

    fields, expected, active = QWEN3_5_RELEASES[preset]
    moe = "num_experts" in fields
    values = {"architecture/preset": preset, "architecture/vocab_size": 248320, "architecture/vocab_multiple": 1}
    with configuration({**values, "architecture/block_size": 4096}):
        model = configure(Qwen35MoE if moe else Qwen35)
        arch, total = model.architecture, model.parameter_count()
        passed = total - (model.inactive_parameter_count() if moe else 0)
    linear = {"linear_num_key_heads": 16, "linear_num_value_heads": 32}
    linear |= {"linear_key_head_dim": 128, "linear_value_head_dim": 128}
    config = (Qwen3_5MoeTextConfig if moe else Qwen3_5TextConfig)(
        vocab_size=248320, num_attention_heads=16, head_dim=256, tie_word_embeddings=False, **linear, **fields
    )
    assert arch.layer_types == tuple(config.layer_types)  # every 4th layer full attention
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    assert total == sum(p.numel() for p in reference.parameters()) == expected
    assert passed == active


def test_the_minimax_m2_preset_has_the_published_shape_and_count() -> None:
    """minimax-m2 against transformers' MiniMax-M2 built from the release's config fields (meta device):
    228.7B parameters, 11.0B active per token; the router's balancing bias is a buffer there, a parameter
    here."""
    import torch
    from transformers import AutoModelForCausalLM, MiniMaxM2Config

    from theseus.model.models.minimax_m2.model import MiniMaxM2

    values = {
        "architecture/preset": "minimax-m2",
        "architecture/vocab_size": 200064,
        "architecture/vocab_multiple": 1,
        "architecture/block_size": 4096,
    }
    with configuration(values):
        model = configure(MiniMaxM2)
        arch, total, inactive = model.architecture, model.parameter_count(), model.inactive_parameter_count()
    assert (arch.attention.qk_norm_span, arch.moe is not None and arch.moe.router) == ("projection", "sigmoid")
    config = MiniMaxM2Config(  # MiniMaxAI/MiniMax-M2's config.json
        vocab_size=200064,
        hidden_size=3072,
        intermediate_size=1536,
        num_hidden_layers=62,
        num_attention_heads=48,
        num_key_value_heads=8,
        head_dim=128,
        rotary_dim=64,
        num_local_experts=256,
        num_experts_per_tok=8,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    biases = sum(b.numel() for name, b in reference.named_buffers() if name.endswith("e_score_correction_bias"))
    expected = sum(p.numel() for p in reference.parameters()) + biases
    assert total == expected == 228_689_764_864
    assert total - inactive == 11_030_553_088


def test_qwen3_next_scans_its_layers_as_runs_or_units() -> None:
    """Three linear-attention layers then a full one scan as two runs; eight layers repeat a unit of four,
    one per scan step; leading dense layers that break the period refuse a scan in one line."""
    from theseus.checkpoint.layers import LayerRun
    from theseus.model.models.qwen3_next.model import Qwen3Next

    with configuration({"architecture/preset": "tiny", "model/scan_layers": True}):
        model = configure(Qwen3Next)
        assert model.stacked_layers == (LayerRun("linear_blocks", "blocks", 0, 3), LayerRun("blocks", "blocks", 3, 1))
    with configuration({"architecture/preset": "tiny", "architecture/n_layers": 8}):
        model = configure(Qwen3Next)
        assert model.scans_layers and model.scan_period == 4  # scanned by default from 8 layers on
        assert model.stacked_layers == (LayerRun("blocks", "blocks", 0, 8, 4),)
    values = {"architecture/preset": "tiny", "architecture/n_layers": 8, "architecture/moe/first_k_dense": 2}
    with configuration(values):
        assert not configure(Qwen3Next).scans_layers
    with configuration({**values, "model/scan_layers": True}):
        with pytest.raises(ConfigError, match="set model/scan_layers=false") as info:
            _ = configure(Qwen3Next).stacked_layers
        assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("preset", "vocab", "total"),
    [("deepseek-v3.2", 129280, 671_877_944_064), ("glm-5", 154880, 743_911_218_432)],
)
def test_the_sparse_attention_presets_have_the_published_shapes_and_counts(preset: str, vocab: int, total: int) -> None:
    """deepseek-v3.2 and glm-5 against transformers' DeepSeek-V3.2 and GLM-5 built from their configs'
    defaults (the releases' shapes; meta device): every layer's lightning indexer included. The routers'
    balancing biases count as parameters (transformers keeps them as buffers)."""
    import torch
    from transformers import AutoModelForCausalLM, DeepseekV32Config, GlmMoeDsaConfig

    from theseus.model.models import DeepseekV32, GlmMoeDsa

    cls, config = (DeepseekV32, DeepseekV32Config()) if preset == "deepseek-v3.2" else (GlmMoeDsa, GlmMoeDsaConfig())
    values = {"architecture/preset": preset, "architecture/vocab_size": vocab, "architecture/vocab_multiple": 1}
    with configuration(values):
        model = configure(cls)
        arch, count = model.architecture, model.parameter_count()
    assert (arch.dsa.index_n_heads, arch.dsa.index_head_dim, arch.dsa.index_topk) == (
        config.index_n_heads,
        config.index_head_dim,
        config.index_topk,
    )
    with torch.device("meta"):
        reference = AutoModelForCausalLM.from_config(config)
    biases = sum(b.numel() for n, b in reference.named_buffers() if n.endswith("e_score_correction_bias"))
    assert count == sum(p.numel() for p in reference.parameters()) + biases == total
