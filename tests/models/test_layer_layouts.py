"""Scanned (stacked) and unrolled (per-layer) layers: the same model, and checkpoints that load into
either layout, optimizer state included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.models.conftest import build, forward, logits_loss_grads, random_params
from tests.models.test_models import batch
from tests.tolerances import float32_tolerance, magnitude, model_ops
from theseus.checkpoint import CheckpointStore
from theseus.checkpoint.layers import per_layer, stacked
from theseus.errors import CheckpointError, ConfigError
from theseus.model.models import GPT, Llama, TransformerLM
from theseus.training.matrices import parameter_axes_known, with_parameter_axes
from theseus.training.optimizers import AdamW, Muon, Optimizer, muon_parameters


def test_stacked_and_per_layer_parameters_give_the_same_logits_and_gradients(family: type[TransformerLM]) -> None:
    unrolled, scanned = build(family, model__scan_layers=False), build(family, model__scan_layers=True)
    assert (unrolled.stacked_layers, scanned.stacked_layers) == ((), ("blocks",))
    params = random_params(unrolled, std=0.1)
    x, y, mask = batch()

    logits_a, loss_a, grads_a = logits_loss_grads(unrolled, params, x, y, mask)
    logits_b, loss_b, grads_b = logits_loss_grads(scanned, stacked(params, ["blocks"]), x, y, mask)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=1e-5, rtol=0)
    ops = model_ops(unrolled)
    assert abs(float(loss_a) - float(loss_b)) <= float32_tolerance(ops, scale=float(loss_a))
    atol = float32_tolerance(3 * ops, scale=magnitude(grads_a))  # forward and backward
    for a, b in zip(jax.tree.leaves(stacked(grads_a, ["blocks"])), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


def test_per_layer_windows_and_rope_bases_give_the_same_model_in_both_layouts() -> None:
    """Gemma 3's ``layer_types`` (a window of 4 on layers 0 and 2, full attention on layer 1, a RoPE
    base each, linear scaling on the full layer) in unrolled layers (static per layer) and scanned
    ones (selected by the scanned layer index): the same logits, loss and gradients, and KV-cache
    decoding in the scanned layout equals rerunning the prefix. (Gemma 2's soft-capping in both
    layouts: tests/huggingface/test_import_parity.py.)"""
    from theseus.model.models import Gemma3, decode_step, init_cache

    values = {
        "architecture__n_layers": 3,
        "architecture__n_kv_heads": 2,
        "architecture__sliding_window": 4,
        "architecture__layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "architecture__rope_local_theta": 100.0,
        "architecture__rope_scaling": "linear",  # on the full layer only
        "architecture__rope_factor": 4.0,
    }
    unrolled, scanned = (build(Gemma3, model__scan_layers=scan, **values) for scan in (False, True))
    params = random_params(unrolled, std=0.1)
    x, y, mask = batch()

    logits_a, loss_a, grads_a = logits_loss_grads(unrolled, params, x, y, mask)
    stacked_params = stacked(params, ["blocks"])
    logits_b, loss_b, grads_b = logits_loss_grads(scanned, stacked_params, x, y, mask)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=1e-5, rtol=0)
    assert abs(float(loss_a) - float(loss_b)) <= float32_tolerance(model_ops(unrolled), scale=float(loss_a))
    # the scanned layers compute the RoPE frequencies of a traced base (a few float32 ulps off the
    # constant-folded ones): gradients agree to 1e-5
    for a, b in zip(jax.tree.leaves(stacked(grads_a, ["blocks"])), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)
    windowless = unrolled.clone(layer_types=["full_attention"] * 3)
    full_logits = forward(windowless, params, x, mask)
    assert float(np.max(np.abs(full_logits - np.asarray(logits_a))[mask])) > 1e-3  # windows bind

    # 12 tokens: prefill 5, then one at a time past the window. Unrolled, a sliding layer's cache is a ring
    # of 4 slots (its window is fixed); scanned, every layer's is 12 long (stacked caches share one shape).
    rows = np.asarray(x[:1])
    whole = forward(unrolled, params, rows)
    for model, p in ((unrolled, params), (scanned, stacked_params)):
        cache = init_cache(model, 1, rows.shape[1])
        if model is unrolled:
            assert [cache[f"blocks_{i}"]["attn"]["key"].shape[2] for i in range(3)] == [4, 12, 4]
        else:
            assert cache["blocks"]["attn"]["key"].shape[3] == 12 and "slots" not in cache["blocks"]["attn"]
        logits, cache = decode_step(model, p, cache, rows[:, :5])
        steps = [np.asarray(logits)]
        for t in range(5, rows.shape[1]):
            logits, cache = decode_step(model, p, cache, rows[:, t : t + 1])
            steps.append(np.asarray(logits))
        np.testing.assert_allclose(np.concatenate(steps, axis=1), np.asarray(whole), atol=2e-5, rtol=0)


@pytest.mark.parametrize("scan", [True, False], ids=["stacked", "per-layer"])
def test_remat_policies_give_the_same_loss_and_gradients(scan: bool) -> None:
    x, y, mask = batch()
    plain = build(Llama, model__scan_layers=scan)
    params = random_params(plain, std=0.1)

    def grads(model: TransformerLM) -> tuple[jax.Array, dict]:
        fn = lambda p: model.apply({"params": p}, x, y, padding_mask=mask)[1]  # noqa: E731
        return jax.value_and_grad(fn)(params)

    models = [build(Llama, model__scan_layers=scan, model__remat=policy) for policy in ("full", "dots")]
    assert [m.remat_policy for m in models] == ["full", "dots"]
    assert build(Llama, model__remat=True).remat_policy == "full"  # the former boolean key still reads
    assert build(Llama, model__remat=False).remat_policy == "none"
    (loss, reference), *others = jax.jit(lambda: [grads(m) for m in (plain, *models)])()
    ops = model_ops(plain)
    atol = float32_tolerance(3 * ops, scale=magnitude(reference))  # forward and backward
    for other_loss, other in others:
        assert float(other_loss) == pytest.approx(float(loss), rel=float32_tolerance(ops))
        for a, b in zip(jax.tree.leaves(reference), jax.tree.leaves(other), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=atol)


def test_an_unknown_remat_policy_is_one_error() -> None:
    with pytest.raises(ConfigError, match=r"model/remat='some' is not one of none, full, dots"):
        build(GPT, model__remat="some").init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))


@pytest.mark.parametrize(
    ("family", "optimizer"), [(GPT, AdamW), (GPT, Muon), (Llama, Muon)], ids=["gpt-adamw", "gpt-muon", "llama-muon"]
)
def test_optimizers_update_both_layouts_alike(family: type[TransformerLM], optimizer: Optimizer) -> None:
    """Weight decay and Muon's orthogonalisation treat a stacked layer's parameters like its own:
    norms and biases are never decayed or orthogonalised, attention's kernels are matrices."""
    unrolled, scanned = build(family, model__scan_layers=False), build(family, model__scan_layers=True)
    specs = [
        nn.get_partition_spec(jax.eval_shape(lambda m=m: m.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))))
        for m in (unrolled, scanned)
    ]
    params, grads = random_params(unrolled, std=0.1), random_params(unrolled, seed=1, std=0.1)
    tx = optimizer.create(0.05, config=optimizer.config(weight_decay=0.5))
    per_layer_tx, stacked_tx = (with_parameter_axes(tx, spec["params"]) for spec in specs)

    def two_updates(tx: optax.GradientTransformation, p: dict, g: dict) -> dict:
        state = tx.init(p)
        _, state = tx.update(g, state, p)
        updates, _ = tx.update(jax.tree.map(lambda x: -x, g), state, p)
        return updates

    per_layer_updates = jax.jit(lambda p, g: two_updates(per_layer_tx, p, g))(params, grads)
    stacked_params, stacked_grads = stacked(params, ["blocks"]), stacked(grads, ["blocks"])
    stacked_updates = jax.jit(lambda p, g: two_updates(stacked_tx, p, g))(stacked_params, stacked_grads)
    expected = jax.tree.leaves(stacked(per_layer_updates, ["blocks"]))
    # Muon's five Newton-Schulz iterations, three matrix products each over up to 4 x the width
    ops = 5 * 3 * 4 * unrolled.architecture.n_embd
    atol = float32_tolerance(ops, scale=magnitude(expected))
    for a, b in zip(expected, jax.tree.leaves(stacked_updates), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)
    # Without a gradient, a stacked norm scale stays put, while a stacked kernel decays.
    zero = jax.tree.map(jnp.zeros_like, stacked_grads)
    still, _ = jax.jit(lambda p, g: stacked_tx.update(g, stacked_tx.init(p), p))(stacked_params, zero)
    assert float(jnp.abs(still["blocks"]["attn_norm"]["scale"]).max()) == 0.0
    assert float(jnp.abs(still["blocks"]["attn"]["query"]).max()) > 0.0
    # Muon reads the stacked query kernel [layers, embed, heads, head_dim] as one embed x heads*head_dim
    # matrix per layer.
    with parameter_axes_known(specs[1]["params"]):
        query = muon_parameters(stacked_params, [])["blocks"]["attn"]["query"]
    assert (query.reduction_axis, query.output_axis) == ((1,), (2, 3))


