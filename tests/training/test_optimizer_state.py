"""``optimizer/state_dtype`` and ``optimizer/offload``: the state kept narrower or in host memory trains as
the plain state does, resumes exactly, and the memory checks count only what the device holds."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.tolerances import float32_tolerance, magnitude, transformer_ops
from tests.training.conftest import quick
from tests.training.tiny import PaddedTinyTrainer
from theseus.training.compiled import held_bytes
from theseus.training.optimizer_state import HOST, stored_as

OFFLOAD = {"optimizer/offload": True}
steps = 6  # quick()
BF16_STATE = {"optimizer/state_dtype": "bfloat16"}


def run(root: Path, name: str, **extra: object) -> PaddedTinyTrainer:
    trainer = PaddedTinyTrainer.create(root, quick(run__name=name, **extra))
    trainer.run()
    return trainer


def train_losses(root: Path, name: str) -> list[float]:
    rows = [json.loads(line) for line in (root / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("split") == "train"]


def leaves(tree: object) -> list[np.ndarray]:
    return [np.asarray(leaf) for leaf in jax.tree.leaves(jax.device_get(tree))]


def test_an_offloaded_state_lives_in_host_memory_and_trains_as_the_plain_one(tmp_path: Path) -> None:
    plain = run(tmp_path, "plain")
    offloaded = run(tmp_path, "offloaded", **OFFLOAD)

    kinds = {leaf.sharding.memory_kind for leaf in jax.tree.leaves(offloaded.state.opt_state)}
    assert kinds == {HOST}
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(offloaded.state.params)} == {"device"}
    # The same AdamW arithmetic, compiled one parameter at a time: the parameters agree to float32 rounding
    # of six updates and the gradients between them (XLA fuses the per-parameter updates differently).
    tolerance = float32_tolerance(3 * steps * transformer_ops(1, 32, 16, 32))  # the tiny model: one layer of width 32
    for a, b in zip(leaves(plain.state.params), leaves(offloaded.state.params), strict=True):
        np.testing.assert_allclose(b, a, rtol=tolerance, atol=tolerance * magnitude(a))
    # The state is kept per parameter path: the same moments, regrouped.
    plain_moments = sorted(float(np.abs(leaf).sum()) for leaf in leaves(plain.state.opt_state) if leaf.ndim)
    offloaded_moments = sorted(float(np.abs(leaf).sum()) for leaf in leaves(offloaded.state.opt_state) if leaf.ndim)
    np.testing.assert_allclose(offloaded_moments, plain_moments, rtol=tolerance)
    # What the device holds of the state: the parameters alone.
    abstract, shardings = offloaded.abstract_state, offloaded.state_shardings
    assert held_bytes(abstract.opt_state, shardings.opt_state) == 0
    assert held_bytes(abstract.params, shardings.params) > 0

    # Half the state's bytes kept on the device (optimizer/offload_keep_gb): its first leaves stay there, the
    # rest crosses as before, and the arithmetic is the same.
    state_bytes = held_bytes(abstract.opt_state, shardings.opt_state, in_host_memory=True)
    partly = run(tmp_path, "partly", **OFFLOAD, optimizer__offload_keep_gb=state_bytes / 2 / 1e9)
    kinds = [leaf.sharding.memory_kind for leaf in jax.tree.leaves(partly.state.opt_state)]
    assert set(kinds) == {HOST, "device"}
    kept = held_bytes(partly.abstract_state.opt_state, partly.state_shardings.opt_state)
    assert state_bytes / 4 < kept <= state_bytes / 2
    for a, b in zip(leaves(plain.state.params), leaves(partly.state.params), strict=True):
        np.testing.assert_allclose(b, a, rtol=tolerance, atol=tolerance * magnitude(a))


def test_an_offloaded_state_resumes_exactly(tmp_path: Path) -> None:
    straight = run(tmp_path, "straight", **OFFLOAD)
    split = PaddedTinyTrainer.create(tmp_path, quick(run__name="split", training__stop_after=3, **OFFLOAD))
    split.run()
    resumed = PaddedTinyTrainer.create(tmp_path, quick(run__name="split", **OFFLOAD))
    resumed.run()
    assert int(resumed.state.step) == 6
    assert {leaf.sharding.memory_kind for leaf in jax.tree.leaves(resumed.state.opt_state)} == {HOST}
    for a, b in zip(leaves(straight.state), leaves(resumed.state), strict=True):
        np.testing.assert_array_equal(a, b)


def test_a_bfloat16_state_is_stored_narrow_and_trains_within_its_rounding(tmp_path: Path) -> None:
    plain = run(tmp_path, "plain")
    narrow = run(tmp_path, "narrow", **BF16_STATE, **OFFLOAD)

    dtypes = {
        leaf.dtype for leaf in jax.tree.leaves(narrow.state.opt_state) if jnp.issubdtype(leaf.dtype, jnp.floating)
    }
    assert dtypes == {jnp.dtype(jnp.bfloat16)}
    assert {leaf.dtype for leaf in jax.tree.leaves(narrow.state.params)} == {jnp.dtype(jnp.float32)}
    # Six AdamW steps at lr 1e-2 from moments rounded to bfloat16 (8 mantissa bits: a relative rounding of
    # 2**-9 a step): each parameter moves by at most 6 x lr, so the runs differ by a small part of that.
    moved = max(
        float(np.abs(a - b).max()) for a, b in zip(leaves(plain.state.params), leaves(narrow.state.params), strict=True)
    )
    assert 0 < moved < 6 * 1e-2 * 0.1
    # Losses agree to bfloat16's precision of the updates.
    np.testing.assert_allclose(train_losses(tmp_path, "narrow"), train_losses(tmp_path, "plain"), rtol=1e-2)


def test_stored_as_updates_in_float32_and_rounds_after() -> None:
    import optax

    params = {"w": jnp.linspace(-1.0, 1.0, 48, dtype=jnp.float32).reshape(6, 8)}
    grads = {"w": jnp.cos(params["w"] * 7.0)}
    tx = optax.adam(1e-3)
    wrapped = stored_as(tx, jnp.bfloat16)
    state = wrapped.init(params)
    assert state[0].mu["w"].dtype == jnp.bfloat16 and state[0].count.dtype == jnp.int32
    updates, new_state = wrapped.update(grads, state, params)
    reference_updates, reference_state = tx.update(grads, tx.init(params), params)
    # From zero moments the float32 update is exact; only the stored moments are rounded.
    np.testing.assert_array_equal(np.asarray(updates["w"]), np.asarray(reference_updates["w"]))
    np.testing.assert_array_equal(
        np.asarray(new_state[0].nu["w"]), np.asarray(reference_state[0].nu["w"].astype(jnp.bfloat16))
    )


def test_the_memory_line_names_the_optimizer_state_choices(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from tests.reliability.conftest import call_cli, error_line
    from tests.training.test_memory_auto import auto_run

    code = call_cli(auto_run(tmp_path, "training/memory_limit_gb=0.0001"))
    line = error_line(capsys.readouterr().err)
    assert code == 2
    assert "the parameters and optimizer state alone take" in line
    assert "optimizer/state_dtype=bfloat16" in line and "optimizer/offload=true" in line


def test_resuming_with_another_state_layout_is_one_line(tmp_path: Path) -> None:
    from theseus.errors import ConfigError

    run(tmp_path, "plain", training__stop_after=3)
    again = PaddedTinyTrainer.create(tmp_path, quick(run__name="plain", **OFFLOAD))
    with pytest.raises(ConfigError, match=r"started with optimizer/offload=False; .* resume with optimizer/offload="):
        again.run()


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_scanned_models_state_is_kept_and_updated_per_layer(optimizer: str) -> None:
    import flax.linen as nn
    import optax

    from tests.models.conftest import build, random_params
    from theseus.model.models import GPT
    from theseus.training.matrices import with_parameter_axes
    from theseus.training.optimizer_state import one_parameter_at_a_time
    from theseus.training.optimizers import Muon

    model = build(GPT, model__scan_layers=True, architecture__n_layers=3)
    specs = nn.get_partition_spec(jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))))
    tx = Muon.create(0.02, Muon.config()) if optimizer == "muon" else optax.adamw(1e-2, weight_decay=0.1)
    whole = with_parameter_axes(tx, specs["params"])
    sliced = with_parameter_axes(one_parameter_at_a_time(tx, offload=False), specs["params"])
    params = random_params(model, std=0.1)
    gradients = [random_params(model, seed=step, std=0.1) for step in (1, 2)]

    def two_updates(chain: optax.GradientTransformation) -> tuple[object, object]:
        state, p = chain.init(params), params
        for grads in gradients:
            updates, state = jax.jit(chain.update)(grads, state, p)
            p = optax.apply_updates(p, updates)
        return p, state

    expected, _ = two_updates(whole)
    got, state = two_updates(sliced)
    # The stacked MLP kernel [layers, embed, mlp] keeps one state per layer, each of one layer's shape.
    stacked = "blocks/mlp/up/kernel"
    per_layer = state[stacked]
    assert isinstance(per_layer, tuple) and len(per_layer) == 3
    assert {leaf.shape for leaf in jax.tree.leaves(per_layer) if leaf.ndim > 1} == {params_shape(params, stacked)[1:]}
    tolerance = float32_tolerance(2 * 5 * 128)  # two updates; Muon's Newton-Schulz products of width 128
    for a, b in zip(leaves(expected), leaves(got), strict=True):
        np.testing.assert_allclose(b, a, rtol=tolerance, atol=tolerance * magnitude(a))


def params_shape(params: object, key: str) -> tuple[int, ...]:
    from theseus.base.tree import path_text

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    return next(tuple(leaf.shape) for path, leaf in flat if path_text(path) == key)
