"""Training a byte-level BPE tokenizer with Hugging Face ``tokenizers``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from theseus.data.tokenizers.base import EOT_TEXT
from theseus.errors import DataError


def train_bpe(
    texts: Iterable[str],
    out: str | Path,
    *,
    vocab_size: int = 4096,
    min_frequency: int = 2,
) -> Path:
    """Train a byte-level BPE on ``texts`` and write its ``tokenizer.json`` to ``out``.

    The vocabulary holds the 256 byte symbols, ``<|endoftext|>`` and learned merges up to
    ``vocab_size`` entries; decoding reproduces any text exactly.
    """
    if vocab_size < 257 + 1:
        raise DataError(f"data/bpe/vocab_size must be above 257 (256 bytes + end-of-text), got {vocab_size}")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    out = Path(out).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, out)
    return out
