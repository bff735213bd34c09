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


@component("reward/fragile")
def fragile(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """``letters``, but raising on the first prompt of step 1 (a plugin's bug that shows late in a run)."""
    if any(p.startswith("train 0 1 0:") for p in prompts):
        raise ValueError("unparseable")
    return letters(prompts, completions, metadata)


#: The ``rl/max_new_tokens`` of the runs that score ``cut``.
CUT_AT = 8


@component("reward/cut")
def cut(prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
    """1 where ``metadata["truncated"]`` says what the length says (cut at ``CUT_AT`` tokens), else 0."""
    return [float(bool(meta["truncated"]) == (meta["completion_tokens"] == CUT_AT)) for meta in metadata]


@component("environment/truncation")
@dataclass
class Truncation(Letters):
    """``letters``' prompts scored by ``cut``, its accuracy reward: every group scores the same."""

    REWARDS: ClassVar[dict[str, float]] = {"cut": 1.0}
    ACCURACY: ClassVar[str | None] = "cut"
