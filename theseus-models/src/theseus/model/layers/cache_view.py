"""How many leading slots of a KV cache the layers read while a decoding step is traced.

A decoder that fills its cache from the front knows, for a stretch of steps, that every slot written so
far lies below some length ``L``. Traced inside ``cache_view(L)``, each layer's cached attention
(:func:`~theseus.model.layers.attention.append_to_cache`) reads only the first ``L`` slots of its
cache instead of all of them, so a step early in a long generation reads little of the cache. The
view is a trace-time (static) length: a jitted loop traced under two views compiles two programs.
Ring-buffer caches of windowed layers are already as long as their window and are read whole.

A decoder that runs alike layers in a loop (:func:`~theseus.model.stack.decoding.looped_step`) keeps
every layer's cache stacked ``[n_layers, ...]`` and traces one layer inside ``cache_layer(i)``: that
layer writes its step into entry ``i`` of the stack and reads it from there, in place.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import jax

_VISIBLE: contextvars.ContextVar[int | None] = contextvars.ContextVar("theseus_cache_view", default=None)
_LAYER: contextvars.ContextVar[jax.Array | None] = contextvars.ContextVar("theseus_cache_layer", default=None)


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


@contextlib.contextmanager
def cache_layer(index: jax.Array) -> Iterator[None]:
    """Trace a cached step of one layer whose cache variables hold every layer's, stacked
    ``[n_layers, ...]``: it writes and reads entry ``index`` (a traced int32 scalar) of each."""
    token = _LAYER.set(index)
    try:
        yield
    finally:
        _LAYER.reset(token)


def cached_layer() -> jax.Array | None:
    """The layer index set by the innermost :func:`cache_layer`, or None (per-layer caches)."""
    return _LAYER.get()
