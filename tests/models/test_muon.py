"""Muon with batched Newton-Schulz iterations gives optax's Muon updates and keeps its state."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from optax.contrib import MuonDimensionNumbers

from benchmarks.muon_step import optax_muon_like
from tests.models.conftest import build, random_params
from theseus.model.models import GPT, Llama, TransformerLM
from theseus.training.matrices import with_parameter_axes
from theseus.training.muon import matrix_view, newton_schulz
from theseus.training.optimizers import Muon


@pytest.mark.parametrize(
    ("family", "scan", "consistent_rms"),
    [(GPT, True, 0.0), (Llama, False, 0.2)],
    ids=["gpt-stacked-width-scaling", "llama-per-layer-gqa"],
)
def test_muon_matches_optax_muon_and_keeps_its_state(
    family: type[TransformerLM], scan: bool, consistent_rms: float
) -> None:
    model = build(family, model__scan_layers=scan)
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32)))
    specs = nn.get_partition_spec(boxed)["params"]
    params = random_params(model, std=0.1)
    config = Muon.config(consistent_rms=consistent_rms, weight_decay=0.3, adam_lr_ratio=2.0)
    ours, theirs = (with_parameter_axes(tx, specs) for tx in (Muon.create(0.02, config), optax_muon_like(config, 0.02)))

    gradients = [random_params(model, seed=step, std=0.1) for step in range(1, 4)]

    def three_updates(tx, p, gradients):
        state = tx.init(p)
        out = []
        for grads in gradients:
            updates, state = tx.update(grads, state, p)
            out.append(updates)
        return out, state

    (our_updates, our_state), (their_updates, their_state) = (
        jax.jit(lambda p, g, tx=tx: three_updates(tx, p, g))(params, gradients) for tx in (ours, theirs)
    )
    # Same state tree (checkpoints of either optimizer load into the other) and the same updates.
    assert jax.tree.structure(our_state) == jax.tree.structure(their_state)
    for ours_leaf, theirs_leaf in zip(jax.tree.leaves(our_state), jax.tree.leaves(their_state), strict=True):
        np.testing.assert_allclose(np.asarray(ours_leaf), np.asarray(theirs_leaf), rtol=1e-5, atol=1e-7)
    for step_ours, step_theirs in zip(our_updates, their_updates, strict=True):
        for a, b in zip(jax.tree.leaves(step_ours), jax.tree.leaves(step_theirs), strict=True):
            scale = float(np.abs(np.asarray(b)).max())
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=2e-5 * scale + 1e-9)


def test_matrix_views_round_trip_and_put_the_smaller_side_in_rows() -> None:
    x = jnp.arange(2 * 4 * 3 * 5, dtype=jnp.float32).reshape(2, 4, 3, 5)
    # A stack of 2 matrices reading axes (1, 2) (12 inputs) into axis 3 (5 outputs): tall, so transposed.
    view = matrix_view(x, MuonDimensionNumbers(reduction_axis=(1, 2), output_axis=3))
    matrices = view.to_matrices(x)
    assert matrices.shape == (2, 5, 12) and view.transposed and (view.fan_in, view.fan_out) == (12, 5)
    np.testing.assert_array_equal(matrices[1], np.asarray(x[1]).reshape(12, 5).T)
    np.testing.assert_array_equal(view.from_matrices(matrices), x)
    # Square matrices with names: the side whose names sort first becomes the rows, so an attention
    # output [heads, head_dim, embed] is viewed like the query [embed, heads, head_dim].
    out = jnp.ones((2, 3, 6))
    dims = MuonDimensionNumbers(reduction_axis=(0, 1), output_axis=2)
    named = matrix_view(out, dims, ("heads", "head_dim", "embed"))
    assert named.transposed and named.sides(("heads", "head_dim", "embed")) == ((), ("embed",), ("heads", "head_dim"))
    assert not matrix_view(out, dims).transposed


def test_newton_schulz_flattens_singular_values_of_each_matrix() -> None:
    rng = np.random.default_rng(0)
    stack = jnp.asarray(rng.standard_normal((3, 8, 24)) * np.array([1.0, 1e-3, 1e3])[:, None, None], jnp.float32)
    result = np.asarray(newton_schulz(stack, jnp.asarray((3.4445, -4.7750, 2.0315)), 5, 1e-8))
    for matrix in result:  # each matrix on its own scale: singular values in the iteration's (0.5, 1.5) band
        singular = np.linalg.svd(matrix, compute_uv=False)
        assert singular.min() > 0.5 and singular.max() < 1.5, singular


@pytest.mark.parametrize(
    ("shape", "reduction", "output"),
    [
        ((6, 3, 5), (0, 2), 1),  # reduction axes around the output axis
        ((4, 3, 2, 5), (2, 0), (3, 1)),  # axes listed out of order
        ((3, 2, 4, 5), (3,), (0, 2)),  # a batch axis (1) between output axes; tall, so transposed
        ((5, 2, 3, 4), (-1, 0), (2,)),  # negative axes, batch axis 1
    ],
)
def test_stacked_views_orthogonalise_like_optax_one_parameter_at_a_time(shape, reduction, output) -> None:
    """Parameters whose matrix axes are reordered, grouped with copies of other batch sizes, come back
    in their own layout with the values optax computes for each of them alone."""
    from optax.contrib._muon import orthogonalize_via_newton_schulz

    from theseus.training.muon import NS_COEFFICIENTS, orthogonalize

    rng = np.random.default_rng(0)
    dims = MuonDimensionNumbers(reduction_axis=reduction, output_axis=output)
    batch_axes = [a for a in range(len(shape)) if a not in {r % len(shape) for r in np.atleast_1d(reduction)}]
    batch_axes = [a for a in batch_axes if a not in {o % len(shape) for o in np.atleast_1d(output)}]
    wider = list(shape)
    if batch_axes:  # a second parameter with another batch size joins the same group
        wider[batch_axes[0]] += 2
    updates = {
        "a": jnp.asarray(rng.standard_normal(shape), jnp.float32),
        "b": jnp.asarray(rng.standard_normal(shape) * 30.0, jnp.float32),
        "c": jnp.asarray(rng.standard_normal(wider), jnp.float32),
    }
    coefficients = jnp.asarray(NS_COEFFICIENTS)
    dims_of = lambda tree: jax.tree.map(lambda _: dims, tree)  # noqa: E731
    ours = jax.jit(lambda u: orthogonalize(u, dims_of, coefficients, 5, 1e-8))(updates)
    reference = jax.jit(lambda v: orthogonalize_via_newton_schulz(v, coefficients, 5, dimension_numbers=dims))
    for name, value in updates.items():
        expected = np.asarray(reference(value))
        assert ours[name].shape == value.shape
        np.testing.assert_allclose(np.asarray(ours[name]), expected, rtol=0, atol=2e-5 * np.abs(expected).max())
