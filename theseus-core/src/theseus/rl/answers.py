"""Finding the final answer in a text, and comparing answers (``"1,000"`` equals ``"1000.0"``).

Extraction modes (``EXTRACT_MODES``):

- ``tag``: the content of the last ``<answer>...</answer>`` (the tag is a parameter);
- ``boxed``: the content of the last ``\\boxed{...}`` (nested braces allowed);
- ``hash``: what follows the last ``#### `` on its line (GSM8K's reference format);
- ``last_number``: the last number in the text;
- ``auto``: the first of ``tag``, ``boxed``, ``hash``, ``last_number`` that finds something;
- ``none``: the whole text, stripped.
"""

from __future__ import annotations

import re
from fractions import Fraction

EXTRACT_MODES = ("auto", "tag", "boxed", "hash", "last_number", "none")
DEFAULT_TAG = "answer"

_NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?|-?\.\d+")
_DIGIT_COMMA = re.compile(r"(?<=\d),(?=\d{3}\b)")
_FRAC = re.compile(r"\\[dt]?frac\{(-?\d+)\}\{(-?\d+)\}")
_WRAPPERS = re.compile(r"^\\text\{(.*)\}$|^\\mathrm\{(.*)\}$")


def tagged(text: str, tag: str = DEFAULT_TAG) -> str | None:
    """The stripped content of the last ``<tag>...</tag>`` in ``text``, or None."""
    found = re.findall(rf"<{re.escape(tag)}>(.*?)</{re.escape(tag)}>", text, re.DOTALL)
    return found[-1].strip() if found else None


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        if text[index] == "{":
            depth += 1
        elif text[index] == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index].strip()
    return None


def after_hashes(text: str) -> str | None:
    """What follows the last ``####`` on its line (GSM8K), or None."""
    start = text.rfind("####")
    if start < 0:
        return None
    rest = text[start + 4 :].strip().splitlines()
    return rest[0].strip() if rest and rest[0].strip() else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (``-3``, ``1,000``, ``2.5``), or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def extract(text: str, mode: str = "auto", tag: str = DEFAULT_TAG) -> str | None:
    """The answer ``mode`` finds in ``text`` (see the module docstring), or None."""
    if mode == "tag":
        return tagged(text, tag)
    if mode == "boxed":
        return boxed(text)
    if mode == "hash":
        return after_hashes(text)
    if mode == "last_number":
        return last_number(text)
    if mode == "none":
        return text.strip()
    if mode == "auto":
        for found in (tagged(text, tag), boxed(text), after_hashes(text), last_number(text)):
            if found is not None:
                return found
        return None
    raise ValueError(f"unknown extraction mode {mode!r}; use one of: {', '.join(EXTRACT_MODES)}")


def normalize(answer: str) -> str:
    """``answer`` without surrounding ``$``, a trailing period, ``\\text{}`` and extra spaces."""
    text = answer.strip().strip("$").strip()
    wrapped = _WRAPPERS.match(text)
    if wrapped:
        text = next(group for group in wrapped.groups() if group is not None).strip()
    text = text.rstrip(".").strip()
    return " ".join(text.split())


def as_number(answer: str) -> Fraction | None:
    """The exact value of a numeric answer (``"1,000"``, ``"$5"``, ``"2.50"``, ``"\\frac{1}{2}"``)."""
    text = _FRAC.sub(r"\1/\2", normalize(answer)).removeprefix("\\$").lstrip("$")
    text = _DIGIT_COMMA.sub("", text).replace(" ", "")
    if not re.fullmatch(r"-?(\d+(\.\d*)?|\.\d+)(/-?\d+)?", text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def same(answer: str, reference: str) -> bool:
    """Equal as numbers when both are numbers, else equal as normalized text (case-insensitive)."""
    left, right = as_number(answer), as_number(reference)
    if left is not None and right is not None:
        return left == right
    return normalize(answer).casefold() == normalize(reference).casefold()
