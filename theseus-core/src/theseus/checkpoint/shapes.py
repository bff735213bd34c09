"""Parameter shapes of saved and expected trees, compared without loading any values."""

from __future__ import annotations

from typing import Any

import jax

from theseus.base.tree import path_text


def param_shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    """``{"a/b/kernel": shape}`` for every array-like leaf of ``tree`` (arrays or abstract shapes)."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
    return {path_text(path): tuple(leaf.shape) for path, leaf in flat if hasattr(leaf, "shape")}


def first_shape_mismatch(saved: Any, wanted: Any) -> tuple[str, str, tuple[int, ...]] | None:
    """The first parameter of ``wanted`` that ``saved`` lacks or holds with another shape.

    Returns ``(path, what saved holds ("shape (..)" or "nothing"), wanted shape)``, or None.
    """
    have = param_shapes(saved)
    for path, shape in param_shapes(wanted).items():
        if have.get(path) != shape:
            return path, (f"shape {have[path]}" if path in have else "nothing"), shape
    return None
