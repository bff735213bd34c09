"""A test environment loaded with ``--load``: complete a fixed prompt; the reward is the share of the
completion's characters that are lower-case letters (about 10 % for a random byte model)."""

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
