"""Each optimizer trains the tiny model; masks send the right parameters to decay and Muon."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.training.conftest import quick
from tests.training.tiny import TinyTrainer
from theseus.config import configuration
from theseus.registry import get_registry
from theseus.training.matrices import parameter_axes_known
from theseus.training.optimizers import (
    SGD,
    AdamW,
    Lion,
    Muon,
    Optimizer,
    clip_by_global_norm,
    decay_mask,
    muon_parameters,
)


@pytest.fixture(scope="module")
def tiny_problem(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model's initial parameters, its loss function and eight training batches."""
    trainer = TinyTrainer.create(tmp_path_factory.mktemp("opt"), quick())
    state = trainer.init_state()
    batches = [trainer.host_batch("train", position=s) for s in range(8)]
    model = trainer.model

    def loss_fn(params, batch):
        return model.apply({"params": params}, batch["x"], y=batch["y"], padding_mask=batch["padding_mask"])[1]

    return jax.device_get(state.params), loss_fn, batches


def losses(optimizer: Optimizer, lr: float, problem) -> list[float]:
    """Losses of eight updates by ``optimizer`` (its factory, as the trainer builds it)."""
    params, loss_fn, batches = problem
    with configuration({}):
        tx = optimizer.create(lr)

    @jax.jit
    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    opt_state = tx.init(params)
    out = []
    for batch in batches:
        params, opt_state, loss = step(params, opt_state, batch)
        out.append(loss)
    return [float(x) for x in jax.device_get(out)]


@pytest.mark.parametrize(
    ("optimizer", "lr"),
    [(AdamW, 1e-2), (Lion, 3e-3), (SGD, 0.3), (Muon, 2e-2)],
    ids=["adamw", "lion", "sgd", "muon"],
)
def test_optimizer_reduces_the_loss(optimizer: Optimizer, lr: float, tiny_problem) -> None:
    history = losses(optimizer, lr, tiny_problem)
    assert all(jnp.isfinite(jnp.asarray(history)))
    assert history[-1] < 0.8 * history[0], history


def test_optimizers_are_registered_components() -> None:
    registry = get_registry()
    for name, obj in (("adamw", AdamW), ("lion", Lion), ("sgd", SGD), ("muon", Muon)):
        assert registry.load_component("optimizer", name) is obj


def test_optimizer_config_comes_from_its_keys() -> None:
    with configuration({"optimizer/adamw/beta2": 0.5, "optimizer/adamw/weight_decay": 0.0}):
        tx = AdamW.create(1.0)
    params = {"w": jnp.ones((2, 2))}
    state = tx.init(params)
    grads = {"w": jnp.full((2, 2), 2.0)}
    updates, state = tx.update(grads, state, params)
    updates, _ = tx.update(grads, state, params)
    # Second Adam step with constant gradient: the bias-corrected update is -lr * g / (|g| + eps) = -1.
    assert jnp.allclose(updates["w"], -1.0, atol=1e-6)


def test_weight_decay_applies_to_matrices_only() -> None:
    params = {"dense": {"kernel": jnp.ones((3, 4)), "bias": jnp.ones(4)}, "norm": {"scale": jnp.ones(4)}}
    assert decay_mask(params) == {"dense": {"kernel": True, "bias": False}, "norm": {"scale": False}}
    tx = AdamW.factory(AdamW.config(weight_decay=0.5), 0.1)
    state = tx.init(params)
    zero = jax.tree.map(jnp.zeros_like, params)
    updates, _ = tx.update(zero, state, params)
    assert jnp.allclose(updates["dense"]["kernel"], -0.05)
    assert jnp.allclose(updates["dense"]["bias"], 0.0) and jnp.allclose(updates["norm"]["scale"], 0.0)


def test_muon_orthogonalises_hidden_matrices_and_leaves_embeddings_to_adamw() -> None:
    params = {
        "embed": jnp.ones((32, 8)),
        "up": {"kernel": jnp.ones((8, 16))},
        "lm_head": {"kernel": jnp.ones((8, 32))},
        "norm": {"scale": jnp.ones(8)},
    }
    specs = muon_parameters(params, ["embed", "lm_head"])
    assert specs["embed"] is None and specs["lm_head"]["kernel"] is None and specs["norm"]["scale"] is None
    assert specs["up"]["kernel"] is not None
    # The Muon update of a matrix is nearly orthogonal (Newton-Schulz flattens its singular values).
    tx = Muon.factory(Muon.config(consistent_rms=0.0, weight_decay=0.0), 1.0)
    assert isinstance(tx, optax.GradientTransformation)
    grads = jax.tree.map(lambda p: jax.random.normal(jax.random.PRNGKey(0), p.shape), params)
    updates, _ = jax.jit(tx.update)(grads, tx.init(params), params)

    def spread(matrix: jax.Array) -> float:
        singular = np.linalg.svd(np.asarray(matrix), compute_uv=False)
        return float(singular.max() / singular.min())

    assert spread(updates["up"]["kernel"]) < 2.0 < spread(grads["up"]["kernel"])


def test_logical_axis_names_decide_what_is_a_matrix_and_how_muon_reads_it() -> None:
    P = jax.sharding.PartitionSpec
    specs = {
        "named": {
            "query": P("embed", "heads", "head_dim"),
            "query_bias": P("heads", "head_dim"),
            "out": P("heads", "head_dim", "embed"),
            "stacked_up": P("layers", "embed", "mlp"),
            "stacked_scale": P("layers", "norm"),
            "wte": P("vocab", "embed"),
            "square": P("embed", "embed"),
            "unnamed": None,
        }
    }
    shapes = {
        "query": (8, 2, 4),
        "query_bias": (2, 4),
        "out": (2, 4, 8),
        "stacked_up": (3, 8, 16),
        "stacked_scale": (3, 8),
        "wte": (32, 8),
        "square": (8, 8),
        "unnamed": (8, 8),
    }
    params = {"named": {name: jnp.ones(shape) for name, shape in shapes.items()}}
    with parameter_axes_known(specs):
        decays = decay_mask(params)["named"]
        muon = muon_parameters(params, [])["named"]
    assert decays == {
        "query": True,
        "query_bias": False,
        "out": True,
        "stacked_up": True,
        "stacked_scale": False,
        "wte": True,
        "square": True,
        "unnamed": True,
    }
    dims = {k: v and (v.reduction_axis, v.output_axis) for k, v in muon.items()}
    assert dims == {
        "query": ((0,), (1, 2)),
        "query_bias": None,
        "out": ((0, 1), (2,)),
        "stacked_up": ((1,), (2,)),
        "stacked_scale": None,
        "wte": None,
        "square": ((0,), (1,)),
        "unnamed": ((0,), (1,)),
    }


@pytest.mark.parametrize("max_norm", [0.5, 5.0, 100.0])
def test_global_norm_clip_matches_optax(max_norm: float) -> None:
    grads = {"w": jnp.array([[3.0, -4.0], [1.0, 2.0]]), "b": jnp.array([0.5, -0.25])}
    ours, _ = clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    reference, _ = optax.clip_by_global_norm(max_norm).update(grads, optax.EmptyState())
    for name in grads:
        np.testing.assert_allclose(ours[name], reference[name], rtol=1e-6)
    zeros, _ = clip_by_global_norm(max_norm).update({"w": jnp.zeros(3)}, optax.EmptyState())
    np.testing.assert_array_equal(zeros["w"], np.zeros(3))
