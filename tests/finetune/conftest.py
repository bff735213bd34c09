"""Fine-tuning test helpers: prepared chat data (byte tokens) and tiny SFT settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: A tiny GPT fine-tuned with LoRA on packed chat rows of 64 tokens.
TINY_SFT: dict[str, Any] = {
    "architecture/n_layers": 2,
    "architecture/n_heads": 2,
    "architecture/n_embd": 32,
    "architecture/block_size": 64,
    "model/lora/rank": 4,
    "model/lora/targets": ["query", "value", "out", "up", "down"],
    "training/steps": 4,
    "training/batch_size": 4,
    "training/lr": 1e-2,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/peak_flops": 1e12,
    "training/compilation_cache": False,
}


def conversations(count: int, seed: int = 0) -> list[dict[str, Any]]:
    """Short chat rows: an optional system message, then one or two user/assistant exchanges."""
    rng = np.random.default_rng(seed)
    words = ["hi", "cat", "sun", "two", "red", "yes", "no", "why", "tea", "map"]
    rows = []
    for i in range(count):
        messages: list[dict[str, str]] = []
        if i % 3 == 0:
            messages.append({"role": "system", "content": "be brief"})
        for _ in range(int(rng.integers(1, 3))):
            messages.append({"role": "user", "content": " ".join(rng.choice(words, size=int(rng.integers(1, 4))))})
            messages.append({"role": "assistant", "content": " ".join(rng.choice(words, size=int(rng.integers(1, 5))))})
        rows.append({"messages": messages})
    return rows


def prepare_chat(root: Path, count: int = 48, template: str = "plain") -> None:
    """Prepared ``chat`` data under ``root`` (byte tokenizer, plain template, train and val)."""
    from theseus.config import configuration, configure
    from theseus.data.datasets import Chat
    from theseus.data.prepare import prepare

    path = root / "chat.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in conversations(count)))
    values = {"data/chat/path": str(path), "data/chat/template": template, "data/val_fraction": 0.125}
    with configuration(values):
        dataset = configure(Chat)
    prepare(dataset, root, tokenizer="byte")


@pytest.fixture(scope="session")
def chat_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-root")
    prepare_chat(root)
    return root


#: Settings of a tiny GPT tuned on preference pairs (8 rows = 4 pairs per step, rows of 48 tokens).
TINY_DPO: dict[str, Any] = {
    **{k: v for k, v in TINY_SFT.items() if not k.startswith("model/lora/")},
    "architecture/block_size": 48,
    "training/batch_size": 8,
    "training/lr": 3e-3,
}


def preference_rows(count: int, seed: int = 0, conversational: bool = False) -> list[dict[str, Any]]:
    """Pairs whose preferred answers share a learnable pattern: chosen answers start with "sure",
    rejected ones with "nope"; every eighth row is marked for the validation split."""
    rng = np.random.default_rng(seed)
    words = ["hi", "cat", "sun", "two", "red", "why", "tea", "map"]
    rows: list[dict[str, Any]] = []
    for index in range(count):
        question = " ".join(rng.choice(words, size=2))
        chosen = "sure " + " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
        rejected = "nope " + " ".join(rng.choice(words, size=int(rng.integers(1, 4))))
        row: dict[str, Any]
        if conversational:
            row = {
                "prompt": [{"role": "user", "content": question}],
                "chosen": [{"role": "assistant", "content": chosen}],
                "rejected": [{"role": "assistant", "content": rejected}],
            }
        else:
            row = {"prompt": f"Q: {question}\nA: ", "chosen": chosen, "rejected": rejected}
        if index % 8 == 7:
            row["split"] = "val"
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def prepare_preferences(root: Path, count: int = 64, conversational: bool = False) -> None:
    """Prepared ``preference`` data under ``root`` (byte tokenizer; conversational rows: plain template)."""
    from theseus.config import configuration, configure
    from theseus.data.datasets import Preference
    from theseus.data.prepare import prepare

    path = write_jsonl(root / "preferences.jsonl", preference_rows(count, conversational=conversational))
    with configuration({"data/preference/path": str(path), "data/preference/template": "plain"}):
        dataset = configure(Preference)
    prepare(dataset, root, tokenizer="byte")
