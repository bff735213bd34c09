"""LoRA in the standard layers: every projection of a Llama-style model takes adapters, fresh
adapters change nothing, and merging them into the kernels gives the same model."""

from __future__ import annotations

import jax
import numpy as np

from tests.models.conftest import build, random_params
from theseus.model.layers import lora
from theseus.model.models import Llama

ALL = ["query", "key", "value", "out", "up", "gate", "down"]


def test_llama_adapters_on_every_projection_merge_into_the_same_model() -> None:
    adapted_model = build(Llama, model__lora__rank=2, model__lora__targets=ALL, model__lora__alpha=4.0)
    plain_model = build(Llama)
    params = random_params(adapted_model, std=0.2)  # adapters with non-zero B: they change the model
    assert lora.adapter_names(params) == set(ALL)
    x = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)

    def logits(model: Llama, p: object) -> np.ndarray:
        return np.asarray(jax.jit(lambda q: model.apply({"params": q}, x, deterministic=True)[0])(p))

    adapted = logits(adapted_model, params)
    merged = lora.merge(params, 4.0, 2)
    np.testing.assert_allclose(logits(plain_model, merged), adapted, atol=1e-5, rtol=0)
    base = lora.merge(params, 4.0, 0)  # adapters dropped, kernels untouched
    assert np.max(np.abs(logits(plain_model, base) - adapted)) > 1e-3

    fresh = jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.zeros_like(leaf) if str(getattr(path[-1], "key", "")).endswith("lora_b") else leaf,
        params,
    )
    np.testing.assert_array_equal(logits(adapted_model, fresh), logits(plain_model, base))
