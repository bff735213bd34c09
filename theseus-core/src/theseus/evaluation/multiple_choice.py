"""Multiple-choice accuracy: each choice scored by the log-likelihood the model gives it.

The data is JSON lines of ``{"context": str, "choices": [str, ...], "answer": int}``. A choice
is scored by the summed log-probability of its tokens after the context (``acc``) and by that
sum divided by its token count (``acc_norm``). Without a configured path a small bundled set
of everyday-knowledge questions is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from theseus.config import field
from theseus.data.json_lines import json_lines
from theseus.errors import DataError
from theseus.evaluation.base import Evaluation
from theseus.evaluation.scoring import score_rows

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer

BUNDLED = Path(__file__).with_name("data") / "everyday_choices.jsonl"


@dataclass(frozen=True)
class Question:
    context: str
    choices: tuple[str, ...]
    answer: int


def read_questions(path: Path, limit: int = 0) -> list[Question]:
    """Parse a multiple-choice JSONL file, with a one-line error for each malformed entry."""
    if not path.is_file():
        raise DataError(f"multiple-choice data {str(path)!r} does not exist; set evaluation/multiple_choice/path")
    questions = []
    for where, item in json_lines(path):
        try:
            context, choices, answer = item["context"], item["choices"], item["answer"]
        except (KeyError, TypeError) as exc:
            raise DataError(
                f"{where} is not a {{context, choices, answer}} JSON object ({type(exc).__name__}); fix the line"
            ) from exc
        if not isinstance(choices, list) or len(choices) < 2 or not isinstance(answer, int):
            raise DataError(f"{where} needs at least two choices and an integer answer")
        if not 0 <= answer < len(choices):
            raise DataError(f"{where} has answer {answer} but only {len(choices)} choices")
        questions.append(Question(str(context), tuple(str(c) for c in choices), answer))
        if limit and len(questions) >= limit:
            break
    if not questions:
        raise DataError(f"multiple-choice data {str(path)!r} holds no questions")
    return questions


def encode_choice(context: list[int], choice: list[int], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row: inputs, targets (-1 except on the choice's tokens) and padding mask.

    The context is cut from the left so that the whole choice fits into ``length`` positions.
    """
    if not choice:
        choice = [0]
    tokens = (context + choice)[-(length + 1) :]
    scored = min(len(choice), len(tokens) - 1)
    x = np.zeros(length, np.int32)
    y = np.full(length, -1, np.int32)
    mask = np.zeros(length, bool)
    n = len(tokens) - 1
    x[:n] = tokens[:-1]
    mask[:n] = True
    y[n - scored : n] = tokens[-scored:]
    return x, y, mask


@dataclass
class MultipleChoice(Evaluation):
    """Accuracy over a JSONL multiple-choice set, scoring choices by log-likelihood."""

    name: ClassVar[str] = "multiple_choice"

    path: str = field(
        "evaluation/multiple_choice/path",
        default="",
        path="file",
        help="JSONL of {context, choices, answer} ('' = bundled set)",
    )
    limit: int = field("evaluation/multiple_choice/limit", default=0, help="use only the first N questions (0 = all)")

    def questions(self) -> list[Question]:
        return read_questions(Path(self.path).expanduser() if self.path else BUNDLED, self.limit)

    def evaluate(self, trainer: BaseTrainer, state: Any) -> Mapping[str, float]:
        questions = self.questions()
        tokenizer = trainer.tokenizer()
        vocab = trainer.setting("architecture/vocab_size")
        if vocab is not None and int(tokenizer.vocab_size) > int(vocab):
            raise DataError(
                f"the tokenizer's vocabulary ({tokenizer.vocab_size}) exceeds the model's architecture/vocab_size "
                f"({vocab}); multiple-choice text cannot be scored - raise the vocabulary size"
            )
        length = trainer.sequence_length
        rows, owners = [], []
        for index, q in enumerate(questions):
            context = list(tokenizer.encode(q.context))
            for choice in q.choices:
                rows.append(encode_choice(context, list(tokenizer.encode(choice)), length))
                owners.append(index)
        loglik, counts = score_rows(trainer, state, rows)
        correct = correct_norm = 0
        start = 0
        for q in questions:
            end = start + len(q.choices)
            ll, n = loglik[start:end], np.maximum(counts[start:end], 1)
            correct += int(np.argmax(ll) == q.answer)
            correct_norm += int(np.argmax(ll / n) == q.answer)
            start = end
        total = len(questions)
        return {"acc": correct / total, "acc_norm": correct_norm / total, "questions": total}
