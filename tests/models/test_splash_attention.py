"""Splash attention (the Pallas TPU kernel, run in Pallas' interpreter on CPU) against XLA attention: outputs
and gradients for every mask the families use, whole models of the families that use each, the choice
``auto`` makes per accelerator, and the one line a fallback prints. (On a chip, in bf16:
benchmarks/tpu_attention.py. Layouts: test_splash_layouts.py.)"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import build, logits_loss_grads, random_params
from tests.models.test_models import batch
from theseus.base.accelerator import Accelerator, targeting
from theseus.errors import ConfigError
from theseus.model.layers import splash
from theseus.model.layers.attention import attention_backend, dot_product_attention
from theseus.model.stack.scan import REMAT_POLICIES

B, T, HEADS, KV, WIDTH = 2, 200, 4, 2, 16  # T is padded to 256 inside the kernel call


def _inputs() -> dict[str, Any]:
    keys = jax.random.split(jax.random.key(0), 5)
    index = jnp.arange(T)[None, :]
    return {
        "q": jax.random.normal(keys[0], (B, T, HEADS, WIDTH)),
        "k": jax.random.normal(keys[1], (B, T, KV, WIDTH)),
        "v": jax.random.normal(keys[2], (B, T, KV, WIDTH)),
        "sinks": jax.random.normal(keys[3], (HEADS,)),
        "probe": jax.random.normal(keys[4], (B, T, HEADS, WIDTH)),
        "padding": index < jnp.array([[T], [T - 37]]),  # the second row padded at its end
        "segments": jnp.broadcast_to(jnp.where(index < 70, 1, jnp.where(index < 180, 2, 0)), (B, T)),
    }


CASES: dict[str, dict[str, Any]] = {
    "key padding": {"padding_mask": "padding"},
    "packed rows, soft cap": {"padding_mask": "segments", "softcap": 3.0, "scale": 0.3},
    "sliding window": {"window": 45, "padding_mask": "padding"},
    "chunks": {"chunk": 64},
    "sinks and window": {"sinks": "sinks", "window": 100},
}


@pytest.mark.parametrize("case", list(CASES))
def test_splash_equals_xla_attention_outputs_and_gradients(case: str) -> None:
    arrays = _inputs()
    spec = {key: arrays[value] if isinstance(value, str) else value for key, value in CASES[case].items()}
    sinks = spec.pop("sinks", None)
    mask = spec.get("padding_mask")
    real = jnp.ones((B, T), bool) if mask is None else mask.astype(bool) if mask.dtype == jnp.bool_ else mask > 0

    def probe(q: Any, k: Any, v: Any, s: Any, impl: str) -> Any:
        out = dot_product_attention(q, k, v, mask=None, is_causal=True, implementation=impl, sinks=s, **spec)
        out = jnp.where(real[:, :, None, None], out, 0.0)  # padding positions' outputs are read by no loss
        return jnp.sum(out * arrays["probe"]), out

    results = {}
    with jax.default_matmul_precision("highest"):
        for impl in ("xla", "splash"):
            grad = jax.jit(jax.grad(probe, argnums=(0, 1, 2, 3), has_aux=True), static_argnums=4)
            results[impl] = grad(arrays["q"], arrays["k"], arrays["v"], sinks, impl)
    (grads_x, out_x), (grads_s, out_s) = results["xla"], results["splash"]
    np.testing.assert_allclose(np.asarray(out_s), np.asarray(out_x), atol=2e-6, rtol=0)
    for got, want in zip(grads_s, grads_x, strict=True):
        if want is None:
            assert got is None
            continue
        scale = float(jnp.max(jnp.abs(want)))
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6 * max(scale, 1.0), rtol=0)


FAMILIES = {
    # Gemma 3: windows chosen per scanned layer at run time (one kernel per kind of layer, by lax.cond)
    "gemma3": (
        "Gemma3",
        {
            "architecture__n_layers": 3,
            "architecture__n_kv_heads": 2,
            "architecture__sliding_window": 4,
            "architecture__layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "model__scan_layers": True,
        },
    ),
    "gpt-oss sinks": ("GptOss", {}),
    "llama4 chunks": ("Llama4", {"architecture__attention_chunk_size": 4}),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_families_give_the_same_logits_and_gradients_with_splash(
    family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import theseus.model.models as models

    name, values = FAMILIES[family]
    splash._NOTICED.clear()
    cls = getattr(models, name)
    xla = build(cls, architecture__attention_impl="xla", **values)
    kernel = build(cls, architecture__attention_impl="splash", **values)
    params = random_params(xla, std=0.1)
    vocab = xla.architecture.vocab_size
    x, y, mask = batch(vocab)
    mask[2, :4] = True  # real tokens first in every row, as training rows hold them (Llama 4's chunks count from 0)
    with jax.default_matmul_precision("highest"):
        logits_x, loss_x, grads_x = logits_loss_grads(xla, params, x, y, mask)
        logits_s, loss_s, grads_s = logits_loss_grads(kernel, params, x, y, mask)
    real = np.asarray(mask)[..., None]
    np.testing.assert_allclose(np.asarray(logits_s) * real, np.asarray(logits_x) * real, atol=2e-5, rtol=0)
    assert abs(float(loss_s) - float(loss_x)) <= 1e-5
    for got, want in zip(jax.tree.leaves(grads_s), jax.tree.leaves(grads_x), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-5, rtol=1e-4)
    assert "notice" not in capsys.readouterr().err  # every layer ran the kernel: none fell back


def test_a_sequence_that_no_block_of_1024_divides_runs_in_smaller_blocks() -> None:
    """1,500 tokens are padded to 1,536, which blocks of 512 divide (a block of 1,024 would not)."""
    keys = jax.random.split(jax.random.key(3), 3)
    q = jax.random.normal(keys[0], (1, 1500, 2, 8))
    k, v = (jax.random.normal(key, (1, 1500, 1, 8)) for key in keys[1:])

    @functools.partial(jax.jit, static_argnums=0)  # compiled whole: the interpreted kernel's grid is not run op by op
    def attend(impl: str) -> jax.Array:
        return dot_product_attention(q, k, v, mask=None, is_causal=True, implementation=impl, window=700)

    with jax.default_matmul_precision("highest"):
        np.testing.assert_allclose(np.asarray(attend("splash")), np.asarray(attend("xla")), atol=2e-6, rtol=0)


def test_splash_refuses_gpus_in_one_line() -> None:
    q = jnp.zeros((1, 8, 4, 64), jnp.bfloat16)
    with targeting(Accelerator("gpu", "NVIDIA H100 80GB HBM3")), pytest.raises(ConfigError, match="TPU kernel"):
        attention_backend("splash", q, q)


def test_auto_chooses_splash_for_tpus_cudnn_for_gpus_and_xla_on_cpus() -> None:
    q = jnp.zeros((1, 8, 4, 64), jnp.bfloat16)
    choices = {}
    for platform, kind in (("tpu", "TPU v5 lite"), ("gpu", "NVIDIA H100 80GB HBM3"), ("cpu", "cpu")):
        with targeting(Accelerator(platform, kind)):
            choices[platform] = attention_backend("auto", q, q)
    assert choices == {"tpu": "splash", "gpu": "cudnn", "cpu": "xla"}
    assert attention_backend("splash", q, q) == "splash"


def test_a_call_splash_cannot_take_says_so_once_and_equals_xla(capsys: pytest.CaptureFixture[str]) -> None:
    arrays = _inputs()
    q, k, v = arrays["q"][:, :16], arrays["k"][:, :16], arrays["v"][:, :16]
    splash._NOTICED.clear()

    @jax.jit
    def both(window: jax.Array) -> tuple[jax.Array, jax.Array]:
        def attend(impl: str) -> jax.Array:
            return dot_product_attention(q, k, v, mask=None, is_causal=True, implementation=impl, window=window)

        return attend("splash"), attend("xla")

    first, reference = both(jnp.asarray(5))
    both(jnp.asarray(6))
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "notice: splash attention does not take a window chosen per layer at run time; this layer uses XLA attention"
    ]
    np.testing.assert_array_equal(np.asarray(first), np.asarray(reference))


def test_remat_dots_keeps_the_kernels_output_so_the_backward_pass_does_not_run_it_again() -> None:
    """``model/remat=dots`` saves splash's named residuals: the compiled backward holds as many forward
    kernels as one that saves everything, fewer than ``full``, which runs the forward again."""
    q = jnp.ones((1, 256, 2, 16))
    k = jnp.ones((1, 256, 1, 16))

    def layer(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = dot_product_attention(jnp.sin(q), k, v, mask=None, is_causal=True, implementation="splash")
        return jnp.sum(out**2)

    def forward_kernels(policy: Any) -> int:
        step = jax.jit(jax.grad(jax.checkpoint(layer, policy=policy)))
        return step.lower(q, k, k).compile().as_text().count("splash_mha_fwd")

    kept = forward_kernels(jax.checkpoint_policies.everything_saveable)
    assert forward_kernels(REMAT_POLICIES["dots"]) == kept
    assert forward_kernels(REMAT_POLICIES["full"]) > kept
