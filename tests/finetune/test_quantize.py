"""NF4 and int8 kernels (``model/quantize``) against references written from their definitions."""

from __future__ import annotations

from pathlib import Path
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.errors import ConfigError
from theseus.model.layers import quantization
from theseus.training import frozen

#: The NormalFloat4 levels as bitsandbytes publishes them (``create_normal_map``).
PUBLISHED_NF4 = [
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
]


def reference_codebook() -> np.ndarray:
    """The QLoRA paper's NF4: 2^3 + 1 quantiles of N(0, 1) for the positive half and 2^3 for the
    negative half (dropping one of the two zeros), from the outermost quantile ``1 - delta`` with
    ``delta`` the mean of 1/(2 * 15) and 1/(2 * 16), scaled into [-1, 1]."""
    edge = 1 - (1 / 30 + 1 / 32) / 2
    inv = NormalDist().inv_cdf
    pos = [inv(edge + (0.5 - edge) * i / 8) for i in range(8)]
    neg = [-inv(edge + (0.5 - edge) * i / 7) for i in range(7)]
    levels = np.sort(np.array([*pos, *neg, 0.0]))
    return levels / levels.max()


def reference_nf4(x: np.ndarray) -> np.ndarray:
    """Quantize then dequantize ``x`` the paper's way, element by element in float64: blocks of 64,
    nearest level to ``x / absmax``, absmaxes minus their mean quantized to int8 per block of 256."""
    levels = reference_codebook()
    flat = x.astype(np.float64).ravel()
    n_blocks = -(-flat.size // 64)
    blocks = np.zeros(n_blocks * 64)
    blocks[: flat.size] = flat
    blocks = blocks.reshape(n_blocks, 64)
    absmax = np.abs(blocks).max(axis=1)
    index = np.abs(blocks[:, :, None] / absmax[:, None, None] - levels[None, None, :]).argmin(axis=2)
    mean = absmax.mean()
    restored = np.empty_like(absmax)
    for start in range(0, n_blocks, 256):
        part = absmax[start : start + 256] - mean
        scale = np.abs(part).max() / 127
        restored[start : start + 256] = np.round(part / scale) * scale + mean
    return (levels[index] * restored[:, None]).ravel()[: flat.size].reshape(x.shape)


def test_the_nf4_codebook_is_the_published_one() -> None:
    ours = quantization.nf4_codebook()
    assert ours.shape == (16,) and ours[7] == 0.0 and ours[0] == -1.0 and ours[-1] == 1.0
    assert np.max(np.abs(ours - np.array(PUBLISHED_NF4))) <= 1e-6
    assert np.max(np.abs(ours - reference_codebook())) <= 1e-7


@pytest.mark.parametrize("shape", [(4, 40, 128), (3, 40, 7), (130, 130)], ids=["shaped", "ragged", "two-levels"])
def test_nf4_round_trip_equals_the_reference(shape: tuple[int, ...]) -> None:
    x = np.asarray(jax.random.normal(jax.random.key(1), shape) * 0.05)
    q = jax.jit(quantization.nf4_quantize)(jnp.asarray(x))
    ours = np.asarray(jax.jit(quantization.nf4_dequantize, static_argnums=1)(q, shape))
    assert q["codes"].dtype == jnp.uint8 and q["absmax_codes"].dtype == jnp.int8
    if shape[-1] % 64 == 0:  # blocks tile the last dimension: the codes keep the kernel's shape to shard like it
        assert q["codes"].shape == (*shape[:-1], shape[-1] // 2)
        assert q["absmax_codes"].shape == (*shape[:-1], shape[-1] // 64)
    else:
        assert q["codes"].shape == (-(-np.prod(shape) // 64) * 32,)
    assert np.max(np.abs(ours - reference_nf4(x))) <= 1e-6


def test_nf4_stores_about_four_bits_a_weight() -> None:
    per_weight = quantization.bytes_per_parameter("nf4", (4096, 4096))
    assert per_weight * 8 == pytest.approx(4.127, abs=0.01)  # the paper's 4.127 bits
    assert per_weight / 2 <= 0.3  # against bfloat16


def test_int8_is_per_output_channel_within_half_a_step() -> None:
    x = jax.random.normal(jax.random.key(2), (48, 4, 8)) * jnp.linspace(0.01, 1.0, 32).reshape(4, 8)
    q = quantization.int8_quantize(x, n_in=1)
    assert q["codes"].dtype == jnp.int8 and q["scales"].shape == (1, 4, 8)
    step = np.asarray(jnp.max(jnp.abs(x), axis=0) / 127)
    error = np.abs(np.asarray(quantization.int8_dequantize(q)) - np.asarray(x))
    assert np.all(error <= step / 2 + 1e-7)


@pytest.mark.parametrize("method", ["nf4", "int8"])
def test_stacked_layers_quantize_layer_by_layer(method: str) -> None:
    x = jax.random.normal(jax.random.key(3), (3, 16, 4, 8))
    target = jax.eval_shape(lambda: jax.vmap(lambda k: quantization.quantize(k, method, 1))(x))
    stacked = quantization.quantize_like(x, target, method)
    for layer in range(3):
        one = quantization.dequantize(quantization.quantize(x[layer], method, 1), method, x.shape[1:])
        whole = quantization.dequantize_like(stacked, method, x.shape)[layer]
        np.testing.assert_array_equal(np.asarray(whole), np.asarray(one))


def test_quantize_without_lora_is_a_one_line_error() -> None:
    with pytest.raises(ConfigError, match=r"model/quantize=nf4 .* set model/lora/rank>0"):
        quantization.check("nf4", 0)
    assert quantization.check("int8", 4) == "int8"


@pytest.mark.parametrize(("method", "scan"), [("nf4", True), ("int8", False)], ids=["nf4-scanned", "int8-per-layer"])
def test_a_quantized_model_computes_with_its_dequantized_kernels(method: str, scan: bool) -> None:
    """Every attention and MLP kernel is stored quantized; the model equals the float model holding the
    dequantized kernels (what the merged export writes), in either layer layout."""
    import flax.linen as nn

    from tests.models.conftest import build, forward
    from theseus.model.loading.adapters import plain_shapes
    from theseus.model.models import Llama

    values = {"model__scan_layers": scan, "model__lora__rank": 2, "model__lora__targets": ["query", "down"]}
    if method == "nf4":  # 64-wide heads and a 128-wide MLP: NF4 codes kept in the kernels' shapes
        values.update(architecture__n_embd=128, architecture__n_heads=2, architecture__d_ff=128)
    model = build(Llama, model__quantize=method, **values)
    x = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 8)), jnp.int32)
    params = nn.unbox(jax.jit(lambda k: model.init(k, x, deterministic=True))(jax.random.key(0))["params"])
    kernels = [
        p for p, _ in jax.tree_util.tree_flatten_with_path(params)[0] if jax.tree_util.keystr(p).endswith("['codes']")
    ]
    assert len(kernels) == (1 if scan else model.architecture.n_layers) * 7
    # what every trainer holds out (a mapping holding integer arrays) is exactly the quantized kernels,
    # the parameters named <name>_<method>, whole
    held, rest = frozen.split(params)
    held_paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(held)[0]]
    assert {quantization.method_of(path[-2]) for path in held_paths} == {method}
    assert len({path[:-1] for path in held_paths}) == len(kernels)
    rest_keys = {key for path, _ in jax.tree_util.tree_flatten_with_path(rest)[0] for key in path}
    assert not [key for key in rest_keys if quantization.method_of(key) is not None]
    assert jax.tree.structure(frozen.join(rest, held)) == jax.tree.structure(params)
    plain = build(Llama, **values)
    dequantized = quantization.dequantize_params(params, plain_shapes(model))
    np.testing.assert_allclose(forward(model, params, x), forward(plain, dequantized, x), atol=1e-5, rtol=0)


def test_a_trainer_of_every_parameter_refuses_a_quantized_base(tmp_path: Path) -> None:
    """Every trainer holds a quantized base's kernels out of the update and trains adapters over it; one
    without adapters, or one whose HELD_OUT lets integer parameters through, stops in one line."""
    import optax

    from theseus.training.pretrain import Pretrain

    trainer = Pretrain.create(tmp_path, {})
    kernel = {"codes": jnp.zeros(4, jnp.uint8), "absmax_mean": jnp.ones((), jnp.float32)}
    params = {"up": {"kernel_nf4": kernel, "bias": jnp.zeros(3)}}
    with pytest.raises(ConfigError) as refused:
        trainer._restrict_optimizer(optax.adam(1e-3), params)
    assert str(refused.value) == (
        "Pretrain cannot train every parameter of a quantized base (model/quantize keeps its kernels frozen); "
        "set model/lora/rank>0 to train adapters over it, or model/quantize=none"
    )

    adapted = {"up": {**params["up"], "kernel_lora_a": jnp.zeros((4, 2)), "kernel_lora_b": jnp.zeros((2, 3))}}
    state = trainer._restrict_optimizer(optax.adam(1e-3), adapted).init(adapted)
    moments = [leaf.shape for leaf in jax.tree.leaves(state) if leaf.ndim]
    assert sorted(moments) == sorted([(4, 2), (2, 3)] * 2)  # Adam's two moments of the adapters alone

    class EveryParameter(Pretrain):
        HELD_OUT = None

    with pytest.raises(
        ConfigError, match=r"^EveryParameter cannot train integer parameters \(\['up'\]\['kernel_nf4'\]"
    ):
        EveryParameter.create(tmp_path, {})._restrict_optimizer(optax.adam(1e-3), adapted)
