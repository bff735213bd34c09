"""Python's cyclic garbage collector during a run: rare collections while programs are traced.

Tracing and lowering a model allocate millions of short-lived objects; with the default
thresholds (700, 10, 10) the collector runs some 700 times and walks the whole heap (jax, flax,
optax: a few million objects) several times before the first update - about a second of a tiny
run's start-up on 2 CPU cores. Raising the first threshold leaves a handful of young-generation
collections; reference counting still frees the traces themselves, and the peak memory of a
1-step run is unchanged.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: Allocations (net) between young-generation collections during a run (Python's default: 700).
YOUNG_THRESHOLD = 50_000
#: Young (and middle) collections between collections of the next-older generation (default: 10).
OLDER_THRESHOLD = 20


def rare_collections_for_the_process() -> None:
    """The ``theseus`` command's own process: rare collections from its start to its end (imports of jax,
    flax and the plugins allocate as tracing does), and at its end the heap left to the operating system
    (frozen: jax's exit hook clears its caches and collects again, walking every object the run left).
    Objects allocated after the freeze are still collected. A run's thresholds are the same as inside
    ``rare_collections``; a tiny training run's process takes about half a CPU-second less."""
    young, middle, old = gc.get_threshold()
    gc.set_threshold(max(young, YOUNG_THRESHOLD), max(middle, OLDER_THRESHOLD), max(old, OLDER_THRESHOLD))


def leave_heap_to_exit() -> None:
    """Freeze the heap before the process exits: later collections skip what is already there."""
    gc.freeze()


@contextlib.contextmanager
def rare_collections() -> Iterator[None]:
    """Raise the collector's thresholds inside the block (never lower them); restore them after."""
    before = gc.get_threshold()
    young, middle, old = before
    gc.set_threshold(max(young, YOUNG_THRESHOLD), max(middle, OLDER_THRESHOLD), max(old, OLDER_THRESHOLD))
    try:
        yield
    finally:
        gc.set_threshold(*before)
