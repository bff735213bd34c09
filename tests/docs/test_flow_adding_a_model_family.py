"""docs/adding-a-model-family.md's olmo3 flow, as written: a tiny random OLMo 3 checkpoint imported,
trained for three steps, exported and loaded back in transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows, train_losses


@pytest.mark.slow
def test_adding_a_model_family_olmo3_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    shell.run(flows("docs/adding-a-model-family.md")["olmo3"])
    runs = shell.root / "runs"

    assert "imported olmo3 (4 layers, 32 wide, vocabulary 320)" in shell.result("theseus run hf/import").output
    imported = (runs / "olmo3" / "config.yaml").read_text()
    assert "- sliding_attention" in imported and "- full_attention" in imported and "sliding_window: 16" in imported

    # no model= on the command line: the run trains the OLMo3 its source holds
    assert "trained 'olmo3-trained' to step 3/3" in shell.result("theseus run train/pretrain").output
    trained = (runs / "olmo3-trained" / "config.yaml").read_text()
    assert "init_from: run:olmo3" in trained and "  model: olmo3\n" in trained
    assert [step for step, _ in train_losses(runs / "olmo3-trained")][-1] == 3

    exported = json.loads((shell.cwd / "olmo3-out" / "config.json").read_text())
    assert (exported["model_type"], exported["architectures"]) == ("olmo3", ["Olmo3ForCausalLM"])
    assert exported["layer_types"] == ["sliding_attention"] * 3 + ["full_attention"]
    loaded = shell.results[-1].stdout
    assert "Olmo3ForCausalLM ['sliding_attention', 'sliding_attention', 'sliding_attention', 'full_attention'] 16" in (
        loaded
    )
