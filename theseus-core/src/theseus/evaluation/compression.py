"""Bits per byte of a whole split, scored the way a compressor would code it.

Every token of the split is predicted once, in order, from the tokens before it: windows of the
trainer's sequence length slide along the split by ``stride`` tokens, and each window scores only its
last ``stride`` targets, so every token scored after the first window sees more than
``sequence_length - stride`` tokens of context (the first window scores all of its targets). The
summed negative log-likelihood, in bits, is divided by the number of UTF-8 bytes the scored tokens
stand for, which makes the figure comparable across tokenizers and with ``gzip`` or ``xz`` run on
the same text. End-of-text markers between documents are predicted too, and their bits counted,
but they stand for no bytes (a compressor given the concatenated files codes no separator), so the
figure errs on the strict side.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from theseus.config import field
from theseus.errors import ConfigError, DataError
from theseus.evaluation.base import Evaluation
from theseus.evaluation.scoring import Row, score_rows

#: Forward passes (of ``trainer.eval_rows`` windows each) whose rows are built at a time.
WINDOW_BATCHES = 64

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


def sliding_windows(tokens: int, length: int, stride: int) -> list[tuple[int, int]]:
    """``(start, first_scored)`` of each window over a split of ``tokens`` tokens.

    A window's inputs are tokens ``start .. start + length - 1`` and its targets the tokens one
    further; it scores targets ``first_scored .. start + length`` (those not scored before). Token 0
    has no context and is never a target; every other token is scored exactly once.
    """
    if length < 1 or not 1 <= stride <= length:
        raise ValueError(f"windows need length >= 1 and 1 <= stride <= length, got {length} and {stride}")
    windows = []
    scored = 1  # the next target to score
    last = tokens - 1
    while scored <= last:
        end = min(scored + stride - 1, last)  # the last target of this window
        start = max(0, end - length)
        windows.append((start, scored))
        scored = min(start + length, last) + 1
    return windows


def window_row(tokens: np.ndarray, start: int, first_scored: int, length: int) -> Row:
    """Inputs, targets (-1 where not scored) and padding mask of one window, padded to ``length``."""
    piece = np.asarray(tokens[start : start + length + 1], dtype=np.int32)
    n = len(piece) - 1
    x = np.zeros(length, np.int32)
    y = np.full(length, -1, np.int32)
    mask = np.zeros(length, bool)
    x[:n], mask[:n] = piece[:-1], True
    targets = np.arange(start + 1, start + 1 + n)
    y[:n] = np.where(targets >= first_scored, piece[1:], -1)
    return x, y, mask


def scored_bytes(tokenizer: Any, tokens: np.ndarray) -> int:
    """UTF-8 bytes that ``tokens`` stand for, decoded a document at a time (end-of-text: no bytes)."""
    eot = int(tokenizer.eot_id)
    size, begin = 0, 0
    for end in [*np.flatnonzero(tokens == eot).tolist(), len(tokens)]:
        if end > begin:
            size += len(tokenizer.decode(int(t) for t in tokens[begin:end]).encode("utf-8"))
        begin = end + 1
    return size


@dataclass
class Compression(Evaluation):
    """Bits per byte over a whole split of the trainer's first dataset (or ``dataset``), every token
    scored once with at least ``sequence_length - stride`` tokens of context."""

    name: ClassVar[str] = "compression"

    split: str = field("evaluation/compression/split", default="val", help="data split to score")
    dataset: str = field(
        "evaluation/compression/dataset", default="", help="prepared dataset to score ('' = the trainer's first)"
    )
    stride: int = field(
        "evaluation/compression/stride", default=0, min=0, help="tokens scored per window (0 = half the window)"
    )
    max_tokens: int = field(
        "evaluation/compression/max_tokens", default=0, min=0, help="score only the split's first N tokens (0 = all)"
    )

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        from theseus.data.format import Prepared

        length = trainer.sequence_length
        stride = self.stride or max(1, length // 2)
        if stride > length:
            raise ConfigError(
                f"evaluation/compression/stride={stride} exceeds the sequence length {length}; "
                "choose a stride of at most the sequence length"
            )
        name = self.dataset or self._first_dataset(trainer)
        prepared = Prepared.open(trainer.context.root, name)
        if self.split not in prepared.splits:
            raise DataError(
                f"dataset {name!r} has no {self.split!r} split (it has {', '.join(prepared.splits)}); "
                "set evaluation/compression/split"
            )
        vocab = trainer.setting("architecture/vocab_size")
        if vocab is not None and prepared.header.vocab_size > int(vocab):
            raise DataError(
                f"dataset {name!r} has {prepared.header.vocab_size} token ids but the model only "
                f"architecture/vocab_size={vocab}; score data of the model's tokenizer (evaluation/compression/dataset)"
            )
        tokens = prepared.tokens(self.split)
        if self.max_tokens:
            tokens = tokens[: self.max_tokens]
        if len(tokens) < 2:
            raise DataError(
                f"split {self.split!r} of dataset {name!r} gives {len(tokens)} token(s) to score "
                f"(evaluation/compression/max_tokens={self.max_tokens}); at least two are needed"
            )
        windows = sliding_windows(len(tokens), length, stride)
        nats, scored = 0.0, 0
        chunk = trainer.eval_rows * WINDOW_BATCHES  # rows built at a time, so memory stays bounded
        for begin in range(0, len(windows), chunk):
            rows = [window_row(tokens, start, first, length) for start, first in windows[begin : begin + chunk]]
            loglik, counts = score_rows(trainer, state, rows)
            nats -= float(np.sum(loglik, dtype=np.float64))
            scored += int(np.sum(counts))
        size = scored_bytes(prepared.tokenizer(), np.asarray(tokens[1:]))
        return {"bits_per_byte": nats / math.log(2) / max(size, 1), "bytes": size, "targets": scored}

    @staticmethod
    def _first_dataset(trainer: BaseTrainer) -> str:
        try:
            return trainer.dataset_names()[0]
        except (IndexError, TypeError, DataError) as exc:
            raise ConfigError(
                f"{type(trainer).__qualname__} declares no dataset to score; set evaluation/compression/dataset"
            ) from exc
