"""The number format of a traced program's projection matmuls (``training/precision``).

The trainer traces its train and validation steps inside :func:`computing_in`; model code asks
:func:`matmul_precision` when it builds a projection (see ``theseus.model.layers.matmul``). Outside
a trainer's steps (generation, analysis, export) the projections keep the activation dtype.
No jax import.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from theseus.base.scoped import bound

#: ``auto``: projections in the activation dtype; ``fp8``: e4m3 operands forward, e5m2 gradients.
PRECISIONS = ("auto", "fp8")

_PRECISION: contextvars.ContextVar[str] = contextvars.ContextVar("theseus_matmul_precision", default="auto")


def matmul_precision() -> str:
    """The precision of the projections being traced (``auto`` unless a trainer declared another)."""
    return _PRECISION.get()


@contextlib.contextmanager
def computing_in(precision: str) -> Iterator[None]:
    """Trace the enclosed code with projections in ``precision`` (one of :data:`PRECISIONS`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown matmul precision {precision!r}; one of {', '.join(PRECISIONS)}")
    with bound(_PRECISION, precision):
        yield


__all__ = ["PRECISIONS", "computing_in", "matmul_precision"]
