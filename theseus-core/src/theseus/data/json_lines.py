"""Reading a JSON-lines file a user gave (a dataset, an environment's rows, evaluation questions): each line
parsed with :mod:`theseus.base.jsonfile`'s nesting bound, and a bad line one error naming the file and line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.errors import DataError, TheseusError


def json_lines(
    path: str | Path, fix: str = "fix the line", error: Callable[[str], TheseusError] = DataError
) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` of each line of a JSON-lines file that is not blank, ``where`` being ``path:line``.

    A line that is not UTF-8 (a byte-order mark may open the file), not JSON, nested too deeply, holding an
    integer past Python's 4,300 digits, or holding text that is no unicode (a lone surrogate escape such as
    ``\\ud800``) is an ``error`` (DataError) naming the line and ending with ``fix``. Other numbers (``NaN``,
    ``1e999``, a 30-digit id) are a row's columns, read as Python reads them: the readers take text from a
    row, and a column they do not read never stops a corpus.
    """
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            where = f"{path}:{number}"
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
            except UnicodeDecodeError as exc:
                raise error(
                    f"{where} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1}); "
                    "save the file as UTF-8"
                ) from None
            if line.strip():
                yield where, _parsed(line, where, fix, error)


def _parsed(line: str, where: str, fix: str, error: Callable[[str], TheseusError]) -> Any:
    try:
        value = jsonfile.parse(line, check_numbers=False)  # nesting bounded; a row's numbers are its columns'
    except jsonfile.UnreadableJSON as exc:
        raise error(f"{where} is not valid JSON ({exc.reason}); {fix}") from None
    if "\\u" in line and not _unicode(value):
        raise error(f"{where} holds a lone surrogate (an escape in \\ud800-\\udfff), which is no text; {fix}")
    return value


def _unicode(value: Any) -> bool:
    """Whether every string in ``value`` (keys too) is unicode text, without lone surrogates."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return False
    return True


__all__ = ["json_lines"]
