"""The fine-tuning flow with every path relative to the working directory: ``--root``, ``hf/source``,
``data/chat/path``, ``training/init_from=hf:`` and ``hf/out``. The CLI makes them absolute once, so a
``run:`` source under a relative root reads its checkpoint, and a later command from another working
directory still finds everything the run recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.finetune.conftest import conversations
from tests.huggingface.conftest import save_model
from tests.reliability.conftest import call_cli
from theseus.config import read_yaml

pytestmark = pytest.mark.slow

TRAIN = [
    "model/lora/rank=4",
    "model/lora/targets=[query,value]",
    "training/steps=2",
    "training/batch_size=2",
    "training/log_interval=1",
    "training/eval_interval=0",
    "training/eval_batches=0",
    "training/checkpoint_interval=0",
    "training/async_checkpoints=false",
    "training/progress=false",
    "training/compilation_cache=false",
    "training/peak_flops=1e12",
]


def test_the_fine_tuning_flow_with_relative_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    work = tmp_path / "work"
    (work / "models").mkdir(parents=True)
    save_model(
        work / "models" / "gpt2",
        "gpt2",
        vocab_size=257,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=2,
        tokenizer=False,
    )
    (work / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in conversations(24)))
    monkeypatch.chdir(work)
    root = ["--root", "state/root"]

    data = ["data/tokenize", "data/dataset=chat", "data/chat/path=chat.jsonl", "data/chat/template=plain"]
    assert call_cli(["run", *data, "data/val_fraction=0.125", *root]) == 0
    assert call_cli(["run", "hf/import", "hf/source=./models/gpt2", "run/name=base", *root]) == 0
    assert call_cli(["run", "train/sft", "training/init_from=run:base", "run/name=from-run", *TRAIN, *root]) == 0
    assert call_cli(["run", "train/sft", "training/init_from=hf:models/gpt2", "run/name=from-hf", *TRAIN, *root]) == 0
    assert call_cli(["run", "hf/export", "hf/run=from-run", "hf/out=out/merged", *root]) == 0
    assert call_cli(["run", "hf/export-adapter", "hf/run=from-hf", "hf/out=out/adapter", *root]) == 0

    runs = work / "state" / "root" / "runs"
    assert (work / "out" / "merged" / "model.safetensors").is_file()
    assert (work / "out" / "adapter" / "adapter_model.safetensors").is_file()
    config = read_yaml(runs / "from-hf" / "config.yaml")
    assert config["training/init_from"] == f"hf:{work / 'models' / 'gpt2'}"  # recorded absolute
    header = json.loads((work / "state" / "root" / "data" / "chat" / "header.json").read_text())
    assert str(work / "chat.jsonl") in json.dumps(header["source"])  # the data records where it came from

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the recorded paths still hold from another working directory
    other_root = ["--root", "../work/state/root"]
    assert call_cli(["run", "hf/export", "hf/run=from-hf", "hf/out=merged-hf", *other_root]) == 0
    assert (elsewhere / "merged-hf" / "model.safetensors").is_file()
    generate = ["generate", "generate/run=from-run", "generate/prompt=hi", "generate/max_new_tokens=4"]
    assert call_cli(["run", *generate, *other_root]) == 0
