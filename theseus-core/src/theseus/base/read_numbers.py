"""Numbers read back from files that a crash, a hand edit or a hostile writer may have left: a finite float
or a count in range, else None. ``theseus runs``, resume and the status record read their numbers here.
No jax import."""

from __future__ import annotations

import math
from typing import Any


def finite(value: Any) -> float | None:
    """``value`` as a float when it is a finite number, else None: text, a bool, ``NaN``, ``1e400`` (which
    JSON reads as infinity) and an integer past a float's range (``10**400``) are not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def count(value: Any, largest: int, *, whole_floats: bool = False) -> int | None:
    """``value`` as a whole number from 0 to ``largest``, else None (a bool, text, a negative number);
    ``whole_floats``: a float with no fraction (``3.0``, as JSON writers may write a step) counts too."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        if not (whole_floats and math.isfinite(value) and value.is_integer()):
            return None
    elif not isinstance(value, int):
        return None
    return int(value) if 0 <= value <= largest else None


__all__ = ["count", "finite"]
