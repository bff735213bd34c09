"""What the docs-flow tests share: the pages' flows, the files the flows start from, and readers of
what the flows leave behind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from tests.conftest import REPO
from tests.docs.doc_flows import Shell, page_flows
from tests.finetune.conftest import conversations
from tests.huggingface.conftest import save_model
from tests.models.conftest import forward
from tests.tracking.readers import jsonl_scalars

CHAT_PROMPT = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
MODEL_VOCAB = 320  # the models' vocabularies are padded beyond their tokenizers', as real checkpoints' are


def flows(page: str) -> dict[str, Any]:
    return page_flows(REPO / page)


def chat_rows() -> list[dict[str, Any]]:
    """Short conversations; every eighth is marked for the validation split (``"split": "val"``)."""
    rows = conversations(64)
    for index, row in enumerate(rows):
        if index % 8 == 7:
            row["split"] = "val"
    return rows


def save_bpe_tokenizer(folder: Path, texts: list[str], *, vocab_size: int, bos: bool) -> int:
    """A byte-level BPE trained on ``texts`` (``<|endoftext|>`` = 0, ``<s>`` = 1), saved as a
    transformers fast tokenizer; with ``bos`` every text starts with ``<s>``, as Llama's does."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    if bos:
        tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", bos_token="<s>" if bos else "<|endoftext|>"
    )
    fast.save_pretrained(folder)
    return tokenizer.get_vocab_size()


def copy_into(shell: Shell, sources: Path, *names: str, rename: dict[str, str] | None = None) -> None:
    for name in names:
        target = shell.cwd / (rename or {}).get(name, name)
        if (sources / name).is_dir():
            shutil.copytree(sources / name, target)
        else:
            shutil.copy(sources / name, target)


def train_losses(run_dir: Path) -> list[tuple[int, float]]:
    return jsonl_scalars(run_dir)["train/loss"]


def theseus_logits(root: Path, run: str, ids: np.ndarray) -> np.ndarray:
    """The logits of run ``run``'s latest checkpoint, loaded with theseus's own run loading."""

    from theseus.model.generation import load_run

    loaded = load_run(root, run)
    return np.asarray(forward(loaded.model, loaded.params, ids), dtype=np.float32)


def write_sources(folder: Path) -> Path:
    """``gpt2/`` and ``llama/`` (random 2-layer, 32-wide models, save_pretrained, BPE tokenizers)
    and ``chat.jsonl``: what the fine-tuning and Hugging Face pages start from."""
    rows = chat_rows()
    (folder / "chat.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    texts = [m["content"] for row in rows for m in row["messages"]] + [CHAT_PROMPT, "The meaning of life"]
    # the special ids of the tokenizers below: <|endoftext|> = 0 ends texts, Llama's texts start with <s> = 1
    gpt2 = {"n_positions": 128, "bos_token_id": 0, "eos_token_id": 0}
    llama = {"max_position_embeddings": 128, "bos_token_id": 1, "eos_token_id": 0}
    save_model(folder / "gpt2", "gpt2", tokenizer=False, vocab_size=MODEL_VOCAB, **gpt2)
    save_model(folder / "llama", "llama", tokenizer=False, vocab_size=MODEL_VOCAB, **llama)
    assert save_bpe_tokenizer(folder / "gpt2", texts, vocab_size=300, bos=False) == 300
    assert save_bpe_tokenizer(folder / "llama", texts, vocab_size=280, bos=True) == 280
    return folder
