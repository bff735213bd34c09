"""A test environment loaded with ``--load``: a turn ends at any lower-case letter (a stop string) and
the environment replies ``!``; the reward ``lower`` is the share of lower-case letters."""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.registry import component
from theseus.rl.environment import Environment, Prompt


@component("environment/tools")
@dataclass
class Tools(Environment):
    REWARDS: ClassVar[dict[str, float]] = {"lower": 1.0}
    ACCURACY: ClassVar[str | None] = None
    STOP: ClassVar[tuple[str, ...]] = tuple(string.ascii_lowercase)

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return [Prompt(f"{split} {seed} {step} {i}: ") for i in range(count)]

    def respond(self, prompt: Prompt, transcript: Sequence[Mapping[str, str]]) -> str | None:
        return "!"


@component("reward/lower")
def lower(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    return [sum(c in string.ascii_lowercase for c in text) / max(len(text), 1) for text in completions]
