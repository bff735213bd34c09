"""LoRA over a base read from ``training/init_from=hf:``: the checkpoint holds no adapters, so the
base is read alone, for every family the importer knows, in both layer layouts and with any targets."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.huggingface.conftest import save_model
from theseus.config import configuration, configure
from theseus.model.huggingface.family import family as hf_family
from theseus.model.huggingface.importer import flat_paths, import_class
from theseus.model.layers import lora
from theseus.model.loading.adapters import load_base
from theseus.training.adapters import base_only
from theseus.training.init_from import open_source

FAMILIES = ("gpt2", "llama", "mistral", "qwen2", "qwen3", "olmo2", "olmo3", "gemma2", "gemma3_text", "phi3")
ATTENTION = ("query", "key", "value", "out")
MLP = ("up", "gate", "down")


def fuses_attention(name: str) -> bool:
    """Whether the family's checkpoints hold two or more of the attention projections in one tensor
    (GPT-2's ``c_attn``, Phi-3's ``qkv_proj``), which the reader splits."""
    fused = hf_family(name).peft_fused_modules().values()
    return any(len(set(parts) & set(ATTENTION)) > 1 for parts in fused)


def target_sets(name: str) -> list[tuple[str, ...]]:
    """Every single projection and everything the family's MLP has; where the family fuses attention
    projections, every attention subset too (the others hold a tensor per projection, read alike whichever
    others have adapters)."""
    mlp = ("up", "down") if name == "gpt2" else MLP
    singles = [(t,) for t in (*ATTENTION, *mlp)]
    if not fuses_attention(name):
        return [*singles, (*ATTENTION, *mlp)]
    attention = [c for n in range(2, 5) for c in itertools.combinations(ATTENTION, n)]
    return [*singles, *attention, (*ATTENTION, *mlp)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    made = {}
    for family in FAMILIES:
        folder = tmp_path_factory.mktemp(f"hf-{family}")
        save_model(folder, family, tokenizer=False)
        made[family] = folder
    return made


def abstract_model(source: Any, values: dict[str, Any]) -> tuple[Any, Any]:
    config = {**source.keys, **values}
    with configuration(config):
        model = configure(import_class(source.model_class))
        shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 4), jnp.int32), deterministic=True))
    import flax.linen as nn

    return model, nn.unbox(shapes["params"])


def single_device(tree: Any) -> Any:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda _: device, tree)


@pytest.mark.parametrize("scan", [False, True], ids=["per-layer", "scanned"])
@pytest.mark.parametrize("family", FAMILIES)
def test_lora_base_reads_from_an_hf_folder(family: str, scan: bool, folders: dict[str, Path], tmp_path: Path) -> None:
    source = open_source(f"hf:{folders[family]}", tmp_path)
    plain_model, plain_abstract = abstract_model(source, {"model/scan_layers": scan})
    with configuration({**source.keys, "model/scan_layers": scan}):
        expected = flat_paths(source.load(plain_model, plain_abstract, single_device(plain_abstract)))
    for targets in target_sets(family):
        values = {"model/scan_layers": scan, "model/lora/rank": 2, "model/lora/targets": list(targets)}
        model, abstract = abstract_model(source, values)
        assert lora.adapter_names(abstract) == set(targets)
        with configuration({**source.keys, **values}):
            base = flat_paths(load_base(source, model, abstract, single_device(abstract)))
        assert set(base) == set(flat_paths(base_only(abstract))) == set(expected), targets
        for path, value in base.items():
            np.testing.assert_array_equal(np.asarray(value), np.asarray(expected[path]), err_msg="/".join(path))
