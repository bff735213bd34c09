"""Bad checkpoints are one ``error:`` line, exit code 2, and nothing left under ``runs/``."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.huggingface.conftest import save_model


def no_config(folder: Path) -> None:
    (folder / "config.json").unlink()


def bin_only(folder: Path) -> None:
    (folder / "model.safetensors").rename(folder / "pytorch_model.bin")


def damaged_header(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[8:20] = b"not json at!"
    path.write_bytes(bytes(data))


def wrong_shape(folder: Path) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 64  # the saved MLP weights are 48 wide
    (folder / "config.json").write_text(json.dumps(config))


def edit_config(**values: Any) -> Callable[[Path], None]:
    def edit(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(values)
        (folder / "config.json").write_text(json.dumps(config))

    return edit


def truncated(folder: Path) -> None:
    path = folder / "model.safetensors"
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    path.write_bytes(data[: 8 + length + 100])


CASES: dict[str, tuple[Callable[[Path], None], str]] = {
    "no-config": (no_config, "has no config.json"),
    "bin-only": (bin_only, "PyTorch pickle weights"),
    "damaged-header": (damaged_header, "is not a valid safetensors file"),
    "truncated": (truncated, "does not fit its byte range"),
    "wrong-shape": (wrong_shape, "'model.layers.0.mlp.gate_proj.weight' in model.safetensors has shape (48, 32)"),
    "unknown-model-type": (
        edit_config(model_type="falcon"),
        # the example plugin's family is installed in the test environment too
        "model_type 'falcon' is not supported; installed families: deepseek_v3, deepseek_v32, example_scaled_gpt, "
        "falcon_h1, gemma2, gemma3_text, gemma4, gemma4_text, glm4_moe, glm_moe_dsa, gpt2, gpt_oss, "
        "granitemoehybrid, kimi_linear, lfm2, llama, llama4_text, "
        "minimax_m2, mistral, mixtral, nemotron_h, "
        "olmo2, olmo3, olmo_hybrid, phi3, qwen2, qwen3, qwen3_5, qwen3_5_moe, qwen3_5_moe_text, qwen3_5_text, "
        "qwen3_moe, qwen3_next, qwen4_exp, qwen4_exp_text, smollm3 "
        "(a plugin adds one by registering an 'hf/<model_type>' component",
    ),
    "rope-dynamic": (
        edit_config(rope_parameters={"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e4}),
        "rope_scaling.rope_type='dynamic' is not supported",
    ),
    "quantized": (
        edit_config(quantization_config={"quant_method": "bitsandbytes", "load_in_4bit": True}),
        "config.json has quantization_config (quant_method='bitsandbytes'): theseus imports unquantized weights; "
        "use a bfloat16/float32 copy of the checkpoint (dequantize it first)",
    ),
    "activation": (edit_config(hidden_act="gelu_fast"), "hidden_act='gelu_fast' is not supported"),
    "layer-types-length": (
        edit_config(layer_types=["full_attention"] * 3),
        "layer_types=['full_attention', 'full_attention', 'full_attention'] is not supported by theseus "
        "(expected 2 of 'sliding_attention' / 'full_attention')",
    ),
    "layer-types-mixed": (
        edit_config(sliding_window=4, layer_types=["sliding_attention", "full_attention"]),
        "(windowed and full layers in one model; every layer must be alike)",
    ),
    "tokenizer-vocab": (edit_config(vocab_size=200), "has 258 token ids but config.json's vocab_size is 200"),
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("llama")
    save_model(folder, "llama")
    return folder


@pytest.mark.parametrize("case", list(CASES))
def test_bad_checkpoint_is_one_line(case: str, pristine: Path, tmp_path: Path, theseus: Any) -> None:
    import shutil

    damage, message = CASES[case]
    folder = tmp_path / "ckpt"
    shutil.copytree(pristine, folder)
    if case == "tokenizer-vocab":  # a smaller model whose weights match its config, but not the tokenizer
        shutil.rmtree(folder)
        save_model(folder, "llama", vocab_size=200)
        (folder / "tokenizer.json").write_bytes((pristine / "tokenizer.json").read_bytes())
    else:
        damage(folder)
    code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert message in lines[0]
    runs = theseus.root / "runs"
    assert not runs.exists() or not any(runs.iterdir())


#: Phi-3 RoPE fields theseus cannot honour: Phi-4-mini's partial rotary factor, and a type Phi-3 has not.
PHI3_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "partial-rotary": (
        {"partial_rotary_factor": 0.75},
        "config.json field partial_rotary_factor=0.75 is not supported",
    ),
    "rope-linear": (
        {"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}},
        "rope_scaling.type='linear' is not supported by theseus (supported for phi3: default, longrope)",
    ),
}


@pytest.mark.parametrize("case", list(PHI3_CASES))
def test_phi3_rope_refusals_are_one_line(case: str, tmp_path_factory: pytest.TempPathFactory, theseus: Any) -> None:
    values, message = PHI3_CASES[case]
    folder = tmp_path_factory.mktemp("phi3")
    save_model(folder, "phi3", tokenizer=False)
    edit_config(**values)(folder)
    code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


#: Gemma 3 fields theseus cannot honour, each refused in one line.
GEMMA_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "layer-types-length": (
        {"layer_types": ["sliding_attention"] * 3},
        "layer_types=['sliding_attention', 'sliding_attention', 'sliding_attention'] is not supported by theseus "
        "(expected 2 of 'sliding_attention' / 'full_attention')",
    ),
    "layer-types-unknown": (
        {"layer_types": ["sliding_attention", "chunked_attention"]},
        "layer_types=['sliding_attention', 'chunked_attention'] is not supported",
    ),
    "rope-type": (
        {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 8.0}, "sliding_attention": {}}},
        "rope_parameters.full_attention.rope_type='yarn' is not supported by theseus (supported: default, linear)",
    ),
    "activation": ({"hidden_activation": "relu"}, "hidden_activation='relu' is not supported"),
}


@pytest.mark.parametrize("case", list(GEMMA_CASES))
def test_gemma_refusals_are_one_line(case: str, tmp_path_factory: pytest.TempPathFactory, theseus: Any) -> None:
    values, message = GEMMA_CASES[case]
    folder = tmp_path_factory.mktemp("gemma3")
    save_model(folder, "gemma3_text", tokenizer=False)
    edit_config(**values)(folder)
    code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2, err
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


def test_existing_run_and_missing_name(pristine: Path, theseus: Any) -> None:
    code, _, err = theseus("run", "hf/import", f"hf/source={pristine}")
    assert code == 2 and "needs run/name" in err
    (theseus.root / "runs" / "taken").mkdir(parents=True)
    code, _, err = theseus("run", "hf/import", f"hf/source={pristine}", "run/name=taken")
    assert code == 2 and "already exists" in err


def test_hub_id_without_network_is_one_line(theseus: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read when imported: never touch the network
    monkeypatch.setenv("HF_HOME", str(theseus.root / "hf-home"))
    code, _, err = theseus("run", "hf/import", "hf/source=nobody/no-such-model", "run/name=x")
    assert code == 2
    assert err.count("\n") == 1 and "pass hf/source=<that folder>" in err


def test_export_refuses_a_non_empty_folder_and_bad_dtype(tmp_path: Path, theseus: Any) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    code, _, err = theseus("run", "hf/export", f"hf/out={tmp_path / 'full'}")
    assert code == 2 and "is not an empty folder" in err
    code, _, err = theseus("run", "hf/export", f"hf/out={tmp_path / 'new'}", "hf/dtype=int8")
    assert code == 2 and "hf/dtype='int8' is not supported" in err


#: A Nemotron-H config.json as the older releases write it: the pattern string and the mamba_* names.
OLDER_NEMOTRON_H = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "hybrid_override_pattern": "M*-",
    "mamba_num_heads": 4,
    "mamba_head_dim": 8,
    "ssm_state_size": 8,
    "mamba_n_groups": 2,
    "mamba_d_conv": 3,
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"hybrid_override_pattern": "M*E-"}, "layers_block_type='moe' is not supported"),
        ({"hybrid_override_pattern": "M*X"}, "hybrid_override_pattern='M*X' is not supported"),
        ({"layers_block_type": ["mamba", "cross_attention"]}, "layers_block_type=['cross_attention']"),
        ({"mlp_hidden_act": "silu"}, "mlp_hidden_act='silu' is not supported by theseus (supported: relu2)"),
        ({"time_step_limit": [0.0]}, "time_step_limit=[0.0] is not supported"),
    ],
)
def test_nemotron_h_refusals_are_one_line(values: dict[str, Any], message: str) -> None:
    """What Nemotron-H's import cannot build (mixture layers, unknown kinds, another activation) is one line
    naming the field; the older pattern and field names read as transformers reads them."""
    from theseus.errors import ConfigError
    from theseus.model.models.nemotron_h.hf import NemotronHFamily

    family = NemotronHFamily()
    keys = family.keys(OLDER_NEMOTRON_H)
    assert keys["architecture/layer_types"] == ["mamba", "full_attention", "mlp"]
    assert (keys["architecture/mamba_groups"], keys["architecture/mamba_conv_kernel"]) == (2, 3)
    assert family.canonical_name("backbone.layers.0.mixer.D") == "model.layers.0.mixer.D"
    with pytest.raises(ConfigError) as refused:
        family.keys({**OLDER_NEMOTRON_H, **values})
    assert message in str(refused.value) and "\n" not in str(refused.value)


#: A Falcon-H1 config.json as the releases write it (the 0.5B's fields at a small width): mamba_d_head given,
#: no gated norm, the norm-before-gate switch off.
FALCON_H1 = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "mamba_d_ssm": 48,
    "mamba_n_heads": 6,
    "mamba_d_head": 8,
    "mamba_d_state": 8,
    "mamba_rms_norm": False,
    "mamba_norm_before_gate": False,
    "mamba_use_mlp": True,
    "ssm_multipliers": [0.35, 0.25, 0.35, 0.5, 0.35],
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported by theseus (supported: silu)"),
        ({"mamba_rms_norm": True, "mamba_norm_before_gate": True}, "mamba_norm_before_gate=True is not supported"),
        ({"mamba_use_mlp": False}, "mamba_use_mlp=False is not supported"),
        ({"mamba_d_head": 7}, "mamba_d_head=7 is not supported"),
        ({"ssm_multipliers": [1.0, 1.0]}, "ssm_multipliers=[1.0, 1.0] is not supported"),
    ],
)
def test_falcon_h1_refusals_are_one_line(values: dict[str, Any], message: str) -> None:
    """What Falcon-H1's import cannot build is one line naming the field; ``mamba_d_ssm`` and the multipliers
    read as transformers reads them (a missing ``mamba_d_head``: ``mamba_d_ssm / mamba_n_heads``)."""
    from theseus.errors import ConfigError
    from theseus.model.models.falcon_h1.hf import FalconH1Family

    family = FalconH1Family()
    keys = family.keys(FALCON_H1)
    assert (keys["architecture/mamba_heads"], keys["architecture/mamba_head_dim"]) == (6, 8)
    assert keys["architecture/ssm_multipliers"] == [0.35, 0.25, 0.35, 0.5, 0.35]
    assert keys["architecture/mlp_multipliers"] == [1.0, 1.0] and keys["architecture/mamba_rms_norm"] is False
    auto = family.keys({**FALCON_H1, "mamba_d_head": "auto", "mamba_d_ssm": 64, "mamba_n_heads": 4})
    assert auto["architecture/mamba_head_dim"] == 16
    with pytest.raises(ConfigError) as refused:
        family.keys({**FALCON_H1, **values})
    assert message in str(refused.value) and "\n" not in str(refused.value)


#: A Granite 4 hybrid config.json as the releases write it (Granite-4.0-H's fields at a small width): the older
#: layer names, mamba_d_head auto, no position embedding, the multipliers.
GRANITE = {
    "vocab_size": 300,
    "hidden_size": 32,
    "intermediate_size": 16,
    "shared_intermediate_size": 24,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "layer_types": ["mamba", "attention"],
    "num_local_experts": 4,
    "num_experts_per_tok": 2,
    "mamba_n_heads": 8,
    "mamba_d_head": "auto",
    "mamba_d_state": 8,
    "position_embedding_type": "nope",
    "embedding_multiplier": 12.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "logits_scaling": 6.0,
}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported by theseus (supported: silu)"),
        ({"position_embedding_type": "alibi"}, "position_embedding_type='alibi' is not supported"),
        ({"layer_types": ["mamba", "sliding_attention"]}, "layer_types=['sliding_attention'] is not supported"),
        ({"mamba_d_head": 7}, "mamba_d_head=7 is not supported"),
        ({"sliding_window": 8}, "sliding_window=8 is not supported"),
        ({"residual_multiplier": "0.2"}, "residual_multiplier='0.2' is not supported"),
    ],
)
def test_granitemoehybrid_refusals_are_one_line(values: dict[str, Any], message: str) -> None:
    """What Granite's import cannot build is one line naming the field; the releases' layer names, the Mamba-2
    heads' width (auto: mamba_expand * hidden_size over the heads), the mixture and the multipliers read as
    transformers reads them."""
    from theseus.errors import ConfigError
    from theseus.model.models.granitemoehybrid.hf import GraniteMoeHybridFamily

    family = GraniteMoeHybridFamily()
    keys = family.keys(GRANITE)
    assert keys["architecture/layer_types"] == ["mamba", "full_attention"] and keys["architecture/rotary"] is False
    assert (keys["architecture/mamba_heads"], keys["architecture/mamba_head_dim"]) == (8, 8)
    assert (keys["architecture/moe/expert_hidden"], keys["architecture/moe/shared_hidden"]) == (16, 24)
    assert (keys["architecture/d_ff"], keys["architecture/logits_scaling"]) == (24, 6.0)
    assert family.keys({**GRANITE, "num_local_experts": 0})["architecture/moe/n_experts"] == 0
    with pytest.raises(ConfigError) as refused:
        family.keys({**GRANITE, **values})
    assert message in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"output_gate_type": "gelu"}, "output_gate_type='gelu' is not supported"),
        ({"indexer_kv_heads": 2}, "indexer_kv_heads=2 is not supported"),
        (
            {"layer_types": ["linear_attention", "sliding_attention"]},
            "layer_types=['linear_attention', 'sliding_attention']",
        ),
    ],
)
def test_qwen4_exp_refusals_are_one_line(values: dict[str, Any], message: str) -> None:
    """What Qwen4-Exp's import cannot build is one line naming the field; its own fields read as transformers'
    configuration holds them (the full layers as transformers' ``indexed_attention``)."""
    from tests.huggingface.conftest import hf_config
    from theseus.errors import ConfigError
    from theseus.model.models.qwen4_exp.hf import Qwen4ExpTextFamily

    config = hf_config("qwen4_exp_text").to_dict()
    family = Qwen4ExpTextFamily()
    keys = family.keys(config)
    assert keys["architecture/layer_types"] == ["linear_attention", "full_attention"]
    assert (keys["architecture/hc_count"], keys["architecture/ple_layer_ids"], keys["architecture/ngram_eos_id"]) == (
        3,
        [1],
        256,
    )
    assert (keys["architecture/indexer_budget"], keys["architecture/partial_rotary_factor"]) == (4, 0.25)
    with pytest.raises(ConfigError) as refused:
        family.keys({**config, **values})
    assert message in str(refused.value) and "\n" not in str(refused.value)
