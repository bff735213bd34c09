"""How many leading slots of a KV cache the layers read while a decoding step is traced.

A decoder that fills its cache from the front knows, for a stretch of steps, that every slot written so
far lies below some length ``L``. Traced inside ``cache_view(L)``, each layer's cached attention
(:func:`~theseus.model.layers.attention.append_to_cache`) reads only the first ``L`` slots of its
cache instead of all of them, so a step early in a long generation reads little of the cache. The
view is a trace-time (static) length: a jitted loop traced under two views compiles two programs.
Ring-buffer caches of windowed layers are already as long as their window and are read whole.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_VISIBLE: contextvars.ContextVar[int | None] = contextvars.ContextVar("theseus_cache_view", default=None)


@contextlib.contextmanager
def cache_view(length: int) -> Iterator[None]:
    """Trace cached steps that read only the first ``length`` slots of each layer's cache. The caller
    guarantees that no step traced here writes at or beyond ``length``."""
    if length < 1:
        raise ValueError(f"a cache view needs at least one slot, got {length}")
    token = _VISIBLE.set(length)
    try:
        yield
    finally:
        _VISIBLE.reset(token)


def visible_slots() -> int | None:
    """The length set by the innermost :func:`cache_view`, or None (the whole cache)."""
    return _VISIBLE.get()