#: The trainer tests' GPT: two layers (a stack of more than one), 32 wide, the 300 ids ``fixed_batch`` draws from,
#: no plots (none is read; drawing them imports matplotlib in each run). The trainer's default is 4 layers, 128 wide.
SMALL_TRAINER = {
    "architecture/vocab_size": 300,
    "architecture/n_layers": 2,
    "architecture/n_embd": 32,
    "architecture/n_heads": 4,
    "training/plots": False,
}


def test_the_trainers_optimizer_decays_matrices_only(tmp_path: Path) -> None:
    """The trainer hands its model's axis names to the optimizer it builds: a scanned model's
    stacked norm scales and biases are not decayed, its kernels are."""
    from tests.huggingface.test_init_from import QUICK, FixedGPT

    settings = {**QUICK, **SMALL_TRAINER, "model/scan_layers": True}
    trainer = FixedGPT.create(tmp_path, {**settings, "optimizer/adamw/weight_decay": 0.5})
    trainer.setup()
    tx = trainer.tx
    assert tx is not None
    params = jax.tree.map(lambda a: jnp.ones(a.shape, a.dtype), trainer.abstract_state.params)
    updates, _ = jax.jit(lambda p: tx.update(jax.tree.map(jnp.zeros_like, p), tx.init(p), p))(params)
    block = updates["blocks"]
    assert float(jnp.abs(block["attn_norm"]["scale"]).max()) == 0.0
    assert float(jnp.abs(block["attn"]["query_bias"]).max()) == 0.0
    assert float(jnp.abs(block["attn"]["query"]).min()) > 0.0  # decoupled decay: lr x 0.5 x 1


