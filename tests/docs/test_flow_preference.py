"""docs/fine-tuning.md's preference-tuning flow, as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import copy_into, flows, theseus_logits
from tests.finetune.conftest import preference_rows, write_jsonl
from tests.huggingface.conftest import hf_logits


@pytest.mark.slow
def test_preference_tuning_flow(sources: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/fine-tuning.md's preference flow: DPO with LoRA from ``hf:./gpt2``, then both exports."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    shell = Shell.create(tmp_path)
    copy_into(shell, sources, "gpt2")
    write_jsonl(shell.cwd / "preferences.jsonl", preference_rows(64))
    shell.run(flows("docs/fine-tuning.md")["preference"])
    monkeypatch.chdir(shell.cwd)
    prepared = shell.result("theseus run data/tokenize").output
    assert re.search(
        r"prepared preference: train [\d,]+ tokens / 112 documents, val [\d,]+ tokens / 16 documents", prepared
    )
    run_dir = shell.root / "runs" / "dpo-gpt2"
    assert "trained 'dpo-gpt2' to step 20/20" in shell.result("theseus run train/dpo").output
    train = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["split"] == "train"]
    assert train[0]["loss"] == pytest.approx(np.log(2), abs=1e-6)  # the policy starts as its reference
    assert train[-1]["rewards/margins"] > train[0]["rewards/margins"] and train[-1]["loss"] < train[0]["loss"]

    ids = np.random.default_rng(5).integers(0, 280, (2, 16))
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained("./gpt2").eval()
        base_logits = hf_logits(base, ids)
        adapted = hf_logits(PeftModel.from_pretrained(base, "./dpo-adapter").eval(), ids)
    merged, info = AutoModelForCausalLM.from_pretrained("./dpo-merged", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ours = theseus_logits(shell.root, "dpo-gpt2", ids)
    assert np.max(np.abs(adapted - ours)) <= 1e-4
    assert np.max(np.abs(hf_logits(merged.eval(), ids) - ours)) <= 1e-4
    assert np.max(np.abs(adapted - base_logits)) > 1e-3  # the tuning changed the model
