"""``environment/countdown`` and ``reward/countdown``: reach a target from given numbers.

The completion's expression (inside the answer tag, else its last line) is parsed by
``theseus.rl.expression``, never evaluated as Python: it may use ``+ - * /`` and parentheses and
each given number at most once, and must equal the target.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.errors import ConfigError
from theseus.rl.answers import DEFAULT_TAG, tagged
from theseus.rl.environment import Environment, Prompt, generate
from theseus.rl.expression import ExpressionError, parse
from theseus.rl.rewards import Reward


@dataclass
class Countdown(Environment):
    """``Using the numbers [2, 3, 7, 9] ... equals 42.``: ``metadata`` holds ``numbers``, ``target``
    (also as ``answer``) and one ``solution``."""

    name: ClassVar[str] = "countdown"
    REWARDS: ClassVar[dict[str, float]] = {"countdown": 1.0, "format": 0.2}
    ACCURACY: ClassVar[str | None] = "countdown"

    numbers: int = field("environment/countdown/numbers", default=4, min=2, max=6, help="numbers given")
    max_number: int = field("environment/countdown/max_number", default=25, min=2, help="largest number given")
    max_target: int = field("environment/countdown/max_target", default=100, min=1, help="largest target")
    eval_fraction: float = field(
        "environment/countdown/eval_fraction", default=0.1, above=0.0, below=1.0, help="share of problems held out"
    )

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return generate(self.name, self.problem, split, seed, step, count, self.eval_fraction)

    def problem(self, draw: random.Random) -> Prompt | None:
        """Numbers combined in a random order by random operations; None when the value is no target."""
        numbers = [draw.randint(1, self.max_number) for _ in range(self.numbers)]
        order = draw.sample(numbers, len(numbers))
        value, solution = order[0], str(order[0])
        for number in order[1:]:
            choices = (
                ["+", "*"] + (["-"] if value > number else []) + (["/"] if number > 1 and value % number == 0 else [])
            )
            operator = draw.choice(choices)
            value = {"+": value + number, "-": value - number, "*": value * number}.get(operator, value // number)
            solution = f"({solution} {operator} {number})"
        if not 1 <= value <= self.max_target:
            return None
        given = sorted(numbers)
        text = (
            f"Using the numbers {given}, each at most once, and + - * / with parentheses, write an expression "
            f"that equals {value}. Give the expression inside <answer></answer>."
        )
        return Prompt(text, {"numbers": given, "target": value, "answer": str(value), "solution": solution[1:-1]})


def check(expression: str, numbers: list[int], target: int) -> bool:
    """Whether ``expression`` uses each of ``numbers`` at most once and equals ``target``."""
    left = expression.split("=")[0]
    try:
        parsed = parse(left)
    except ExpressionError:
        return False
    return not Counter(parsed.numbers) - Counter(numbers) and parsed.value == target


@dataclass
class CountdownReward(Reward):
    """1.0 when the completion's expression reaches ``metadata["target"]`` using each of
    ``metadata["numbers"]`` at most once, else 0.0 (a malformed expression or a division by zero
    scores 0.0). ``expr = target`` is accepted: the part before ``=`` is checked."""

    name: ClassVar[str] = "countdown"

    tag: str = field("reward/countdown/tag", default=DEFAULT_TAG, help="the tag holding the expression")

    def __call__(self, prompts: list[str], completions: list[str], metadata: list[Mapping[str, Any]]) -> list[float]:
        scores = []
        for completion, meta in zip(completions, metadata, strict=True):
            if "numbers" not in meta or "target" not in meta:
                raise ConfigError("reward 'countdown' needs metadata 'numbers' and 'target' (environment=countdown)")
            found = tagged(completion, self.tag)
            lines = [line for line in completion.splitlines() if line.strip()]
            expression = found if found is not None else (lines[-1] if lines else "")
            scores.append(1.0 if check(expression, list(meta["numbers"]), int(meta["target"])) else 0.0)
        return scores
