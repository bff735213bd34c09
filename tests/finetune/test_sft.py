"""The SFT job with LoRA end to end: only adapters train, optimizer state for adapters only, merged
equals unmerged, adapter-only checkpoints, bit-exact kill/resume, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.conftest import clean_env
from tests.finetune.conftest import TINY_SFT, prepare_chat
from tests.models.conftest import forward
from tests.reliability.conftest import call_cli, error_line
from theseus.config import configuration, configure
from theseus.model.finetune import SFTTrainer
from theseus.model.layers import lora
from theseus.model.models import GPT
from theseus.training.adapters import prune, tree_bytes

pytestmark = pytest.mark.slow

SETTINGS = {**TINY_SFT, "training/checkpoint_interval": 2, "training/keep_checkpoints": 0}


def cli_settings(values: dict[str, Any]) -> list[str]:
    def text(value: Any) -> str:
        if value is None:
            return "null"
        if isinstance(value, list):
            return "[" + ",".join(value) + "]"
        return str(value).lower() if isinstance(value, bool) else str(value)

    return [f"{key}={text(value)}" for key, value in values.items()]


def leaves(tree: Any) -> dict[str, np.ndarray]:
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {jax.tree_util.keystr(path): np.asarray(leaf) for path, leaf in flat}


def read_checkpoint(run: Path, step: int) -> Any:
    import orbax.checkpoint as ocp

    with ocp.PyTreeCheckpointer() as checkpointer:
        return checkpointer.restore(run / "checkpoints" / str(step) / "state")


def import_base(root: Path, folder: Path) -> None:
    """A tiny random GPT-2 saved by transformers, imported as run ``base``."""
    from tests.huggingface.conftest import save_model

    save_model(folder, "gpt2", vocab_size=257, n_positions=64, n_embd=32, n_layer=2, n_head=2, tokenizer=False)
    assert call_cli(["run", "hf/import", "--root", str(root), f"hf/source={folder}", "run/name=base"]) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """LoRA fine-tuning of an imported GPT-2 on packed chat data (4 steps, checkpoints every 2)."""
    root = tmp_path_factory.mktemp("sft-root")
    prepare_chat(root)
    import_base(root, tmp_path_factory.mktemp("hf-gpt2"))
    settings = {**SETTINGS, "training/init_from": "run:base"}
    trainer = SFTTrainer.create(root, {**settings, "run/name": "reference"})
    initial = leaves(trainer.init_state().params)
    trainer.run()
    return {"root": root, "trainer": trainer, "initial": initial, "settings": settings}


def test_only_adapters_train_and_the_optimizer_holds_state_for_them_alone(trained: dict[str, Any]) -> None:
    trainer = trained["trainer"]
    after = leaves(trainer.state.params)
    initial = trained["initial"]
    base = [k for k in after if "lora_" not in k]
    adapted = [k for k in after if "lora_" in k]
    assert base and adapted
    for key in base:
        assert after[key].tobytes() == initial[key].tobytes(), f"{key} changed"
    assert any(after[k].tobytes() != initial[k].tobytes() for k in adapted if "lora_b" in k)

    adapter_bytes = tree_bytes(prune(trainer.state.params))
    moments = sum(leaf.nbytes for leaf in jax.tree.leaves(trainer.state.opt_state) if np.ndim(leaf) > 0)
    assert moments == 2 * adapter_bytes  # AdamW's two moments, for the adapters only
    assert tree_bytes(trainer.state.params) > 5 * adapter_bytes

    saved = read_checkpoint(trained["root"] / "runs" / "reference", 4)
    assert set(leaves(saved["params"])) == set(adapted)  # the checkpoint holds the adapters, not the base


def test_merged_model_equals_the_adapted_model(trained: dict[str, Any]) -> None:
    trainer = trained["trainer"]
    x = np.random.default_rng(1).integers(0, 257, size=(2, 24)).astype(np.int32)
    adapted = forward(trainer.model, trainer.state.params, x)
    plain_values = {k: v for k, v in trainer.context.config.items() if k.startswith("architecture/")}
    with configuration(plain_values):
        plain = configure(GPT)
    merged = trainer.merged_params()
    assert not lora.adapter_names(merged)
    logits = forward(plain, merged, x)
    np.testing.assert_allclose(logits, adapted, atol=1e-5, rtol=0)
    base = forward(plain, lora.merge(trainer.state.params, 16.0, 0), x)
    assert np.max(np.abs(base - adapted)) > 1e-4  # the trained adapters do change the model


def test_killed_sft_run_resumes_bit_exact(trained: dict[str, Any]) -> None:
    root = trained["root"]
    command = [sys.executable, "-m", "theseus.cli.main", "run", "train/sft", "--root", str(root)]
    command += cli_settings({**trained["settings"], "run/name": "killed"})
    killed = subprocess.run(command, env=clean_env(THESEUS_TEST_KILL_AT="step:3"), capture_output=True, text=True)
    assert killed.returncode == -9, killed.stderr
    assert (root / "runs" / "killed" / "checkpoints" / "2").is_dir()
    resumed = subprocess.run(command, env=clean_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run 'killed' from step 2" in resumed.stderr + resumed.stdout
    final = leaves(read_checkpoint(root / "runs" / "killed", 4))
    reference = leaves(read_checkpoint(root / "runs" / "reference", 4))
    assert final.keys() == reference.keys()
    for key in reference:
        assert final[key].tobytes() == reference[key].tobytes(), key


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"model/lora/targets": ["gate"]}, "model/lora/targets 'gate' match no layer of GPT"),
        ({"model/lora/rank": 64}, "model/lora/rank=64 is larger than the 'query' projection allows (32 -> 32)"),
        ({"model/lora/targets": ["qkv"]}, "'qkv', which is no projection"),
        (
            {"model/lora/rank": 0, "model/quantize": "nf4"},
            "model/quantize=nf4 quantizes a frozen base and needs LoRA adapters to train; set model/lora/rank>0",
        ),
    ],
    ids=["no-layer", "rank-too-large", "unknown-target", "quantize-without-lora"],
)
def test_bad_lora_settings_are_one_line_errors(
    chat_root: Path, capsys: pytest.CaptureFixture[str], overrides: dict[str, Any], message: str
) -> None:
    capsys.readouterr()
    code = call_cli(["run", "train/sft", "--root", str(chat_root), *cli_settings({**TINY_SFT, **overrides})])
    line = error_line(capsys.readouterr().err)
    assert code == 2
    assert message in line


def test_peft_adapter_and_merged_export_match_the_model_in_transformers(
    trained: dict[str, Any], tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, trainer = trained["root"], trained["trainer"]
    exports = {"base": "hf/export", "reference": "hf/export", "adapter": "hf/export-adapter"}
    for name, job in exports.items():
        run = "reference" if name == "adapter" else name
        assert call_cli(["run", job, "--root", str(root), f"hf/run={run}", f"hf/out={tmp_path / name}"]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["base_model_name_or_path"] == "base"
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()

    x = np.random.default_rng(2).integers(0, 257, size=(2, 20)).astype(np.int32)
    ours = forward(trainer.model, trainer.state.params, x)
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "base", attn_implementation="eager")
    adapted = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        peft_logits = adapted(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "reference", attn_implementation="eager").eval()
        merged_logits = merged(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
    assert np.max(np.abs(peft_logits - ours)) <= 1e-4
    assert np.max(np.abs(merged_logits - ours)) <= 1e-4


def test_generation_renders_the_prompt_as_a_user_message(
    trained: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    args = ["run", "generate", "--root", str(trained["root"]), "generate/run=reference", "generate/chat=true"]
    args += ["generate/prompt=hi", "generate/max_new_tokens=2", "generate/temperature=0"]
    assert call_cli(args) == 0
    err = capsys.readouterr().err
    assert "chat prompt 'User: hi\\nAssistant: '" in err
