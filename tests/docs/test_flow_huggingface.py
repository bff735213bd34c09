"""docs/huggingface.md's local-folder flow, as written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import copy_into, flows, theseus_logits, train_losses
from tests.huggingface.conftest import hf_logits


@pytest.mark.slow
def test_huggingface_local_folder_flow(sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, AutoTokenizer

    shell = Shell.create(tmp_path / "work")
    copy_into(shell, sources, "llama", rename={"llama": "my-llama"})
    shell.run(flows("docs/huggingface.md")["local-folder"])
    runs = shell.root / "runs"

    imported = runs / "llama"
    assert (imported / "checkpoints" / "0").is_dir() and (imported / "tokenizer" / "tokenizer.json").is_file()
    assert "imported llama (2 layers, 32 wide" in shell.result("theseus run hf/import").output

    generated = shell.result("theseus run generate")
    assert generated.stdout.startswith("The meaning of life") and len(generated.stdout.strip()) > 20
    assert "greedy" in generated.stderr

    # the run starts from the imported weights, with the checkpoint's architecture
    assert "trained 'llama-finetuned' to step 20/20" in shell.result("theseus run train/pretrain").output
    config = (runs / "llama-finetuned" / "config.yaml").read_text()
    assert all(f"{key}: 2" in config for key in ("n_layers", "n_kv_heads")) and "init_from: run:llama" in config
    losses = train_losses(runs / "llama-finetuned")
    assert [step for step, _ in losses] == [1, 10, 20]

    # ./export: bfloat16, one safetensors file (below 2GB), loads in transformers with every key
    monkeypatch.chdir(shell.cwd)
    export = Path("export")
    assert json.loads((export / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (export / "model.safetensors.index.json").exists()
    with safe_open(export / "model.safetensors", framework="pt") as weights:
        assert {weights.get_tensor(key).dtype for key in weights.keys()} == {torch.bfloat16}  # noqa: SIM118
    model, info = AutoModelForCausalLM.from_pretrained("./export", output_loading_info=True, dtype=torch.float32)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    tokenizer = AutoTokenizer.from_pretrained("./export")
    assert (
        tokenizer("The meaning of life").input_ids
        == AutoTokenizer.from_pretrained("./my-llama")("The meaning of life").input_ids
    )
    ids = np.random.default_rng(2).integers(0, 280, (2, 12))
    ours = theseus_logits(shell.root, "llama-finetuned", ids)
    exported = hf_logits(model.eval(), ids)
    source = hf_logits(AutoModelForCausalLM.from_pretrained("./my-llama").eval(), ids)
    tolerance = 0.05 * np.max(np.abs(ours))  # bfloat16 weights: about 1.5 % measured
    assert np.max(np.abs(exported - ours)) <= tolerance
    assert np.max(np.abs(source - ours)) > tolerance  # the export holds the trained weights, not the source's
