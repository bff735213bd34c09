"""Trainer test helpers: a tiny model trainer, prepared FineWeb-named data, quick configurations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

#: Small, fast settings shared by the tests (16 tokens/row, 8 rows, no validation or periodic work).
QUICK: dict[str, Any] = {
    "training/steps": 6,
    "training/batch_size": 8,
    "training/lr": 1e-2,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/peak_flops": 1e12,
}


def quick(**overrides: Any) -> dict[str, Any]:
    """``QUICK`` with overrides given as ``training__steps=...`` (``__`` stands for ``/``)."""
    values = dict(QUICK)
    values.update({k.replace("__", "/"): v for k, v in overrides.items()})
    return values


def write_byte_corpus(root: Path, name: str, documents: int = 64, seed: int = 0) -> None:
    """Prepared data ``name`` tokenized with the byte tokenizer (train and val splits)."""
    from theseus.data.format import PreparedWriter
    from theseus.data.tokenizers.byte import ByteTokenizer

    tokenizer = ByteTokenizer()
    rng = np.random.default_rng(seed)
    words = ["the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "slept", "quietly", "all", "day"]
    with PreparedWriter(root, name, vocab_size=tokenizer.vocab_size, eot_id=tokenizer.eot_id) as writer:
        for split, count in (("train", documents), ("val", max(8, documents // 4))):
            docs = [" ".join(rng.choice(words, size=int(rng.integers(12, 40)))) + "." for _ in range(count)]
            encoded = [np.append(np.asarray(tokenizer.encode(d), np.int64), tokenizer.eot_id) for d in docs]
            writer.append(split, np.concatenate(encoded), np.asarray([len(e) for e in encoded]), np.zeros(len(docs)))
        writer.commit(tokenizer=tokenizer.spec, style="pmd")


@pytest.fixture(scope="session")
def fineweb_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding prepared ``fineweb`` data (byte tokens), as ``theseus run data/tokenize`` leaves it."""
    root = tmp_path_factory.mktemp("fineweb-root")
    write_byte_corpus(root, "fineweb")
    return root
