"""GRPO from a Hugging Face checkpoint (``training/init_from=hf:DIR``): prompts rendered with its chat template
and read with its tokenizer (the ids transformers gives), completions ending at its end-of-turn and
end-of-text ids, LoRA and full fine-tuning with a frozen reference for the KL, a theseus run of the same
weights rolling out the same first batch, and exports that transformers and peft load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.conftest import call_cli
from tests.rl.chat_checkpoint import END_OF_TEXT, END_OF_TURN, save_chat_checkpoint
from tests.rl.test_grpo import LETTERS, train_rows, untimed
from theseus.errors import DataError

#: 2 prompts x 4 completions of up to 8 tokens, rendered with the checkpoint's chat template (rl/chat unset
#: follows the checkpoint, which has one).
ARGS = [
    "environment=letters",
    "training/sequence_length=96",
    "training/batch_size=8",
    "rl/group_size=4",
    "rl/max_new_tokens=8",
    "training/lr=1e-2",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/progress=false",
    "training/plots=false",
    "training/peak_flops=1e12",
]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    folder = tmp_path_factory.mktemp("qwen3-chat")
    return folder, save_chat_checkpoint(folder)


def grpo(source: str, *extra: str) -> int:
    return call_cli(["--load", str(LETTERS), "run", "train/grpo", f"training/init_from={source}", *ARGS, *extra])


def theseus(root: Path, *args: str) -> int:
    return call_cli(["run", *args, "--root", str(root)])


def test_prompts_use_the_checkpoint_template_tokenizer_and_stop_ids(
    checkpoint: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from theseus.model.huggingface.init_source import hf_source
    from theseus.model.rl.prompts import policy_text
    from theseus.rl.environment import Prompt

    folder, ids = checkpoint
    text = policy_text(f"hf:{folder}", tmp_path, hf_source(str(folder), f"hf:{folder}").tokenizer, chat=True)
    prompt = Prompt("Compute 12 + 7.", {}, system="Answer in tags.")
    expected = AutoTokenizer.from_pretrained(folder).apply_chat_template(
        prompt.messages, add_generation_prompt=True, tokenize=True
    )
    assert text.encode(prompt) == list(getattr(expected, "input_ids", expected))
    assert text.stop_ids == (ids[END_OF_TURN], ids[END_OF_TEXT])  # generation_config.json's eos_token_id list

    # transformers 5 saves the template as chat_template.jinja beside tokenizer_config.json
    moved = tmp_path / "jinja"
    jinja_checkpoint(folder, moved)
    text = policy_text(f"hf:{moved}", tmp_path, hf_source(str(moved), f"hf:{moved}").tokenizer, chat=True)
    assert text.encode(prompt) == list(getattr(expected, "input_ids", expected))

    # a damaged generation_config.json is named, not read as "no end-of-sequence ids"
    (moved / "generation_config.json").write_text('{"eos_token_id": [1, 2')
    with pytest.raises(DataError, match=r"generation_config.json is not readable JSON"):
        policy_text(f"hf:{moved}", tmp_path, hf_source(str(moved), f"hf:{moved}").tokenizer, chat=True)


def jinja_checkpoint(folder: Path, moved: Path) -> str:
    """A copy of the checkpoint with its template in ``chat_template.jinja``, as transformers 5 saves it; the
    template."""
    shutil.copytree(folder, moved)
    config = json.loads((moved / "tokenizer_config.json").read_text())
    template = config.pop("chat_template")
    (moved / "chat_template.jinja").write_text(template)
    (moved / "tokenizer_config.json").write_text(json.dumps(config))
    return str(template)


def test_rl_chat_unset_follows_the_checkpoint(checkpoint: tuple[Path, dict[str, int]], tmp_path: Path) -> None:
    """Without ``rl/chat`` prompts are rendered by the source's template where it has one (either file form),
    as plain text where it has none or there is no source."""
    from theseus.model.huggingface.init_source import hf_source
    from theseus.model.rl.prompts import policy_text
    from theseus.rl.environment import Prompt

    folder, _ = checkpoint
    prompt = Prompt("Compute 12 + 7.", {}, system="Answer in tags.")

    def encoded(source: Path, chat: bool | None) -> list[int]:
        spec = hf_source(str(source), f"hf:{source}").tokenizer
        return policy_text(f"hf:{source}", tmp_path, spec, chat=chat).encode(prompt)

    jinja_checkpoint(folder, tmp_path / "jinja")
    for source in (folder, tmp_path / "jinja"):
        assert encoded(source, None) == encoded(source, True) != encoded(source, False)
    plain = tmp_path / "plain"
    shutil.copytree(folder, plain)
    config = json.loads((plain / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (plain / "tokenizer_config.json").write_text(json.dumps(config))
    assert encoded(plain, None) == encoded(plain, False)
    assert policy_text("", tmp_path, None, chat=None).template is None


def test_an_hf_policy_exports_its_template_whatever_rl_chat_was(
    checkpoint: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """A run with ``rl/chat=false`` from a checkpoint whose template is in ``chat_template.jinja`` keeps that
    template, and ``hf/export`` writes it into the exported ``tokenizer_config.json``."""
    folder, _ = checkpoint
    template = jinja_checkpoint(folder, tmp_path / "jinja")
    root = ["--root", str(tmp_path)]
    assert grpo(f"hf:{tmp_path / 'jinja'}", "rl/chat=false", "training/steps=1", "run/name=plain", *root) == 0
    assert json.loads((tmp_path / "runs" / "plain" / "chat_template.json").read_text())["chat_template"] == template
    assert theseus(tmp_path, "hf/export", "hf/run=plain", f"hf/out={tmp_path / 'plain-hf'}") == 0
    assert json.loads((tmp_path / "plain-hf" / "tokenizer_config.json").read_text())["chat_template"] == template


def test_grpo_from_an_hf_checkpoint_lora_and_full_fine_tuning(
    checkpoint: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    folder, _ = checkpoint
    root = tmp_path
    common = ["training/steps=2", "--root", str(root)]
    assert grpo(f"hf:{folder}", "model/lora/rank=4", "run/name=lora", *common) == 0
    assert grpo(f"hf:{folder}", "rl/beta=0.1", "run/name=full", *common) == 0
    runs = root / "runs"
    for name in ("lora", "full"):
        rows = train_rows(runs / name)
        assert [row["step"] for row in rows] == [1, 2]
        assert all(np.isfinite(row["loss"]) and 0 < row["completion_length"] <= 9 for row in rows)
        kept = json.loads((runs / name / "chat_template.json").read_text())
        assert kept["chat_template"] == json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]
    # full fine-tuning's reference is the frozen initial policy: no divergence before the first update, some after
    full = train_rows(runs / "full")
    assert full[0]["kl"] == 0.0 and full[1]["kl"] > 1e-4, [row["kl"] for row in full]

    # the same weights as a theseus run (hf/import keeps the tokenizer and template): the same first rollout
    assert theseus(root, "hf/import", f"hf/source={folder}", "run/name=imported") == 0
    assert grpo("run:imported", "rl/beta=0.1", "run/name=from-run", "training/steps=1", "--root", str(root)) == 0
    assert untimed(train_rows(runs / "from-run")) == untimed(full[:1])

    # the trained policies export and load in transformers and peft
    assert theseus(root, "hf/export", "hf/run=full", f"hf/out={tmp_path / 'full-hf'}") == 0
    assert theseus(root, "hf/export-adapter", "hf/run=lora", f"hf/out={tmp_path / 'lora-hf'}") == 0
    base = AutoModelForCausalLM.from_pretrained(folder)
    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "full-hf")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(folder), tmp_path / "lora-hf")
    x = [[1, 40, 41, 42, 2, 201, 1, 50]]
    logits = {name: logits_of(model, x) for name, model in (("base", base), ("full", tuned), ("lora", adapted))}
    assert not np.allclose(logits["full"], logits["base"], atol=1e-4)  # trained, exported and read back
    assert not np.allclose(logits["lora"], logits["base"], atol=1e-5)


def test_qlora_grpo_and_distillation_from_an_hf_checkpoint(
    checkpoint: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    """An nf4-quantized base with LoRA adapters, and distillation with student and teacher both read from
    the checkpoint: the teacher is the student's weights, so the first step's divergence is 0."""
    folder, _ = checkpoint
    common = ["training/steps=1", "model/lora/rank=4", "--root", str(tmp_path)]
    assert grpo(f"hf:{folder}", "model/quantize=nf4", "run/name=qlora", *common) == 0
    (row,) = train_rows(tmp_path / "runs" / "qlora")
    assert np.isfinite(row["loss"]) and 0 < row["completion_length"] <= 9
    distill = ["--load", str(LETTERS), "run", "train/distill", f"training/init_from=hf:{folder}", *ARGS]
    assert call_cli([*distill, f"distill/teacher=hf:{folder}", "run/name=distilled", *common]) == 0
    (row,) = train_rows(tmp_path / "runs" / "distilled")
    assert abs(row["loss"]) < 1e-6, row


def logits_of(model: Any, ids: list[list[int]]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float().numpy()
