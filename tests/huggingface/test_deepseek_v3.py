"""DeepSeek-V3 checkpoints both ways: import logits and greedy (latent KV-cache) tokens equal
transformers', the export loads in ``from_pretrained`` with every tensor accounted for, the published
preset has the published size, and unsupported fields are one line. (Training steps: finite losses and
moving balancing biases, checked on the run of tests/huggingface/test_deepseek_v3_mtp.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from tests.huggingface.conftest import assert_generation_matches, hf_logits, imported_logits, read_json, save_model
from tests.huggingface.test_bad_inputs import edit_config
from tests.huggingface.test_moe_families import PROMPT, VOCAB
from theseus.model.huggingface.importer import read_params
from theseus.model.loading.run import load_run
from theseus.model.models import init_cache

NEW_TOKENS = 16

#: 3 layers (the first dense), 8 experts of 16 in 2 groups (top 2 from 1 group, scaled 2.5) and one
#: shared; latent 8, head widths 8 + 4 rotated and values 6. ``plain_query``: no query bottleneck
#: (``q_lora_rank`` null) and half-split rotary pairs.
COMMON: dict[str, Any] = {
    "vocab_size": VOCAB,
    "tie_word_embeddings": False,
    "num_hidden_layers": 3,
    "num_key_value_heads": 4,
    "first_k_dense_replace": 1,
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_group": 2,
    "topk_group": 1,
    "moe_intermediate_size": 16,
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "kv_lora_rank": 8,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 6,
}
#: ``yarn``: the releases' long-context RoPE at a small scale (trained on 8 positions, stretched 4x; the
#: attention factor mscale / mscale_all_dim and the scores' extra (0.1 * 0.8 * ln 4 + 1)^2).
YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 8,
    "beta_fast": 32,
    "beta_slow": 1,
    "mscale": 1.0,
    "mscale_all_dim": 0.8,
}
CASES: dict[str, dict[str, Any]] = {
    "query_lora": {"q_lora_rank": 12},
    "plain_query": {"q_lora_rank": None, "rope_interleave": False},
    "yarn": {"q_lora_rank": 12, "rope_parameters": YARN, "max_position_embeddings": 32},
}


def save_deepseek(folder: Path, case: str, **overrides: Any) -> Any:
    """A random DeepSeek-V3 of ``case`` (``overrides`` on top) saved in ``folder``, with a balancing bias
    below -0.6, so that every biased score is negative (experts of unselected groups must lose to them, not
    win)."""
    import torch

    model = save_model(folder, "deepseek_v3", 0, **{**COMMON, **CASES[case], **overrides})
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                buffer.copy_(0.2 * torch.rand(buffer.shape, generator=generator) - 0.8)
    model.save_pretrained(folder)
    return model


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Any]]:
    made = {}
    for case in CASES:
        folder = tmp_path_factory.mktemp(case)
        made[case] = (folder, save_deepseek(folder, case))
    return made


@pytest.mark.parametrize("case", list(CASES))
def test_import_logits_match_transformers(saved: dict[str, tuple[Path, Any]], case: str) -> None:
    folder, model = saved[case]
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False  # a left-padded row
    got, prepared = imported_logits(folder, ids, mask)
    expected = hf_logits(model, ids, mask)
    error = float(np.max(np.abs(got - expected)[mask]))
    assert error <= 1e-4, error
    if case == "query_lora":  # scanned: the dense layer and the mixture layers each a stacked run
        scanned, scanned_import = imported_logits(folder, ids, mask, **{"model/scan_layers": True})
        assert [(r.name, r.length) for r in scanned_import.model.layer_runs] == [("dense_blocks", 1), ("blocks", 2)]
        assert float(np.max(np.abs(scanned - expected)[mask])) <= 1e-4
        np.testing.assert_allclose(scanned, got, atol=1e-5, rtol=0)
    arch = prepared.model.architecture
    assert arch.mla is not None and arch.moe is not None
    assert (arch.mla.q_lora_rank, arch.mla.rope_interleave) == ((0, False) if case == "plain_query" else (12, True))
    if case == "yarn":  # prompts of 12 tokens: past the original 8 positions
        assert (arch.position.scaling.kind, arch.position.scaling.factor, arch.mla.mscale_all_dim) == ("yarn", 4.0, 0.8)
        unscaled, _ = imported_logits(folder, ids, mask, **{"architecture/mla/mscale_all_dim": 0.0})
        assert float(np.max(np.abs(unscaled - got)[mask])) > 1e-2  # the scores' correction matters
    moe = arch.moe
    assert (moe.router, moe.n_group, moe.topk_group, moe.n_shared, moe.first_k_dense) == ("sigmoid", 2, 1, 1, 1)
    bias = np.asarray(read_params(prepared)["blocks_1"]["mlp"]["router_bias"])
    assert np.all(bias < -0.6)  # e_score_correction_bias arrived as the router's bias
    cache = init_cache(prepared.model, 2, 20)["blocks_0"]["attn"]  # the compressed latent, no per-head keys
    assert {k: v.shape for k, v in cache.items()} == {
        "latent": (2, 20, 8),
        "rope_key": (2, 20, 4),
        "mask": (2, 20),
        "index": (),
    }


def test_the_model_and_the_layer_are_registered() -> None:
    from theseus.model.layers import LatentAttention
    from theseus.model.models import DeepseekV3
    from theseus.registry import get_registry

    registry = get_registry()
    assert registry.load_component("model", "deepseek_v3") is DeepseekV3
    assert registry.load_component("layer", "latent_attention") is LatentAttention


def test_generate_and_export_round_trip(saved: dict[str, tuple[Path, Any]], tmp_path: Path, theseus: Any) -> None:
    from transformers import AutoModelForCausalLM

    source, model = saved["yarn"]  # the prompt and its new tokens run past the original 8 positions
    code, _, err = theseus("run", "hf/import", f"hf/source={source}", "run/name=imported")
    assert code == 0, err
    assert (
        read_json(theseus.root / "runs" / "imported" / "provenance.json")["huggingface"]["model_type"] == "deepseek_v3"
    )
    # the run continues scanned (a dense run and a mixture run): its per-layer checkpoint loads into
    # the runs, generates as transformers does, and the export unstacks them again
    config = OmegaConf.load(theseus.root / "runs" / "imported" / "config.yaml")
    OmegaConf.update(config, "model.scan_layers", True)
    OmegaConf.save(config, theseus.root / "runs" / "imported" / "config.yaml")
    loaded = load_run(theseus.root, "imported")
    assert [run.name for run in loaded.model.layer_runs] == ["dense_blocks", "blocks"]
    assert loaded.params["dense_blocks"]["mlp"]["up"]["kernel"].shape[0] == 1
    assert_generation_matches(theseus, "imported", source, model, PROMPT, NEW_TOKENS)

    out_dir = tmp_path / "export"
    code, _, err = theseus("run", "hf/export", "hf/run=imported", f"hf/out={out_dir}")
    assert code == 0, err
    loaded: Any = AutoModelForCausalLM.from_pretrained(out_dir, output_loading_info=True)
    reloaded, info = loaded
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    x = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    assert np.max(np.abs(hf_logits(reloaded.eval(), x) - hf_logits(model, x))) <= 1e-5
    config = read_json(out_dir / "config.json")
    expected = {"q_lora_rank": 12, "kv_lora_rank": 8, "n_routed_experts": 8, "n_group": 2, "first_k_dense_replace": 1}
    assert {k: config[k] for k in expected} == expected and config["num_nextn_predict_layers"] == 0
    rope = reloaded.config.rope_parameters
    assert (rope["rope_type"], rope["factor"], rope["mscale_all_dim"]) == ("yarn", 4.0, 0.8)


def test_fields_config_json_omits_take_transformers_defaults(
    saved: dict[str, tuple[Path, Any]], tmp_path: Path
) -> None:
    """Without routed_scaling_factor transformers scales by 2.5, and so does the import (same logits);
    without the group fields both read 8 groups of which 4 are chosen, and no bottleneck field means
    transformers' 1536."""
    import json
    import shutil

    from transformers import AutoModelForCausalLM

    from theseus.model.models.deepseek_v3.hf import DeepseekV3Family

    folder = tmp_path / "sparse"
    shutil.copytree(saved["query_lora"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["routed_scaling_factor"]
    (folder / "config.json").write_text(json.dumps(config))
    model = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    ids = np.random.default_rng(2).integers(0, VOCAB, (1, 10))
    got, prepared = imported_logits(folder, ids, np.ones_like(ids, dtype=bool))
    assert float(np.max(np.abs(got - hf_logits(model, ids)))) <= 1e-4
    assert prepared.model.architecture.moe.routed_scaling_factor == 2.5
    sparse = {k: v for k, v in config.items() if k not in ("n_group", "topk_group", "q_lora_rank")}
    keys = DeepseekV3Family().keys(sparse)
    assert (keys["architecture/moe/n_group"], keys["architecture/moe/topk_group"]) == (8, 4)
    assert keys["architecture/mla/q_lora_rank"] == 1536


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("architecture/sliding_window", 4),
        ("architecture/n_kv_heads", 2),
        ("architecture/head_dim", 8),
        ("architecture/attention_bias", True),
    ],
)
def test_dense_attention_keys_are_refused_in_one_line(key: str, value: Any) -> None:
    from tests.models.test_moe import model_of
    from theseus.errors import ConfigError
    from theseus.model.models import DeepseekV3

    with pytest.raises(ConfigError) as error:
        _ = model_of(DeepseekV3, **{key: value}).architecture
    message = str(error.value)
    assert message.startswith(f"{key}={value} does not apply to DeepSeek-V3's latent attention") and "\n" not in message


