"""A context variable set for the code a ``with`` block encloses: how the trainer tells the code it traces
which accelerator, precision, attention form or configuration it runs under."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import TypeVar

T = TypeVar("T")


@contextlib.contextmanager
def bound(variable: contextvars.ContextVar[T], value: T) -> Iterator[T]:
    """``variable`` set to ``value`` inside the block (yielded), and back to what it was after it."""
    token = variable.set(value)
    try:
        yield value
    finally:
        variable.reset(token)
