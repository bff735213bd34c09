"""Collecting configuration classes: a depth-first closure plus plugin contributions."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any


def gather_classes(root: type, children: Callable[[type], Iterable[type]]) -> list[type]:
    """``root``, then ``children`` depth first, then what ``theseus_gather`` hooks add.

    Order is stable (first occurrence wins) and each class appears once.
    """
    from theseus.plugins.discovery import plugins

    ordered: list[type] = []
    seen: set[Any] = set()

    def visit(klass: type) -> None:
        if klass in seen:
            return
        seen.add(klass)
        ordered.append(klass)
        for child in children(klass):
            visit(child)

    visit(root)
    for _dist, contributed in plugins().call("theseus_gather", owner=root):
        for klass in contributed:
            visit(klass)
    return ordered
