"""A tiny arithmetic parser (``+ - * /`` and parentheses) evaluated exactly, with no ``eval``.

Numbers are non-negative integers; there is no unary minus. The value is a ``Fraction``, so
``7 / 2 * 2`` is exactly 7. The signs U+00D7 and U+00F7 are read as ``*`` and ``/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

#: Longest expression (in tokens) and deepest parenthesis nesting parsed.
MAX_TOKENS = 256
MAX_DEPTH = 32

_TOKEN = re.compile(r"\s*(?:(\d+)|(.))")


class ExpressionError(ValueError):
    """The text is not an expression of the grammar, or divides by zero."""


@dataclass(frozen=True)
class Expression:
    """A parsed expression: its exact value and the numbers it uses, in order."""

    value: Fraction
    numbers: tuple[int, ...]


def tokenize(text: str) -> list[str]:
    """Numbers and the symbols ``+ - * / ( )``; anything else is an ExpressionError."""
    tokens: list[str] = []
    for number, symbol in _TOKEN.findall(text.replace("\u00d7", "*").replace("\u00f7", "/").strip()):
        if number:
            tokens.append(number)
        elif symbol in "+-*/()":
            tokens.append(symbol)
        elif not symbol.isspace():
            raise ExpressionError(f"unexpected character {symbol!r}")
    if not tokens:
        raise ExpressionError("empty expression")
    if len(tokens) > MAX_TOKENS:
        raise ExpressionError(f"longer than {MAX_TOKENS} tokens")
    return tokens


class _Parser:
    def __init__(self, tokens: list[str]) -> None:
        self.tokens, self.at = tokens, 0
        self.numbers: list[int] = []

    def peek(self) -> str | None:
        return self.tokens[self.at] if self.at < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExpressionError("the expression ends early")
        self.at += 1
        return token

    def expression(self, depth: int) -> Fraction:
        value = self.term(depth)
        while self.peek() in ("+", "-"):
            value = value + self.term(depth) if self.take() == "+" else value - self.term(depth)
        return value

    def term(self, depth: int) -> Fraction:
        value = self.factor(depth)
        while self.peek() in ("*", "/"):
            operator, right = self.take(), self.factor(depth)
            if operator == "*":
                value *= right
            elif right == 0:
                raise ExpressionError("division by zero")
            else:
                value /= right
        return value

    def factor(self, depth: int) -> Fraction:
        token = self.take()
        if token.isdigit():
            self.numbers.append(int(token))
            return Fraction(int(token))
        if token == "(":
            if depth >= MAX_DEPTH:
                raise ExpressionError(f"nested deeper than {MAX_DEPTH} parentheses")
            value = self.expression(depth + 1)
            if self.take() != ")":
                raise ExpressionError("unbalanced parentheses")
            return value
        raise ExpressionError(f"expected a number or '(', got {token!r}")


def parse(text: str) -> Expression:
    """The value and numbers of ``text``; an ExpressionError when it is not a valid expression."""
    parser = _Parser(tokenize(text))
    value = parser.expression(0)
    if parser.peek() is not None:
        raise ExpressionError(f"unexpected {parser.peek()!r} after the expression")
    return Expression(value, tuple(parser.numbers))