def _train_state(model: TransformerLM, params: dict) -> dict:
    """Parameters plus AdamW moments after one update (so the moments are not all zero)."""
    tx = optax.adamw(1e-2)

    def moments(p: dict) -> optax.OptState:
        grads = jax.tree.map(lambda leaf: jnp.ones_like(leaf) * 0.5, p)
        return tx.update(grads, tx.init(p), p)[1]

    return {"params": params, "opt_state": jax.jit(moments)(params), "step": jnp.asarray(7, jnp.int32)}


def _abstract(tree: dict) -> dict:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.asarray(a).dtype, sharding=device), tree)


@pytest.mark.parametrize("saved_scanned", [False, True], ids=["per-layer-to-stacked", "stacked-to-per-layer"])
def test_a_checkpoint_loads_into_the_other_layout(tmp_path: Path, saved_scanned: bool) -> None:
    unrolled = build(Llama, model__scan_layers=False)
    params = random_params(unrolled, seed=5)
    per_layer_state = _train_state(unrolled, params)
    stacked_state = jax.tree.map(jnp.asarray, stacked(per_layer_state, ["blocks"]))
    saved, wanted = (stacked_state, per_layer_state) if saved_scanned else (per_layer_state, stacked_state)
    store = CheckpointStore(tmp_path, keep=1, async_save=False)
    store.save(1, saved, {"step": 1})
    restored, meta = store.restore(1, _abstract(wanted))
    store.close()
    assert meta == {"step": 1}
    assert jax.tree.structure(restored) == jax.tree.structure(wanted)
    for got, expected in zip(jax.tree.leaves(restored), jax.tree.leaves(wanted), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))  # bit for bit, moments included
    mu = restored["opt_state"][0].mu
    assert ("blocks" in mu) == (not saved_scanned) and ("blocks_0" in mu) == saved_scanned