def test_multi_token_prediction_layers_are_set_aside(saved: dict[str, tuple[Path, Any]], tmp_path: Path) -> None:
    """The releases store their multi-token-prediction layer after the last layer. Declared by
    config.json but incomplete, its missing tensor is named; with ``architecture/mtp_depth=0`` at import
    its tensors are set aside; any tensor config.json does not declare is refused. (A whole module
    imports: tests/huggingface/test_deepseek_v3_mtp.py.)"""
    import shutil

    from safetensors.numpy import load_file, save_file

    from theseus.errors import CheckpointError
    from theseus.model.huggingface.importer import prepare

    folder = tmp_path / "mtp"
    shutil.copytree(saved["query_lora"][0], folder)
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.3.eh_proj.weight"] = np.zeros((32, 64), np.float32)
    tensors["model.layers.3.mlp.experts.0.up_proj.weight"] = np.zeros((16, 32), np.float32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    edit_config(num_nextn_predict_layers=0)(folder)
    with pytest.raises(CheckpointError, match=r"holds tensor 'model\.layers\.3\..*\(2 such\)"):
        prepare(folder)
    edit_config(num_nextn_predict_layers=1)(folder)
    with pytest.raises(CheckpointError, match=r"has no tensor 'model\.layers\.3\.enorm\.weight'"):
        prepare(folder)
    prepared = prepare(folder, {"architecture/mtp_depth": 0})
    assert prepared.model.architecture.n_layers == 3
    assert not any(m.hf.startswith("model.layers.3.") for m in prepared.maps)


def test_the_published_preset_has_the_published_size() -> None:
    """The count from shapes equals transformers' count of the exported config (meta device: nothing
    allocated) at 5 of the 61 layers (the 3 dense and 2 mixture layers: every kind of layer, at a
    fraction of the time to build the modules), and at 61 layers it is 671B total. DeepSeek publishes
    671B for the main model (the checkpoint's 685B adds the 14B multi-token-prediction module, which
    neither side builds) and 37B activated per token, figures rounded to whole billions: 671.03B total,
    and 36.63B active less the token embedding (37.55B with it, which would round to 38B). The routers'
    balancing biases count as parameters (transformers keeps them as buffers)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from tests.models.test_moe import model_of
    from theseus.model.huggingface.family import family
    from theseus.model.models import DeepseekV3

    published = {"architecture/preset": "deepseek-v3", "architecture/vocab_size": 129280}
    shallow = model_of(DeepseekV3, **published, **{"architecture/n_layers": 5})
    config = family("deepseek_v3").to_config(shallow.architecture, {}, dtype="bfloat16", bos_id=0, eos_id=1)
    with torch.device("meta"):
        hf_model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    biases = [b for n, b in hf_model.named_buffers() if n.endswith("e_score_correction_bias")]  # a buffer there
    hf_total = sum(p.numel() for p in hf_model.parameters()) + sum(b.numel() for b in biases)
    assert shallow.parameter_count() == hf_total
    model = model_of(DeepseekV3, **published)
    arch = model.architecture
    total, active = model.parameter_count(), model.active_parameter_count()
    embedding = arch.vocab_size * arch.n_embd
    assert round(total / 1e9) == 671 and round((active - embedding) / 1e9) == 37
    assert abs(total / 671e9 - 1) < 0.01 and abs((active - embedding) / 37e9 - 1) < 0.011
    moe = arch.moe.active_matmul_params(arch.n_embd, True)
    ffn = arch.moe.first_k_dense * 3 * arch.n_embd * arch.feed_forward.d_ff + arch.moe_layers * moe
    matmul = (
        arch.n_layers * arch.mla.matmul_params(arch.n_embd, arch.attention.n_heads)
        + ffn
        + arch.n_embd * arch.padded_vocab_size
    )
    assert model.flops(128) == 6 * 128 * matmul + arch.n_layers * arch.mla.score_flops(128, 128)


BAD: dict[str, tuple[dict[str, Any], str]] = {
    "rope-dynamic": (
        {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
        "config.json field rope_scaling.rope_type='dynamic' is not supported by theseus (supported: default, linear",
    ),
    "fp8": (
        {"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128]}},
        "config.json has quantization_config (quant_method='fp8'): theseus imports unquantized weights",
    ),
    "kv-heads": ({"num_key_value_heads": 2}, "config.json field num_key_value_heads=2 is not supported"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_unsupported_fields_are_one_line(
    saved: dict[str, tuple[Path, Any]], case: str, tmp_path: Path, theseus: Any
) -> None:
    import shutil

    values, message = BAD[case]
    folder = tmp_path / "ckpt"
    shutil.copytree(saved["query_lora"][0], folder)
    edit_config(**values)(folder)
    code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
