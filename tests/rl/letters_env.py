"""A test environment loaded with ``--load``: complete a fixed prompt; the reward is the share of the
completion's characters that are lower-case letters (about 10 % for a random byte model); ``odd_letters``
scores only the prompts of odd index (the others' groups have nothing to learn from)."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.registry import component
from theseus.rl.environment import Environment, Prompt


@component("environment/letters")
@dataclass
class Letters(Environment):
    REWARDS: ClassVar[dict[str, float]] = {"letters": 1.0}

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return [Prompt(f"{split} {seed} {step} {i}: ") for i in range(count)]


@component("reward/letters")
def letters(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    return [sum(c in string.ascii_lowercase for c in text) / max(len(text), 1) for text in completions]


@component("reward/odd_letters")
def odd_letters(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """``letters`` on the prompts whose index is odd, 0 on the others (their groups have no advantage)."""
    scores = letters(prompts, completions, metadata)
    return [s if int(p.rstrip(": ").split()[-1]) % 2 else 0.0 for p, s in zip(prompts, scores, strict=True)]
