"""``environment/reverse`` and ``reward/reversed``: reverse a word, a reinforcement-learning task.

The environment is an ``Environment`` dataclass with its own keys; the reward is a plain function.
Neither imports jax, so listing them stays fast.
"""

from __future__ import annotations

import random
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.rl.answers import tagged
from theseus.rl.environment import Environment, Prompt, generate


@dataclass
class ReverseWord(Environment):
    """``Reverse the word 'abc'.``: random lowercase words; ``metadata["answer"]`` is the reversal."""

    name: ClassVar[str] = "reverse"
    REWARDS: ClassVar[dict[str, float]] = {"reversed": 1.0, "format": 0.1}
    ACCURACY: ClassVar[str | None] = "reversed"

    min_length: int = field("environment/reverse/min_length", default=3, min=1, help="shortest word")
    max_length: int = field("environment/reverse/max_length", default=6, min=1, help="longest word")
    eval_fraction: float = field(
        "environment/reverse/eval_fraction", default=0.1, above=0.0, below=1.0, help="share of words held out"
    )

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return generate(self.name, self.word, split, seed, step, count, self.eval_fraction)

    def word(self, draw: random.Random) -> Prompt:
        length = draw.randint(self.min_length, max(self.min_length, self.max_length))
        word = "".join(draw.choice(string.ascii_lowercase) for _ in range(length))
        text = f"Reverse the word '{word}'. Give the result inside <answer></answer>."
        return Prompt(text, {"answer": word[::-1], "word": word})


def reversed_word(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """1.0 when the answer tag (else the last word of the completion) is the reversed word."""
    scores = []
    for completion, meta in zip(completions, metadata, strict=True):
        found = tagged(completion)
        words = completion.split()
        answer = found if found is not None else (words[-1] if words else "")
        scores.append(1.0 if answer.strip().strip(".'\"") == meta["answer"] else 0.0)
    return scores
