"""Which parameters are matrices, and which of their axes a matrix reads from and writes to.

Weight decay and Muon act on matrices only, never on norms' scales and biases. A parameter's
logical axis names (:class:`theseus.base.axis.Axis`) decide what it is:

* axes are grouped: ``heads``, ``kv_heads`` and ``head_dim`` next to each other form one group (one
  side of an attention projection); every other axis is a group of its own; the stacked ``layers``
  axis of scanned models and the ``expert`` axis of a mixture's experts are batch axes and join no
  group;
* a parameter spanning two or more groups is a matrix. Its first group holds the axes it reduces
  over (its inputs), the other groups its outputs: the query kernel ``[embed, heads, head_dim]``
  maps ``embed`` to ``heads x head_dim``, the attention output ``[heads, head_dim, embed]`` the
  other way, and a query bias ``[heads, head_dim]`` is no matrix.

The trainer wraps its optimizer with :func:`with_parameter_axes`, so the masks (``decay_mask``,
Muon's dimension numbers) see its model's names whenever the optimizer runs; tests and other code
can set them with :func:`parameter_axes_known`. Parameters without known names (an optimizer used
outside a trainer, a parameter created without logical names) fall back to their rank: two or more
dimensions make a matrix, the first axis being the input.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import jax
import optax
from jax.sharding import PartitionSpec

from theseus.base.axis import Axis
from theseus.base.scoped import bound
from theseus.base.tree import path_text

#: Logical axes that belong to one side of a matrix together.
AXIS_GROUPS = {Axis.HEADS: "heads", Axis.KV_HEADS: "heads", Axis.HEAD_DIM: "heads"}
#: Logical axes that stack independent matrices (a scanned model's layers, a mixture's experts).
BATCH_AXES = frozenset({Axis.LAYERS, Axis.EXPERT})

Names = Mapping[str, tuple[str | None, ...]]
_known: ContextVar[Names | None] = ContextVar("theseus_parameter_axes", default=None)


@dataclass(frozen=True)
class MatrixAxes:
    """The axes a matrix parameter reduces over (``inputs``) and produces (``outputs``); any other
    axis stacks independent matrices."""

    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def names_by_path(logical_specs: Any) -> dict[str, tuple[str | None, ...]]:
    """``{path: names}`` of a ``params`` tree of ``flax.linen.get_partition_spec`` (a ``PartitionSpec``
    per parameter; parameters created without names are left out)."""
    leaves = jax.tree_util.tree_flatten_with_path(logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))[0]
    return {
        path_text(path): tuple(name if isinstance(name, str) else None for name in spec)
        for path, spec in leaves
        if isinstance(spec, PartitionSpec)
    }


def parameter_axes_known(logical_specs: Any) -> AbstractContextManager[Names | None]:
    """Within the block, parameters are judged by the names of ``logical_specs`` (see :func:`names_by_path`)."""
    return bound(_known, names_by_path(logical_specs))


def with_parameter_axes(tx: optax.GradientTransformation, logical_specs: Any) -> optax.GradientTransformation:
    """``tx`` whose ``init`` and ``update`` judge parameters by the names of ``logical_specs``."""
    names = names_by_path(logical_specs)
    extra_args = isinstance(tx, optax.GradientTransformationExtraArgs)

    def init(params: Any) -> Any:
        with bound(_known, names):
            return tx.init(params)

    def update(updates: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        with bound(_known, names):
            return tx.update(updates, state, params, **extra) if extra_args else tx.update(updates, state, params)

    return optax.GradientTransformationExtraArgs(init, update)


def parameter_axes(path: Sequence[Any], leaf: Any) -> tuple[str | None, ...] | None:
    """The known logical names of the parameter at ``path``, if they fit its rank."""
    known = _known.get()
    names = None if known is None else known.get(path_text(path))
    if names is None or len(names) != getattr(leaf, "ndim", -1):
        return None
    return names


def stacked_length(path: Sequence[Any], leaf: Any) -> int:
    """How many independent parameters the one at ``path`` stacks on its first axis (a scanned model's
    layers, a mixture's experts, by its known names), or 0 when its first axis stacks nothing."""
    names = parameter_axes(path, leaf)
    return int(leaf.shape[0]) if names and names[0] in BATCH_AXES else 0


def judged_as_slice(path: Sequence[Any]) -> AbstractContextManager[Names | None]:
    """Within the block the parameter at ``path`` is judged without its first axis: for one slice
    ``leaf[i]`` of a parameter whose first axis :func:`stacked_length` counts."""
    known = dict(_known.get() or {})
    key = path_text(path)
    if key in known:
        known[key] = known[key][1:]
    return bound(_known, known)


def matrix_axes(path: Sequence[Any], leaf: Any) -> MatrixAxes | None:
    """How the parameter at ``path`` acts as a matrix, or None for a vector-like parameter."""
    names = parameter_axes(path, leaf)
    if names is None:
        return MatrixAxes((0,), (1,)) if getattr(leaf, "ndim", 0) == 2 else None
    groups: list[tuple[str | None, list[int]]] = []
    for index, name in enumerate(names):
        if name in BATCH_AXES:
            continue
        group = AXIS_GROUPS.get(name) if name is not None else None
        if group is not None and groups and groups[-1][0] == group:
            groups[-1][1].append(index)
        else:  # an axis outside AXIS_GROUPS (or unnamed) is a group of its own
            groups.append((group, [index]))
    if len(groups) < 2:
        return None
    return MatrixAxes(tuple(groups[0][1]), tuple(i for _, axes in groups[1:] for i in axes))


def is_matrix(path: Sequence[Any], leaf: Any) -> bool:
    """Whether weight decay applies: a matrix by its names, or of rank two or more without them."""
    if parameter_axes(path, leaf) is None:
        return getattr(leaf, "ndim", 0) >= 2
    return matrix_axes(path, leaf) is not None


__all__ = [
    "AXIS_GROUPS",
    "BATCH_AXES",
    "MatrixAxes",
    "is_matrix",
    "judged_as_slice",
    "matrix_axes",
    "names_by_path",
    "parameter_axes",
    "parameter_axes_known",
    "stacked_length",
    "with_parameter_axes",
]
