"""LoRA in the standard layers: every projection of a Llama-style model takes adapters, fresh
adapters change nothing, and merging them into the kernels gives the same model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.models.conftest import build, random_params
from theseus.model.finetune.adapters import overlay, prune
from theseus.model.layers import lora
from theseus.model.models import Llama

ALL = ["query", "key", "value", "out", "up", "gate", "down"]


def test_llama_adapters_on_every_projection_merge_into_the_same_model() -> None:
    adapted_model = build(Llama, model__lora__rank=2, model__lora__targets=ALL, model__lora__alpha=4.0)
    plain_model = build(Llama)
    params = random_params(adapted_model, std=0.2)  # adapters with non-zero B: they change the model
    assert lora.adapter_names(params) == set(ALL)
    x = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)

    def logits(model: Any, p: object) -> np.ndarray:
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


@pytest.mark.slow
def test_peft_loads_llama_adapters_and_gives_the_same_logits(tmp_path: Path) -> None:
    """The PEFT layout of every Llama projection (q/k/v/o, gate/up/down), checked by peft itself."""
    import torch
    from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

    from tests.huggingface.conftest import save_model
    from theseus.config import configuration, configure
    from theseus.model.finetune.peft_export import peft_tensors
    from theseus.model.huggingface.family import family
    from theseus.model.huggingface.importer import prepare, read_params

    hf_model = save_model(tmp_path, "llama", tokenizer=False)
    imported = prepare(tmp_path)
    base = read_params(imported)
    rank, alpha = 2, 4
    with configuration(
        {**dict(imported.config), "model/lora/rank": rank, "model/lora/alpha": float(alpha), "model/lora/targets": ALL}
    ):
        model = configure(type(imported.model))
    shapes = random_params(model, seed=3, std=0.2)
    params = jax.tree_util.tree_map_with_path(lambda path, leaf: leaf if lora.is_adapter(path) else None, shapes)
    params = overlay(base, prune(params))
    x = np.random.default_rng(0).integers(0, 256, size=(2, 10)).astype(np.int32)
    ours = np.asarray(jax.jit(lambda p: model.apply({"params": p}, x, deterministic=True)[0])(params))

    tensors, ranks = peft_tensors(family("llama"), params, model.architecture.n_layers)
    assert set(ranks.values()) == {rank} and len(ranks) == 7 * model.architecture.n_layers
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=sorted(ranks), lora_dropout=0.0)
    peft_model = get_peft_model(hf_model, config).eval()
    state = {k.removeprefix("base_model.model."): torch.tensor(v) for k, v in tensors.items()}
    result: Any = set_peft_model_state_dict(peft_model, {f"base_model.model.{k}": v for k, v in state.items()})
    assert not [k for k in result.unexpected_keys if "lora" in k]
    with torch.no_grad():
        theirs = peft_model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
    assert np.max(np.abs(theirs - ours)) <= 1e-4
