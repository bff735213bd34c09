"""Naming the leaves of parameter trees."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def path_text(path: Sequence[Any]) -> str:
    """``blocks_0/attn/query`` for a ``jax.tree_util`` key path (dict keys, attribute names, indices)."""
    return "/".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
