"""The examples of spec/extend-a-module.md, verbatim, and what a user relies on them doing."""

# ruff: noqa: I001  (the spec's import lines stay as written)

from __future__ import annotations

import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml

from tests.conftest import clean_env, run_cli
from tests.models.conftest import jitted
from theseus.config import Schema, configuration

# --- verbatim from extend-a-module.md -------------------------------------------------------
from theseus.config import field
from theseus.model.module import Module


class Scale(Module):
    factor: float = field("architecture/scale", default=1.0)

    @classmethod
    def components(cls):
        return []  # No configurable child modules.

    def __call__(self, x):
        return x * self.factor


from theseus.config import configure  # noqa: E402
from theseus.model.layers import MLP  # noqa: E402


class FeedForward(Module):
    @classmethod
    def components(cls):
        return [MLP]

    def setup(self):
        self.mlp = configure(MLP)

    def __call__(self, x, deterministic=False):
        return self.mlp(x, deterministic=deterministic)


from theseus.base.axis import ShardingPlan  # noqa: E402


class ReplicatedFeedForward(FeedForward):
    @property
    def sharding(self):
        return ShardingPlan()


class CountedFeedForward(FeedForward):
    def flops(self, seq):
        return self.mlp.flops(seq)


# --- end of the verbatim examples -------------------------------------------------------------


class ScaledFeedForward(FeedForward):
    """A subclass that keeps the parent's children and adds one."""

    @classmethod
    def components(cls):
        return [*super().components(), Scale]

    def setup(self):
        super().setup()
        self.scale = configure(Scale)

    def __call__(self, x, deterministic=False):
        return self.scale(super().__call__(x, deterministic=deterministic))


MLP_KEYS = {
    "architecture/n_embd",
    "architecture/d_ff",
    "architecture/mlp_ratio",
    "architecture/activation",
    "architecture/dropout",
}


def test_scale_reads_its_key() -> None:
    assert "architecture/scale" in Schema.build(Scale.gather())
    with configuration({"architecture/scale": 2.5}):
        scale = configure(Scale)
    assert scale.factor == 2.5
    np.testing.assert_allclose(scale.apply({}, jnp.arange(3.0)), [0.0, 2.5, 5.0])
    assert configure(Scale).factor == 1.0
    assert Scale.components() == []


def test_feed_forward_declares_builds_and_calls_mlp() -> None:
    gathered = FeedForward.gather()
    assert gathered[:2] == [FeedForward, MLP]
    schema = Schema.build(gathered)
    assert set(schema.keys()) >= MLP_KEYS
    with configuration({"architecture/d_ff": 24, "architecture/activation": "swiglu"}):
        model = configure(FeedForward)
    x = jnp.ones((2, 5, 8))
    variables = jitted(model.init, jax.random.key(0), x)
    # built from the configuration it was configured under, even though init runs outside it
    params = variables["params"]["mlp"]
    assert sorted(params) == ["down", "gate", "up"]
    assert params["up"]["kernel"].value.shape == (8, 24)
    out = jitted(model.apply, variables, x, deterministic=True)
    assert out.shape == (2, 5, 8)


def test_feed_forward_dropout_follows_deterministic() -> None:
    with configuration({"architecture/dropout": 0.5}):
        model = configure(FeedForward)
    x = jnp.ones((1, 16, 8))
    variables = jitted(model.init, jax.random.key(0), x)
    clean = jitted(model.apply, variables, x, deterministic=True)
    noisy = jitted(model.apply, variables, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
    other = jitted(model.apply, variables, x, deterministic=False, rngs={"dropout": jax.random.key(2)})
    assert not np.allclose(clean, noisy) and not np.allclose(noisy, other)
    assert np.mean(np.asarray(noisy) == 0.0) > 0.2


def test_replicated_feed_forward_has_empty_plan() -> None:
    assert configure(ReplicatedFeedForward).sharding == ShardingPlan()
    assert len(configure(ReplicatedFeedForward).sharding.rules()) == 0
    assert configure(FeedForward).sharding == ShardingPlan()  # the Module default is replicated too


def test_counted_feed_forward_delegates_flops_when_bound() -> None:
    with configuration({"architecture/n_embd": 8, "architecture/d_ff": 32}):
        model = configure(CountedFeedForward)
    variables = jitted(model.init, jax.random.key(0), jnp.ones((1, 4, 8)))
    expected = 6 * 10 * (2 * 8 * 32)  # up + down, forward + backward
    assert model.bind(variables).flops(10) == expected
    assert model.apply(variables, 10, method=CountedFeedForward.flops) == expected


def test_counted_feed_forward_infers_width_from_parameters() -> None:
    model = configure(CountedFeedForward)  # n_embd None: the MLP takes the input width
    variables = jitted(model.init, jax.random.key(0), jnp.ones((1, 4, 6)))
    assert model.bind(variables).flops(3) == 6 * 3 * (2 * 6 * 24)


def test_subclass_adds_a_child_and_keeps_the_parents() -> None:
    gathered = ScaledFeedForward.gather()
    assert gathered[:3] == [ScaledFeedForward, MLP, Scale]
    keys = set(Schema.build(gathered).keys())
    assert MLP_KEYS | {"architecture/scale"} <= keys
    with configuration({"architecture/scale": 0.0}):
        model = configure(ScaledFeedForward)
    x = jnp.ones((1, 3, 4))
    variables = jitted(model.init, jax.random.key(0), x)
    assert "mlp" in variables["params"]
    assert float(jnp.abs(jitted(model.apply, variables, x, deterministic=True)).max()) == 0.0


def test_listing_components_does_not_instantiate() -> None:
    built: list[str] = []

    class Loud(Module):
        def __post_init__(self) -> None:
            built.append("Loud")
            super().__post_init__()

    class Parent(Module):
        @classmethod
        def components(cls):
            return [Loud]

    assert Parent.gather()[:2] == [Parent, Loud]
    assert Schema.build(Parent.gather()) is not None
    assert built == []


JOB_FILE = textwrap.dedent(
    """
    from theseus.base.job import Job
    from theseus.config import field
    from theseus.model.module import Module
    from theseus.model.layers import MLP
    from theseus.model.models import GPT
    from theseus.registry import job


    class Scale(Module):
        factor: float = field("architecture/scale", default=1.0)


    class FeedForwardModel(GPT):
        @classmethod
        def components(cls):
            return [*super().components(), Scale]


    @job("test/configure/model")
    class ModelJob(Job):
        MODEL = FeedForwardModel

        @classmethod
        def config(cls):
            return [*super().config(), *cls.MODEL.gather()]
    """
)


def test_configure_output_lists_model_keys(tmp_path: Path) -> None:
    source = tmp_path / "model_job.py"
    source.write_text(JOB_FILE)
    out = tmp_path / "out.yaml"
    result = run_cli(
        ["--load", str(source), "configure", "test/configure/model", str(out), "architecture/preset=gpt2-124m"],
        env=clean_env(),
    )
    assert result.returncode == 0, result.stderr
    written = yaml.safe_load(out.read_text())
    arch = written["architecture"]
    assert arch["preset"] == "gpt2-124m"
    assert arch["scale"] == 1.0
    for key in ("n_layers", "n_heads", "n_embd", "d_ff", "vocab_size", "block_size", "activation", "norm_eps"):
        assert key in arch, key
    assert written["model"]["param_dtype"] == "float32"
