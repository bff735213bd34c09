"""Reading JSON that may have been damaged or written to do harm: a run's records, and a Hugging Face
checkpoint's ``config.json``, ``tokenizer_config.json``, ``model.safetensors.index.json`` and safetensors
headers.

One reader bounds the work a file can cause before the parser sees it: its size (nothing past
``max_bytes`` is read), its nesting (counted without recursion, so 100,000 levels are refused as quickly
as 101) and its numbers (``NaN``, ``Infinity``, ``1e999`` and integers beyond 64 bits are refused, naming
the field that holds them; a caller checks the ranges its fields need, or checks every number itself).
A refusal is :class:`UnreadableJSON`, whose message is one line naming the file and the reason; callers
add the fix and raise their own error class.

Standard library only: ``theseus runs`` reads records through it without importing jax.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

#: Largest file read by default: a checkpoint's configuration or a run's record is far smaller.
MAX_BYTES = 16 << 20
#: Deepest nesting accepted: the files theseus reads nest a handful of levels.
MAX_DEPTH = 64
#: Integers are refused from this magnitude on (no count, size or offset theseus reads comes near).
INTEGER_LIMIT = 2**63

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_ONE_KIND = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(set(range(256)) - set(b"[]{}"))


class UnreadableJSON(ValueError):
    """A JSON text refused: ``reason`` says why; the message names ``path`` too when there is one."""

    def __init__(self, reason: str, path: Path | None = None) -> None:
        self.reason = reason
        self.path = path
        super().__init__(f"{path} is not readable JSON ({reason})" if path is not None else reason)

    @property
    def missing(self) -> bool:
        """Whether the file was refused for not existing (a caller may treat that apart from damage)."""
        return isinstance(self.__cause__, FileNotFoundError)

    def at(self, path: Path) -> UnreadableJSON:
        """The same refusal, naming ``path``."""
        return UnreadableJSON(self.reason, path)


def nests_deeper(data: bytes, limit: int) -> bool:
    """Whether the arrays and objects of the JSON text ``data`` (UTF-8) nest more than ``limit`` levels
    (brackets inside strings do not count). Each pass removes the innermost pairs: the work is a few
    scans of the text per level, at bytes speed and without recursion."""
    if data.count(b"[") + data.count(b"{") <= limit:  # too few to nest deeper: a line of a dataset, mostly
        return False
    brackets = _STRING.sub(b"", data).translate(_ONE_KIND, _NOT_BRACKETS)
    for _ in range(limit):
        inner = brackets.replace(b"[]", b"")
        if inner == brackets:  # empty, or brackets that do not pair up (the parser says where)
            return False
        brackets = inner
    return b"[]" in brackets


class _OutOfRange(Exception):
    """A number the parser met that the reader refuses: its text, and why (``holds ...``)."""

    def __init__(self, text: str, why: str) -> None:
        super().__init__(why)
        self.text, self.why = text, why


def _refuse_constant(name: str) -> Any:
    raise _OutOfRange(name, f"holds {name}, which is not a finite number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _OutOfRange(text, f"holds {text[:40]}, which is beyond any finite number")
    return value


def _integer(text: str) -> int:
    if len(text) > 20:  # past 64 bits, whatever its digits: refused before converting it
        raise _OutOfRange(text, f"holds an integer of {len(text.lstrip('-'))} digits, beyond 64 bits")
    value = int(text)
    if not -INTEGER_LIMIT <= value < INTEGER_LIMIT:
        raise _OutOfRange(text, f"holds the integer {value}, beyond 64 bits")
    return value


#: One decoder with the number checks, made once (``json.loads`` with hooks builds one per call).
_CHECKED = json.JSONDecoder(parse_constant=_refuse_constant, parse_float=_finite, parse_int=_integer)


def _holder(text: str, number: str) -> str:
    """``field "name"`` for the first member of ``text`` whose value is ``number``, else ``it``."""
    found = re.search(r'"((?:[^"\\]|\\.){1,200})"\s*:\s*' + re.escape(number) + r"(?![\w.])", text)
    return f'field "{found.group(1)}"' if found else "it"


def parse(data: str | bytes, *, max_depth: int = MAX_DEPTH, check_numbers: bool = True) -> Any:
    """The value of JSON ``data`` (UTF-8 when bytes); :class:`UnreadableJSON` (naming no file) when it is
    not JSON, nests deeper than ``max_depth`` or, with ``check_numbers``, holds ``NaN``, ``Infinity``, a
    number beyond a float or an integer beyond 64 bits (a caller that checks each number it uses, and
    names what holds it, passes False: integers are then limited to Python's 4,300 digits)."""
    if isinstance(data, str):
        text, raw = data, data.encode("utf-8", "surrogatepass")
    else:
        try:
            text, raw = data.decode("utf-8"), data
        except UnicodeDecodeError as exc:
            raise UnreadableJSON(f"byte {exc.start} is not UTF-8") from exc
    if nests_deeper(raw, max_depth):
        raise UnreadableJSON(f"it nests deeper than {max_depth} levels")
    try:
        if not check_numbers:
            return json.loads(text)
        if text.startswith("\ufeff"):  # as json.loads says it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _CHECKED.decode(text)
    except _OutOfRange as exc:
        raise UnreadableJSON(f"{_holder(text, exc.text)} {exc.why}") from None
    except json.JSONDecodeError as exc:
        raise UnreadableJSON(str(exc)) from exc
    except ValueError as exc:  # an integer past the interpreter's digit limit
        raise UnreadableJSON("it holds an integer of more digits than Python converts") from exc
    except RecursionError as exc:  # not reached within max_depth; kept for callers that pass a larger one
        raise UnreadableJSON("it nests deeper than the parser follows") from exc


def read(path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, check_numbers: bool = True) -> Any:
    """The value of the JSON file ``path``, read through :func:`parse`; :class:`UnreadableJSON` naming the
    file when it cannot be read, is larger than ``max_bytes`` or is refused."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise UnreadableJSON(exc.strerror or type(exc).__name__, path) from exc
    if len(data) > max_bytes:
        raise UnreadableJSON(f"it is larger than {max_bytes} bytes", path)
    try:
        return parse(data, max_depth=max_depth, check_numbers=check_numbers)
    except UnreadableJSON as exc:
        raise exc.at(path) from exc


def read_object(
    path: Path, *, max_bytes: int = MAX_BYTES, max_depth: int = MAX_DEPTH, check_numbers: bool = True
) -> dict[str, Any]:
    """:func:`read` for a file that must hold a JSON object."""
    value = read(path, max_bytes=max_bytes, max_depth=max_depth, check_numbers=check_numbers)
    if not isinstance(value, dict):
        raise UnreadableJSON("it does not hold a JSON object", Path(path))
    return value


__all__ = ["INTEGER_LIMIT", "MAX_BYTES", "MAX_DEPTH", "UnreadableJSON", "nests_deeper", "parse", "read", "read_object"]
