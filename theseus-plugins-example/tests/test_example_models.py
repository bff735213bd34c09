"""ScaledGPT: the guide's modules inside a GPT whose layers gain a scaled feed-forward branch."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from theseus.base.axis import ShardingPlan
from theseus.config import Schema, configuration, configure
from theseus.model.layers import MLP
from theseus.model.models import GPT
from theseus_plugins_example.models import ExtraFeedForward, ScaledBlock, ScaledGPT
from theseus_plugins_example.modules import CountedFeedForward, FeedForward, ReplicatedFeedForward, Scale

SMALL = {
    "architecture/n_layers": 2,
    "architecture/n_embd": 16,
    "architecture/n_heads": 2,
    "architecture/block_size": 8,
    "architecture/vocab_size": 40,
}


def init(cls: type, values: dict) -> tuple[Any, dict]:
    with configuration(values):
        model = configure(cls)
    x = jnp.arange(12, dtype=jnp.int32).reshape(2, 6) % 40
    return model, jax.jit(model.init)(jax.random.key(0), x)


@pytest.fixture(scope="module")
def scaled() -> tuple[Any, dict]:
    """A two-layer ScaledGPT with architecture/scale=0 and its parameters."""
    return init(ScaledGPT, {**SMALL, "architecture/scale": 0.0})


def logits_of(model: Any, variables: dict, x: jax.Array) -> np.ndarray:
    return np.asarray(jax.jit(lambda v, x: model.apply(v, x, deterministic=True)[0])(variables, x))


def test_gather_declares_the_new_children_and_their_keys() -> None:
    gathered = ScaledGPT.gather()
    for klass in (ScaledBlock, Scale, ExtraFeedForward, MLP):
        assert klass in gathered
    keys = Schema.build(gathered).keys()
    assert "architecture/scale" in keys and "architecture/d_ff" in keys and "architecture/preset" in keys
    assert Schema.build(ScaledGPT.gather())["architecture/scale"].default == 1.0
    assert issubclass(ExtraFeedForward, CountedFeedForward) and issubclass(ExtraFeedForward, ReplicatedFeedForward)


def test_scale_zero_computes_exactly_what_gpt_computes(scaled: tuple[Any, dict]) -> None:
    x = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 8)), jnp.int32)
    model, variables = scaled
    params = variables["params"]
    assert set(params["blocks_0"]) == {"attn_norm", "attn", "mlp_norm", "mlp", "extra"}
    gpt_params = {
        name: ({k: v for k, v in tree.items() if k != "extra"} if name.startswith("blocks_") else tree)
        for name, tree in params.items()
    }
    with configuration(SMALL):
        gpt = configure(GPT)
    gpt_logits = logits_of(gpt, {"params": gpt_params}, x)
    np.testing.assert_allclose(logits_of(model, variables, x), gpt_logits, rtol=1e-6, atol=1e-6)

    with configuration({**SMALL, "architecture/scale": 1.0}):
        active = configure(ScaledGPT)
    assert not np.allclose(logits_of(active, variables, x), gpt_logits, atol=1e-4)


def test_unbound_flops_equal_the_bound_layers_count(scaled: tuple[Any, dict]) -> None:
    seq = 8
    model, variables = scaled
    bound = model.bind(variables)
    per_layer = [block.flops(seq) for block in bound.blocks]
    head = 6 * seq * 16 * model.architecture.padded_vocab_size  # the output head, padded vocabulary
    assert model.flops(seq) == sum(per_layer) + head
    # the extra branch is one more MLP of GPT's size per layer
    with configuration(SMALL):
        gpt = configure(GPT)
    assert model.flops(seq) - gpt.flops(seq) == 2 * 6 * seq * (2 * 16 * 64)


def test_sharding_plan_is_gpts_and_the_branch_adds_nothing() -> None:
    assert configure(ExtraFeedForward).sharding == ShardingPlan()
    assert configure(ScaledGPT).sharding == configure(GPT).sharding
    assert configure(FeedForward).sharding == ShardingPlan()


def test_training_modules_follow_dropout_and_scale() -> None:
    with configuration({"architecture/scale": 2.0}):
        scale = configure(Scale)
    np.testing.assert_allclose(np.asarray(scale.apply({}, jnp.ones(3))), [2.0, 2.0, 2.0])
    with configuration({"architecture/dropout": 0.5}):
        ff = configure(FeedForward)
    x = jnp.ones((1, 16, 8))
    variables = ff.init(jax.random.key(0), x)
    clean = ff.apply(variables, x, deterministic=True)
    noisy = ff.apply(variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    assert not np.allclose(np.asarray(clean), np.asarray(noisy))


@pytest.mark.parametrize("name", ["example-scaled-gpt"])
def test_model_is_registered_by_entry_point(name: str) -> None:
    from theseus.registry import resolve_component

    assert resolve_component("model", name) is ScaledGPT
    assert resolve_component("layer", "example-scale") is Scale
