"""Mixtral and Qwen3-MoE checkpoints both ways: import logits and greedy tokens equal transformers',
the export loads in ``from_pretrained`` with every tensor accounted for, and LoRA refuses the experts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

from tests.huggingface.conftest import assert_generation_matches, hf_logits, imported_logits, read_json, save_model
from theseus.errors import ConfigError

VOCAB = 258
PROMPT = "def f(x):"

#: Tiny random checkpoints: 4 experts of 24 (Mixtral) / 6 of 16 (Qwen3-MoE), 2 per token; the Qwen3-MoE
#: one keeps a dense first layer (``mlp_only_layers``) and unnormalised top-k weights.
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "mixtral": (
        "mixtral",
        {"intermediate_size": 24, "num_local_experts": 4, "num_experts_per_tok": 2, "rope_theta": 1e6},
    ),
    "qwen3_moe": (
        "qwen3_moe",
        {
            "intermediate_size": 40,
            "moe_intermediate_size": 16,
            "num_experts": 6,
            "num_experts_per_tok": 2,
            "head_dim": 16,
            "norm_topk_prob": False,
            "mlp_only_layers": [0],
        },
    ),
}


def save_moe(folder: Path, case: str, seed: int = 0, **extra: Any) -> Any:
    """A random transformers model of ``case`` (``extra`` on top) saved in ``folder`` with a byte tokenizer;
    returns it."""
    family, overrides = CASES[case]
    return save_model(folder, family, seed, vocab_size=VOCAB, tie_word_embeddings=False, **{**overrides, **extra})


@pytest.fixture(scope="module", params=list(CASES))
def saved(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path, Any]:
    folder = tmp_path_factory.mktemp(request.param)
    return request.param, folder, save_moe(folder, request.param)


@pytest.mark.parametrize("scan", [False, True])
def test_import_logits_match_transformers(saved: tuple[str, Path, Any], scan: bool) -> None:
    case, folder, model = saved
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False  # a left-padded row
    got, prepared = imported_logits(folder, ids, mask, **{"model/scan_layers": scan})
    error = float(np.max(np.abs(got - hf_logits(model, ids, mask))[mask]))
    assert error <= 1e-4, error
    assert prepared.model.scans_layers == scan
    if case == "qwen3_moe" and scan:  # a dense run (layer 0), then the mixture run
        assert [(run.name, run.first, run.length) for run in prepared.model.layer_runs] == [
            ("dense_blocks", 0, 1),
            ("blocks", 1, 1),
        ]
    moe = prepared.model.architecture.moe
    assert (moe.n_experts, moe.top_k, moe.norm_topk_prob) == ((4, 2, True) if case == "mixtral" else (6, 2, False))
    assert moe.first_k_dense == (1 if case == "qwen3_moe" else 0) and moe.capacity_factor is None


def test_generate_and_export_round_trip(saved: tuple[str, Path, Any], tmp_path: Path, theseus: Any) -> None:
    from transformers import AutoModelForCausalLM

    case, source, model = saved
    code, _, err = theseus("run", "hf/import", f"hf/source={source}", "run/name=imported")
    assert code == 0, err
    assert read_json(theseus.root / "runs" / "imported" / "provenance.json")["huggingface"]["model_type"] == case
    assert_generation_matches(theseus, "imported", source, model, PROMPT, 12)

    out_dir = tmp_path / "export"
    code, _, err = theseus("run", "hf/export", "hf/run=imported", f"hf/out={out_dir}")
    assert code == 0, err
    reloaded, info = AutoModelForCausalLM.from_pretrained(out_dir, output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    x = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    assert np.max(np.abs(hf_logits(reloaded.eval(), x) - hf_logits(model, x))) <= 1e-5
    config = read_json(out_dir / "config.json")
    if case == "qwen3_moe":
        assert (config["mlp_only_layers"], config["norm_topk_prob"], config["num_experts"]) == ([0], False, 6)
    else:
        assert (config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"]) == (4, 2, 24)


def test_lora_on_attention_reads_the_base_and_on_experts_is_refused(
    saved: tuple[str, Path, Any], tmp_path: Path
) -> None:
    import flax.linen as nn
    import jax

    from theseus.config import configuration, configure
    from theseus.model.huggingface.importer import flat_paths, import_class
    from theseus.model.layers import lora
    from theseus.model.loading.adapters import load_base
    from theseus.training.adapters import base_only
    from theseus.training.init_from import open_source

    _case, folder, _model = saved
    source = open_source(f"hf:{folder}", tmp_path)
    x = jnp.zeros((1, 4), jnp.int32)

    def abstract(targets: str) -> tuple[Any, Any, dict[str, Any]]:
        values = {**source.keys, "model/lora/rank": 2, "model/lora/targets": targets}
        with configuration(values):
            model = configure(import_class(source.model_class))
            shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), x, deterministic=True))
        return model, nn.unbox(shapes["params"]), values

    model, shapes, values = abstract("query,key,value,out")
    assert lora.adapter_names(shapes) == {"query", "key", "value", "out"}
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with configuration(values):
        base = flat_paths(load_base(source, model, shapes, jax.tree.map(lambda _: device, shapes)))
    assert set(base) == set(flat_paths(base_only(shapes)))
    assert any(path[-1] == "router" for path in base)
    with pytest.raises(ConfigError) as error:
        abstract("query,up")
    assert "LoRA on a mixture's experts is not supported" in str(error.value) and "\n" not in str(error.value)
