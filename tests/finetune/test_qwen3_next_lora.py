"""LoRA in Qwen3-Next's Gated DeltaNet layers: ``query``, ``key``, ``value`` (with the output gate ``z``)
and ``out`` take adapters there as in the full-attention layers; fresh adapters change nothing, merging
gives the same model, and LoRA training over a Hugging Face base trains the adapters alone, which a
run's loading lays back over that base."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import numpy as np
import pytest

from tests.finetune.conftest import TINY_SFT
from tests.finetune.test_sft import leaves, read_checkpoint
from tests.models.conftest import build, forward, jitted, random_params
from theseus.model.layers import lora
from theseus.model.models.qwen3_next.model import Qwen3Next

ATTENTION = ["query", "key", "value", "out"]
#: The adapted projections of a Gated DeltaNet layer under ATTENTION (``z`` follows ``value``).
LINEAR = {"query", "key", "value", "z", "out"}


def test_fresh_adapters_change_nothing_and_merge_into_the_same_model() -> None:
    tiny = {"preset": "tiny", "architecture__n_layers": 4}  # three linear-attention layers, then a full one
    adapted_model = build(
        Qwen3Next, model__lora__rank=2, model__lora__alpha=4.0, model__lora__targets=ATTENTION, **tiny
    )
    plain_model = build(Qwen3Next, **tiny)
    assert adapted_model.architecture.layer_types == ("linear_attention",) * 3 + ("full_attention",)
    params = random_params(adapted_model, std=0.1)  # adapters with non-zero B: they change the model
    assert lora.adapter_names(params["blocks_0"]["attn"]) == LINEAR
    assert lora.adapter_names(params["blocks_3"]["attn"]) == set(ATTENTION)
    assert not {"a_lora_a", "b_lora_a"} & set(params["blocks_0"]["attn"])
    x = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)

    adapted = forward(adapted_model, params, x)
    base = forward(plain_model, lora.merge(params, 4.0, 0), x)  # adapters dropped, kernels untouched
    assert np.max(np.abs(base - adapted)) > 1e-1
    linear_only = {**params, "blocks_3": fresh(params["blocks_3"])}
    assert np.max(np.abs(forward(adapted_model, linear_only, x) - base)) > 1e-1  # the linear layers' own
    # float32 rounding through the chunked delta rule: about 4e-5 on logits of about 5
    np.testing.assert_allclose(forward(plain_model, lora.merge(params, 4.0, 2), x), adapted, atol=2e-4, rtol=0)
    # fresh adapters add exact zeros; the two programs differ, so XLA rounds the layers' products differently
    np.testing.assert_allclose(forward(adapted_model, fresh(params), x), base, atol=2e-5, rtol=0)


def test_a_gated_deltanet_layer_starts_with_zero_adapters_that_change_nothing() -> None:
    from theseus.config import configuration, configure
    from theseus.model.models.qwen3_next.deltanet import GatedDeltaNet

    shape = {"key_heads": 2, "value_heads": 4, "key_dim": 8, "value_dim": 6, "chunk_size": 4}
    with configuration({"model/lora/rank": 2, "model/lora/targets": ATTENTION}):
        adapted = configure(GatedDeltaNet, **shape)
    plain = configure(GatedDeltaNet, **shape)
    x = np.random.default_rng(0).normal(size=(2, 10, 16)).astype(np.float32)
    params = nn.unbox(jitted(adapted.init, jax.random.key(0), x, deterministic=True)["params"])
    assert lora.adapter_names(params) == LINEAR
    assert all(not np.any(np.asarray(v)) for k, v in params.items() if k.endswith("lora_b"))
    base = {k: v for k, v in params.items() if "lora_" not in k}
    ours = jitted(adapted.apply, {"params": params}, x, deterministic=True)
    theirs = jitted(plain.apply, {"params": base}, x, deterministic=True)
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def fresh(params: Any) -> Any:
    """``params`` with every adapter's ``B`` zero, as adapters start."""

    def zero(path: Any, leaf: Any) -> Any:
        return np.zeros_like(leaf) if str(getattr(path[-1], "key", "")).endswith("lora_b") else leaf

    return jax.tree_util.tree_map_with_path(zero, params)


