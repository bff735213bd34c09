"""``environment/calculator``: arithmetic with a calculator tool, in episodes of several turns.

The policy may write a call, ``<calc>12*7</calc>``; its turn ends there (``STOP``), the environment
answers ``<result>84</result>`` (the expression evaluated exactly by ``theseus.rl.expression``, never by
Python's ``eval``; a malformed one or a division by zero answers ``<result>error: ...</result>``) and the
policy goes on after it. The final answer inside ``<answer></answer>`` is scored like arithmetic's.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import ClassVar

from theseus.config import field
from theseus.rl.environment import Environment, Prompt, generate
from theseus.rl.expression import ExpressionError, parse

CALL = re.compile(r"<calc>(.*?)</calc>", re.DOTALL)


def shown(value: Fraction) -> str:
    """A value as the calculator shows it: an integer, else a fraction ``7/2``."""
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


def evaluate(call: str) -> str:
    """The calculator's reply to the expression ``call``."""
    try:
        return f"<result>{shown(parse(call).value)}</result>"
    except ExpressionError as exc:
        return f"<result>error: {exc}</result>"


@dataclass
class Calculator(Environment):
    """``Compute 481 * 36 + 702.`` with a calculator: ``terms`` operands of up to ``digits`` digits joined by
    ``+ - *``; the reference answer is ``metadata["answer"]``."""

    name: ClassVar[str] = "calculator"
    REWARDS: ClassVar[dict[str, float]] = {"correct": 1.0, "format": 0.2}
    STOP: ClassVar[tuple[str, ...]] = ("</calc>",)
    INSTRUCTION: ClassVar[str] = (
        "You may use a calculator: write <calc>expression</calc> and its <result>value</result> follows. "
        "Give the final answer inside <answer></answer>."
    )

    digits: int = field("environment/calculator/digits", default=3, min=1, max=6, help="digits of each operand at most")
    terms: int = field("environment/calculator/terms", default=3, min=2, max=6, help="operands per problem")
    eval_fraction: float = field(
        "environment/calculator/eval_fraction", default=0.1, above=0.0, below=1.0, help="share of problems held out"
    )

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return generate(self.name, self.problem, split, seed, step, count, self.eval_fraction)

    def problem(self, draw: random.Random) -> Prompt:
        """One problem: its expression, and its value as the answer."""
        limit = 10**self.digits - 1
        expression = str(draw.randint(0, limit))
        for _ in range(self.terms - 1):
            expression += f" {draw.choice('+-*')} {draw.randint(0, limit)}"
        value = parse(expression).value
        return Prompt(f"Compute {expression}. {self.INSTRUCTION}", {"answer": shown(value), "expression": expression})

    def solution(self, prompt: Prompt) -> list[dict[str, str]]:
        """The calculator used once: a call on the whole expression, its result, then the answer."""
        call = f"<calc>{prompt.metadata['expression']}</calc>"
        return [
            {"role": "assistant", "content": call},
            {"role": "tool", "content": evaluate(prompt.metadata["expression"])},
            {"role": "assistant", "content": f"<answer>{prompt.metadata['answer']}</answer>"},
        ]

    def respond(self, prompt: Prompt, transcript: Sequence[Mapping[str, str]]) -> str | None:
        """The result of the last call in the policy's last turn; None (the episode ends) without one."""
        calls = CALL.findall(transcript[-1]["content"]) if transcript else []
        return evaluate(calls[-1]) if calls else None
