"""``environment/guess`` and ``reward/guessed``: find a hidden number from hints, a multi-turn task.

The policy writes a guess, ``<guess>9</guess>``; its turn ends there (``STOP``) and the environment
answers ``<hint>higher</hint>``, ``<hint>lower</hint>`` or ``<hint>correct</hint>``; the episode ends
at the right number (``respond`` returns None) or at ``rl/max_turns``. The reward is 1 for finding
the number in one guess, 1/2 in two, and so on, and 0 when the last guess is wrong.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.rl.environment import Environment, Prompt, generate

GUESS = re.compile(r"<guess>\s*(\d+)\s*</guess>")


def guesses(text: str) -> list[int]:
    """The numbers guessed in ``text``, in order."""
    return [int(n) for n in GUESS.findall(text)]


@dataclass
class GuessNumber(Environment):
    """``Guess the number from 1 to 16.``: ``metadata["answer"]`` is the hidden number."""

    name: ClassVar[str] = "guess"
    REWARDS: ClassVar[dict[str, float]] = {"guessed": 1.0}
    ACCURACY: ClassVar[str | None] = None
    STOP: ClassVar[tuple[str, ...]] = ("</guess>",)

    largest: int = field("environment/guess/largest", default=16, min=2, help="numbers are 1 to this")
    eval_fraction: float = field(
        "environment/guess/eval_fraction", default=0.2, above=0.0, below=1.0, help="share of numbers held out"
    )

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return generate(self.name, self.number, split, seed, step, count, self.eval_fraction)

    def number(self, draw: random.Random) -> Prompt:
        hidden = draw.randint(1, self.largest)
        wording = draw.choice(("Guess the number", "Find the hidden number"))
        text = f"{wording} from 1 to {self.largest}. Write <guess>N</guess>; a <hint> follows each guess."
        return Prompt(text, {"answer": str(hidden)})

    def respond(self, prompt: Prompt, transcript: Sequence[Mapping[str, str]]) -> str | None:
        """A hint on the last guess; None (the episode ends) when it is right or there is none."""
        found = guesses(transcript[-1]["content"]) if transcript else []
        if not found or found[-1] == int(prompt.metadata["answer"]):
            return None
        return "<hint>higher</hint>" if found[-1] < int(prompt.metadata["answer"]) else "<hint>lower</hint>"


def guessed(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """1 / (guesses made) when the last guess is the hidden number, else 0."""
    scores = []
    for completion, meta in zip(completions, metadata, strict=True):
        found = guesses(completion)
        scores.append(1.0 / len(found) if found and found[-1] == int(meta["answer"]) else 0.0)
    return scores