@pytest.mark.slow
def test_lora_over_a_hugging_face_base_trains_the_adapters_alone(tmp_path: Path) -> None:
    """LoRA pretraining (SFT packs rows, and the linear attention takes one example per row) over a Hugging
    Face folder: the base stays as read, the checkpoint holds the adapters, loading the run lays them over
    the base, and hf/export-adapter's adapter gives transformers with peft the run's logits."""
    from tests.huggingface.conftest import save_model
    from theseus.model.finetune.peft_export import export_adapter
    from theseus.model.generation import load_run
    from theseus.model.huggingface.importer import prepare, read_params
    from theseus.training.pretrain import Pretrain, prepare_offline_corpus

    folder = tmp_path / "hf-qwen3-next"
    # a linear-attention layer 0 (dense MLP) and a full-attention layer 1 (a mixture): each kind of layer once
    layers = {"num_hidden_layers": 2, "layer_types": ["linear_attention", "full_attention"]}
    save_model(folder, "qwen3_next", tokenizer=False, max_position_embeddings=64, **layers)
    settings = {k: v for k, v in TINY_SFT.items() if not k.startswith("architecture/n_")}
    settings.update(
        {
            "model/lora/targets": ATTENTION,
            "training/init_from": f"hf:{folder}",
            "training/steps": 2,
            "training/checkpoint_interval": 2,
            "training/keep_checkpoints": 0,
            "data/max_documents": 12,  # the offline corpus pretraining prepares on first use
            "data/val_fraction": 0.25,
            "evaluation": "",  # no perplexity at the end: no validation program to compile
            "run/name": "next-lora",
        }
    )
    trainer = Pretrain.create(tmp_path, settings)
    prepare_offline_corpus(trainer)
    trainer.run()
    trainer.close()
    after = leaves(trainer.state.params)

    adapted = sorted(k for k in after if "lora_" in k)
    base = leaves(read_params(prepare(folder)))  # the checkpoint as the importer reads it
    assert set(base) == after.keys() - set(adapted)
    for key, value in base.items():
        assert after[key].tobytes() == value.tobytes(), f"{key} changed"
    linear_b = [k for k in adapted if "blocks_0" in k and k.endswith("lora_b']")]
    assert {k.split("'")[-2].removesuffix("_lora_b") for k in linear_b} == LINEAR
    assert all(np.any(after[k] != 0) for k in linear_b)  # B starts at zero: every linear-layer adapter trained
    saved = read_checkpoint(tmp_path / "runs" / "next-lora", 2)
    assert sorted(leaves(saved["params"])) == adapted  # the checkpoint refers to the base, holds the adapters

    run = load_run(tmp_path, "next-lora", tokenizer="byte")  # the adapters over the base
    loaded = leaves(run.params)
    assert set(loaded) == set(after)
    for key, value in after.items():
        np.testing.assert_array_equal(loaded[key], value, err_msg=key)

    x = np.random.default_rng(0).integers(0, 256, size=(2, 10)).astype(np.int32)
    ours = forward(run.model, run.params, x)
    theirs, plain = peft_logits(folder, export_adapter(tmp_path, "next-lora", str(tmp_path / "adapter")), x)
    assert np.max(np.abs(theirs - ours)) <= 1e-4 < np.max(np.abs(plain - ours))


def peft_logits(base: Path, adapter: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' logits of the model in ``base`` with the PEFT adapter in ``adapter``, and without it."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter).eval()
    with torch.no_grad():
        adapted = model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
        with model.disable_adapter():
            plain = model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
    return adapted, plain