def test_a_mismatch_after_conversion_names_the_saved_parameter(tmp_path: Path) -> None:
    small = build(Llama, model__scan_layers=False)
    store = CheckpointStore(tmp_path, keep=1, async_save=False)
    store.save(1, {"params": random_params(small)}, {"step": 1})
    wider = build(Llama, architecture__n_embd=64, model__scan_layers=True)
    wanted = _abstract(jax.tree.map(jnp.asarray, random_params(wider)))
    with pytest.raises(CheckpointError, match=r"parameter 'blocks_0/.*' of shape \(32,.*expects \(64,"):
        store.restore(1, {"params": wanted})
    store.close()


def test_per_layer_views_of_the_cache_and_parameters_round_trip() -> None:
    scanned = build(GPT, model__scan_layers=True)
    params = random_params(scanned)
    view = per_layer(params, scanned.stacked_layers)
    n = scanned.architecture.n_layers
    assert [k for k in view if k.startswith("blocks")] == [f"blocks_{i}" for i in range(n)]
    np.testing.assert_array_equal(view["blocks_1"]["attn"]["query"], np.asarray(params["blocks"]["attn"]["query"])[1])
    again = stacked(view, scanned.stacked_layers)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_a_run_resumes_in_the_other_layout(tmp_path: Path) -> None:
    """A run stopped after 2 unrolled steps continues scanned with the losses of the unrolled run that
    was never stopped (the optimizer's moments and the data position come through the conversion)."""
    from tests.huggingface.test_init_from import QUICK, FixedGPT, train_losses

    settings = {
        **QUICK,
        **SMALL_TRAINER,
        "training/steps": 4,
        "training/checkpoint_interval": 2,
        "model/scan_layers": False,
    }
    FixedGPT.create(tmp_path, {**settings, "training/keep_checkpoints": 0}, name="straight").run()
    runs = tmp_path / "runs"
    shutil.copytree(runs / "straight", runs / "split")  # as if stopped right after the step-2 checkpoint
    shutil.rmtree(runs / "split" / "checkpoints" / "4")
    metrics = runs / "split" / "metrics.jsonl"
    kept = [line for line in metrics.read_text().splitlines() if json.loads(line).get("step", 0) <= 2]
    metrics.write_text("\n".join(kept) + "\n")
    FixedGPT.create(tmp_path, {**settings, "model/scan_layers": True}, name="split").run()
    straight, split = train_losses(tmp_path / "runs" / "straight"), train_losses(tmp_path / "runs" / "split")
    assert sorted(split) == [1, 2, 3, 4]
    for step in (3, 4):
        assert abs(split[step] - straight[step]) <= 1e-5, (step, split[step], straight[step])
