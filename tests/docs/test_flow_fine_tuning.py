"""docs/fine-tuning.md's GPT-2 and Llama flows, as written, in one working directory."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import CHAT_PROMPT, MODEL_VOCAB, copy_into, flows, theseus_logits, train_losses
from tests.huggingface.conftest import hf_logits


@pytest.fixture(scope="module")
def fine_tuned(sources: Path, tmp_path_factory: pytest.TempPathFactory) -> Shell:
    """docs/fine-tuning.md's flows in page order in one working directory: GPT-2, then Llama."""
    shell = Shell.create(tmp_path_factory.mktemp("doc-flow-fine-tuning"))
    copy_into(shell, sources, "gpt2", "llama", "chat.jsonl")
    page = flows("docs/fine-tuning.md")
    shell.run(page["gpt2"])
    shell.run(page["llama"])
    return shell


@pytest.mark.slow
@pytest.mark.parametrize(
    ("base", "run", "adapter", "merged"),
    [("gpt2", "chat-gpt2", "adapter", "merged"), ("llama", "chat-llama", "llama-adapter", "llama-merged")],
)
def test_fine_tuning_exports_match_peft_and_theseus(
    fine_tuned: Shell, base: str, run: str, adapter: str, merged: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(fine_tuned.cwd)  # the page's relative paths, as its reader uses them
    run_dir = fine_tuned.root / "runs" / run
    command = f"theseus run train/sft training/init_from=hf:./{base}"  # the source decides the model
    assert f"trained '{run}' to step 20/20" in fine_tuned.result(command).output
    config = (run_dir / "config.yaml").read_text()
    assert "rank: 8" in config and "n_layers: 2" in config and "n_embd: 32" in config  # from hf:./{base}

    # the fine-tuning learned: the last training loss is below the first
    losses = train_losses(run_dir)
    assert [step for step, _ in losses] == [1, 10, 20]
    assert losses[-1][1] < losses[0][1] - 0.01, losses

    # ./adapter on ./base (the page's peft call), ./merged alone and the run itself: the same model
    assert sorted(p.name for p in Path(adapter).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    ids = np.random.default_rng(1).integers(0, 280, (2, 16))
    with torch.no_grad():
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(f"./{base}"), f"./{adapter}").eval()
        adapted = hf_logits(peft, ids)
    plain, info = AutoModelForCausalLM.from_pretrained(f"./{merged}", output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    ours = theseus_logits(fine_tuned.root, run, ids)
    base_logits = hf_logits(AutoModelForCausalLM.from_pretrained(f"./{base}").eval(), ids)
    assert adapted.shape == ours.shape == (2, 16, MODEL_VOCAB)
    assert np.max(np.abs(adapted - hf_logits(plain.eval(), ids))) <= 1e-4
    assert np.max(np.abs(adapted - ours)) <= 1e-4
    assert np.max(np.abs(adapted - base_logits)) > 1e-2  # the adapters changed the model: not a vacuous match


@pytest.mark.slow
def test_fine_tuning_chat_generation_and_data(fine_tuned: Shell) -> None:
    generated = fine_tuned.result("theseus run generate generate/run=chat-gpt2")
    assert generated.stdout.startswith(CHAT_PROMPT) and len(generated.stdout) > len(CHAT_PROMPT)
    assert f"chat prompt {CHAT_PROMPT!r}" in generated.stderr
    # each checkpoint's chat data, tokenized with its own tokenizer, masks included
    for name, base in [("chat", "gpt2"), ("chat-llama", "llama")]:
        data = fine_tuned.root / "data" / name
        assert (data / "tokenizer.json").read_bytes() == (fine_tuned.cwd / base / "tokenizer.json").read_bytes()
        assert (data / "train.mask").is_file()
    preparations = [r for r in fine_tuned.results if r.step.text.startswith("theseus run data/tokenize")]
    assert len(preparations) == 2
    for preparation, name in zip(preparations, ["chat", "chat-llama"], strict=True):
        assert re.search(rf"prepared {name}: train [\d,]+ tokens .*, val [\d,]+ tokens", preparation.output)
    # the run keeps its own copy of the tokenizer: preparing the data again cannot break it
    recorded = json.loads((fine_tuned.root / "runs" / "chat-gpt2" / "provenance.json").read_text())["tokenizer"]
    copy = fine_tuned.root / "runs" / "chat-gpt2" / "tokenizer" / "tokenizer.json"
    assert (
        recorded["path"] == str(copy) and copy.read_bytes() == (fine_tuned.cwd / "gpt2" / "tokenizer.json").read_bytes()
    )
