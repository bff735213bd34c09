"""``environment/arithmetic``: generated integer arithmetic problems, the exact answer checked."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

from theseus.config import field
from theseus.errors import ConfigError
from theseus.rl.environment import Environment, Prompt, generate
from theseus.rl.expression import parse

OPERATIONS = "+-*/"


@dataclass
class Arithmetic(Environment):
    """``Compute 37 + 4 * 12.``: ``terms`` operands of up to ``digits`` digits joined by
    ``operations`` (usual precedence; a division always comes out exact). The reference answer
    is ``metadata["answer"]``."""

    name: ClassVar[str] = "arithmetic"
    REWARDS: ClassVar[dict[str, float]] = {"correct": 1.0, "format": 0.2}
    INSTRUCTION: ClassVar[str] = "Give the final answer inside <answer></answer>."

    digits: int = field("environment/arithmetic/digits", default=2, min=1, max=4, help="digits of each operand at most")
    terms: int = field("environment/arithmetic/terms", default=2, min=2, max=6, help="operands per problem")
    operations: str = field(
        "environment/arithmetic/operations", default="+-*", help="operators drawn from, a subset of '+-*/'"
    )
    eval_fraction: float = field(
        "environment/arithmetic/eval_fraction", default=0.1, above=0.0, below=1.0, help="share of problems held out"
    )

    def __post_init__(self) -> None:
        if not self.operations or set(self.operations) - set(OPERATIONS):
            raise ConfigError(
                f"environment/arithmetic/operations={self.operations!r}: use one or more of {OPERATIONS!r}"
            )

    def prompts(self, split: str, seed: int, step: int, count: int) -> list[Prompt]:
        return generate(self.name, self.problem, split, seed, step, count, self.eval_fraction)

    def solution(self, prompt: Prompt) -> str:
        """The answer inside the tags the instruction asks for."""
        return f"<answer>{prompt.metadata['answer']}</answer>"

    def problem(self, draw: random.Random) -> Prompt:
        """One problem: its expression, and its value as the answer."""
        limit = 10**self.digits - 1
        operands = [draw.randint(0, limit)]
        operators: list[str] = []
        run = operands[0]  # the value of the current run of * and /
        for _ in range(self.terms - 1):
            operator = draw.choice(self.operations)
            if operator == "/":
                operand = draw.choice(divisors(run, limit))
                run //= operand
            else:
                operand = draw.randint(0, limit)
                run = run * operand if operator == "*" else operand
            operators.append(operator)
            operands.append(operand)
        expression = str(operands[0]) + "".join(f" {o} {n}" for o, n in zip(operators, operands[1:], strict=True))
        value = parse(expression).value
        assert value.denominator == 1, expression
        text = f"Compute {expression}. {self.INSTRUCTION}"
        return Prompt(text, {"answer": str(value.numerator), "expression": expression})


def divisors(value: int, limit: int) -> list[int]:
    """The divisors of ``value`` from 2 to ``limit`` (any of them for 0; ``[1]`` when there are none)."""
    if value == 0:
        return list(range(1, limit + 1))
    found = [d for d in range(2, min(abs(value), limit) + 1) if value % d == 0]
    return found or [1]
