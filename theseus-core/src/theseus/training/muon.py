"""Muon whose Newton-Schulz iterations run once per group of like matrices, not once per parameter.

Muon orthogonalises the momentum of every hidden matrix with a few Newton-Schulz iterations. Run
one parameter at a time, a small model's step is a long chain of tiny dependent products: on two
CPU cores a GPT of the demo's size (2 layers, width 128, 8x128 tokens) spent a third of its step
there (83 ms against 56 ms with AdamW; 71 ms batched, ``benchmarks/muon_step.py``). Here the
matrices are first viewed as ``[batch, rows, cols]`` with ``rows <= cols`` (a tall matrix is
transposed: the iteration commutes with transposition), then those with the same view shape,
dtype and logical axis names (so the same sharding) are stacked and orthogonalised together.

The mathematics and the optimizer state are those of ``optax.contrib.muon`` (Nesterov momentum
with bias correction, the quintic iteration with coefficients (3.4445, -4.7750, 2.0315) after a
Frobenius normalisation, width scaling ``sqrt(max(1, fan_out / fan_in))``), so checkpoints of
either load into the other; the updates agree to float rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers, MuonState

from theseus.training.matrices import parameter_axes

#: The quintic Newton-Schulz coefficients of the Muon recipe (steepest slope at zero).
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)

DimensionNumbers = Callable[[Any], Any]
AxisNames = tuple[str | None, ...] | None


@dataclass(frozen=True)
class MatrixView:
    """How one parameter is read as a stack of ``rows x cols`` matrices (``rows <= cols``)."""

    batch: tuple[int, ...]  # the parameter's axes that index the stack
    reduction: tuple[int, ...]  # its input axes (the matrix's rows unless transposed)
    output: tuple[int, ...]  # its output axes
    shape: tuple[int, ...]  # the parameter's shape
    transposed: bool  # the view's rows are the output axes

    @property
    def order(self) -> tuple[int, ...]:
        return self.batch + self.reduction + self.output

    @property
    def fan_in(self) -> int:
        return math.prod(self.shape[a] for a in self.reduction)

    @property
    def fan_out(self) -> int:
        return math.prod(self.shape[a] for a in self.output)

    @property
    def rows_cols(self) -> tuple[int, int]:
        return (self.fan_out, self.fan_in) if self.transposed else (self.fan_in, self.fan_out)

    def sides(self, names: tuple[str | None, ...]) -> tuple[tuple[str | None, ...], ...]:
        """The axis names of the stack, the rows and the columns."""
        rows, cols = (self.output, self.reduction) if self.transposed else (self.reduction, self.output)
        return tuple(tuple(names[a] for a in axes) for axes in (self.batch, rows, cols))

    def to_matrices(self, x: jax.Array) -> jax.Array:
        batch = math.prod(self.shape[a] for a in self.batch)
        stacked = x.transpose(self.order).reshape(batch, self.fan_in, self.fan_out)
        return jnp.swapaxes(stacked, 1, 2) if self.transposed else stacked

    def from_matrices(self, m: jax.Array) -> jax.Array:
        stacked = jnp.swapaxes(m, 1, 2) if self.transposed else m
        order = self.order
        inverse = sorted(range(len(order)), key=lambda i: order[i])
        return stacked.reshape(tuple(self.shape[a] for a in order)).transpose(inverse)


def _axes(axes: int | tuple[int, ...], ndim: int) -> tuple[int, ...]:
    return tuple(a % ndim for a in ((axes,) if isinstance(axes, int) else axes))


def matrix_view(x: Any, dims: MuonDimensionNumbers, names: AxisNames = None) -> MatrixView:
    """The ``[batch, rows, cols]`` view of ``x`` under Muon dimension numbers ``dims``.

    A tall matrix is transposed. A square one with known axis ``names`` puts the side whose names
    sort first in its rows, so an attention output ``heads x embed`` is viewed as ``embed x heads``,
    as the query, key and value are, and stacks with them."""
    reduction, output = _axes(dims.reduction_axis, x.ndim), _axes(dims.output_axis, x.ndim)
    if set(reduction) & set(output):
        raise ValueError(f"Muon reduction axes {reduction} and output axes {output} overlap (shape {x.shape})")
    batch = tuple(a for a in range(x.ndim) if a not in reduction and a not in output)
    view = MatrixView(batch, reduction, output, tuple(x.shape), transposed=False)
    if view.fan_in > view.fan_out:
        return dataclasses.replace(view, transposed=True)
    if view.fan_in == view.fan_out and names is not None:
        _, rows, cols = view.sides(names)
        return dataclasses.replace(view, transposed=tuple(map(str, rows)) > tuple(map(str, cols)))
    return view


def _group_key(x: Any, view: MatrixView, names: AxisNames) -> Hashable:
    """Matrices stacked together: same view shape and dtype, and the same axis names on the same
    side of the view (hence the same sharding; unnamed parameters group by shape alone)."""
    return view.rows_cols, jnp.dtype(x.dtype).name, None if names is None else view.sides(names)


@dataclass(frozen=True)
class _Leaf:
    path: tuple[Any, ...]
    value: Any
    dims: MuonDimensionNumbers


def _with_dimension_numbers(updates: Any, dimension_numbers: DimensionNumbers) -> list[_Leaf]:
    """The leaves of ``updates`` in order, each with its path and its Muon dimension numbers."""
    paired = jax.tree_util.tree_map_with_path(_Leaf, updates, dimension_numbers(updates))
    return jax.tree.leaves(paired, is_leaf=lambda x: isinstance(x, _Leaf))


def newton_schulz(x: jax.Array, coefficients: jax.Array, steps: int, eps: float) -> jax.Array:
    """Approximately orthogonalise each ``[rows, cols]`` matrix of ``x`` (``rows <= cols``)."""
    x = x / (jnp.sqrt(jnp.sum(jnp.square(x), axis=(-2, -1), keepdims=True)) + eps)
    a, b, c = (coefficients[i].astype(x.dtype) for i in range(3))
    for _ in range(steps):
        gram = x @ jnp.swapaxes(x, -1, -2)
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    return x


def orthogonalize(
    updates: Any, dimension_numbers: DimensionNumbers, coefficients: jax.Array, steps: int, eps: float
) -> Any:
    """Orthogonalise every leaf of ``updates`` as Muon does, one batched iteration per group.

    ``dimension_numbers(updates)`` gives a ``MuonDimensionNumbers`` for every leaf."""
    leaves = _with_dimension_numbers(updates, dimension_numbers)
    views: list[MatrixView] = []
    groups: dict[Hashable, list[int]] = {}
    for index, leaf in enumerate(leaves):
        names = parameter_axes(leaf.path, leaf.value)
        views.append(matrix_view(leaf.value, leaf.dims, names))
        groups.setdefault(_group_key(leaf.value, views[-1], names), []).append(index)
    results: list[Any] = [None] * len(leaves)
    for members in groups.values():
        matrices = [views[i].to_matrices(leaves[i].value) for i in members]
        sizes = [m.shape[0] for m in matrices]
        stacked = matrices[0] if len(matrices) == 1 else jnp.concatenate(matrices, axis=0)
        done = newton_schulz(stacked, coefficients, steps, eps)
        start = 0
        for i, size in zip(members, sizes, strict=True):
            results[i] = views[i].from_matrices(done[start : start + size])
            start += size
    return jax.tree.unflatten(jax.tree.structure(updates), results)


def scale_by_muon(
    dimension_numbers: DimensionNumbers,
    beta: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    eps: float = 1e-8,
) -> optax.GradientTransformation:
    """Muon's orthogonalised, bias-corrected (Nesterov) momentum; state ``optax.contrib.MuonState``."""

    def init(params: Any) -> MuonState:
        return MuonState(
            count=jnp.zeros([], jnp.int32),
            mu=optax.tree.zeros_like(params),
            ns_coeffs=jnp.asarray(NS_COEFFICIENTS),
        )

    def update(updates: Any, state: MuonState, params: Any = None) -> tuple[Any, MuonState]:
        del params
        if state.ns_coeffs.shape != (3,):
            raise ValueError(f"Muon state holds Newton-Schulz coefficients of shape {state.ns_coeffs.shape}, not (3,)")
        mu = optax.tree.update_moment(updates, state.mu, beta, 1)
        count = optax.safe_increment(state.count)
        if nesterov:
            ahead = optax.tree.bias_correction(mu, beta, optax.safe_increment(count))
            current = optax.tree.bias_correction(updates, beta, count)
            direction = jax.tree.map(lambda m, g: beta * m + (1 - beta) * g, ahead, current)
        else:
            direction = optax.tree.bias_correction(mu, beta, count)
        orthogonal = orthogonalize(direction, dimension_numbers, state.ns_coeffs, ns_steps, eps)
        return orthogonal, MuonState(count=count, mu=mu, ns_coeffs=state.ns_coeffs)

    return optax.GradientTransformation(init, update)


def scale_by_shape(
    dimension_numbers: DimensionNumbers, consistent_rms: float | None = None
) -> optax.GradientTransformation:
    """Scale each orthogonalised matrix by ``sqrt(max(1, fan_out / fan_in))``, or with
    ``consistent_rms`` by ``sqrt(max(fan_in, fan_out)) * consistent_rms`` (update RMS like AdamW's)."""

    def scale(x: jax.Array, dims: MuonDimensionNumbers) -> jax.Array:
        view = matrix_view(x, dims)
        if consistent_rms is not None:
            return x * (math.sqrt(max(view.fan_in, view.fan_out)) * consistent_rms)
        return x * math.sqrt(max(1.0, view.fan_out / view.fan_in))

    def update(updates: Any, state: optax.EmptyState, params: Any = None) -> tuple[Any, optax.EmptyState]:
        del params
        scaled = [scale(leaf.value, leaf.dims) for leaf in _with_dimension_numbers(updates, dimension_numbers)]
        return jax.tree.unflatten(jax.tree.structure(updates), scaled), state

    return optax.GradientTransformation(optax.init_empty_state, update)
