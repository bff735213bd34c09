"""A layer stack of several runs (DeepSeek-V3's leading dense layers, then its mixture layers) scanned
run by run: the same model as unrolled, checkpoints that load into either layout, and the same greedy
generation. (Hugging Face import into the scanned runs: tests/huggingface/test_deepseek_v3.py.)"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.models.conftest import build, forward, logits_loss_grads, random_params
from tests.models.test_layer_layouts import _abstract, _train_state
from tests.models.test_models import batch
from tests.tolerances import float32_tolerance, magnitude, model_ops
from theseus.base.axis import Axis
from theseus.checkpoint import CheckpointStore
from theseus.checkpoint.layers import LayerRun, layout_changes, per_layer, stacked
from theseus.errors import ConfigError
from theseus.model.models import DeepseekV3, TransformerLM
from theseus.model.models.llama4.model import Llama4
from theseus.model.models.qwen3_next.model import Qwen3Next
from theseus.model.stack.transformer import SCAN_FROM_LAYERS

#: Two dense layers, then two mixture layers.
RUNS = {"architecture__n_layers": 4, "architecture__moe__first_k_dense": 2}


def both(**values: Any) -> tuple[TransformerLM, TransformerLM]:
    """The same DeepSeek-V3, unrolled and scanned."""
    unrolled, scanned = (build(DeepseekV3, model__scan_layers=scan, **values) for scan in (False, True))
    return unrolled, scanned


def test_each_run_is_stacked_under_its_own_name_on_the_unsharded_layer_axis() -> None:
    unrolled, scanned = both(**RUNS)
    assert unrolled.stacked_layers == ()
    dense, mixture = LayerRun("dense_blocks", "blocks", 0, 2), LayerRun("blocks", "blocks", 2, 2)
    assert scanned.stacked_layers == (dense, mixture)
    shapes = jax.eval_shape(lambda: scanned.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])
    for run in ("dense_blocks", "blocks"):
        boxes = jax.tree.leaves(shapes[run], is_leaf=lambda x: isinstance(x, nn.Partitioned))
        assert {box.names[0] for box in boxes} == {Axis.LAYERS} and {box.value.shape[0] for box in boxes} == {2}
    assert "router" in shapes["blocks"]["mlp"] and "router" not in shapes["dense_blocks"]["mlp"]
    view = per_layer(nn.unbox(shapes), scanned.stacked_layers)
    assert sorted(k for k in view if k.startswith("blocks")) == [f"blocks_{i}" for i in range(4)]
    assert ["router" in view[f"blocks_{i}"]["mlp"] for i in range(4)] == [False, False, True, True]
    # one run keeps the one stack
    assert build(DeepseekV3, model__scan_layers=True, architecture__moe__first_k_dense=0).stacked_layers == ("blocks",)


def test_scanned_runs_give_the_same_logits_loss_and_gradients() -> None:
    unrolled, scanned = both(**RUNS)
    params = random_params(unrolled, std=0.1)
    x, y, mask = batch()
    logits_a, loss_a, grads_a = logits_loss_grads(unrolled, params, x, y, mask)
    logits_b, loss_b, grads_b = logits_loss_grads(scanned, stacked(params, scanned.stacked_layers), x, y, mask)
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=1e-5, rtol=0)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-5
    atol = float32_tolerance(3 * model_ops(unrolled), scale=magnitude(grads_a))  # forward and backward
    for a, b in zip(jax.tree.leaves(stacked(grads_a, scanned.stacked_layers)), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=atol, rtol=1e-5)


def test_greedy_generation_is_the_same_scanned_and_unrolled() -> None:
    """One dense layer (a run of one) then two mixture layers, with the KV cache: each token the scanned
    model decodes is the one the unrolled model's whole-sequence forward pass picks after the tokens before
    it, which is what the unrolled model decodes greedily (tests/generation/test_decode.py)."""
    from theseus.model.generation.decode import generate_tokens
    from theseus.model.generation.sampling import SamplingParams

    unrolled, scanned = both(architecture__n_layers=3, architecture__moe__first_k_dense=1)
    assert [run.length for run in scanned.layer_runs] == [1, 2]
    params = random_params(unrolled, seed=3, std=0.2)
    prompts, greedy = [[5, 9, 2, 7], [3, 1]], SamplingParams(temperature=0.0)
    got = generate_tokens(scanned, stacked(params, scanned.stacked_layers), prompts, 6, sampling=greedy)
    assert [len(c.tokens) for c in got] == [6, 6]
    assert_greedy_picks(lambda ids, mask: forward(unrolled, params, ids, mask), prompts, [c.tokens for c in got])


@pytest.mark.parametrize("saved_scanned", [False, True], ids=["per-layer-to-runs", "runs-to-per-layer"])
def test_a_checkpoint_loads_into_the_other_layout(tmp_path: Path, saved_scanned: bool) -> None:
    assert_checkpoint_loads_in_the_other_layout(tmp_path, *both(**RUNS), saved_scanned)


def assert_checkpoint_loads_in_the_other_layout(
    tmp_path: Path, unrolled: TransformerLM, scanned: TransformerLM, saved_scanned: bool
) -> None:
    """A train state saved in one model's layout restores into the other's, bit for bit, moments included."""
    per_layer_state = _train_state(unrolled, random_params(unrolled, seed=5))
    scanned_state = jax.tree.map(jnp.asarray, stacked(per_layer_state, scanned.stacked_layers))
    saved, wanted = (scanned_state, per_layer_state) if saved_scanned else (per_layer_state, scanned_state)
    store = CheckpointStore(tmp_path, keep=1, async_save=False)
    store.save(1, saved, {"step": 1})
    restored, _ = store.restore(1, _abstract(wanted))
    store.close()
    assert jax.tree.structure(restored) == jax.tree.structure(wanted)
    for got, expected in zip(jax.tree.leaves(restored), jax.tree.leaves(wanted), strict=True):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_layout_changes_find_the_runs_and_their_sizes() -> None:
    unrolled, scanned = both(**RUNS)
    runs = stacked(random_params(unrolled), scanned.stacked_layers)
    per_layer_paths = ["blocks_0/attn_norm/scale", "blocks_3/attn_norm/scale", "lm_head"]
    changes = layout_changes(per_layer_paths, runs)
    assert [(c.name, c.stacked_to_per_layer, c.first, c.count) for c in changes] == [
        ("dense_blocks", True, 0, 2),
        ("blocks", True, 2, 2),
    ]
    saved = {"dense_blocks/attn_norm/scale": (2, 32), "blocks/attn_norm/scale": (2, 32)}
    back = layout_changes(saved, per_layer(runs, scanned.stacked_layers))
    assert [(c.name, c.stacked_to_per_layer, c.first, c.count) for c in back] == [
        ("dense_blocks", False, 0, 2),
        ("blocks", False, 2, 2),
    ]
    with pytest.raises(ValueError, match="pass the saved shapes"):
        layout_changes(list(saved), per_layer(runs, scanned.stacked_layers))


def test_runs_that_cannot_be_told_apart_refuse_to_scan() -> None:
    """Dense and mixture layers that neither repeat nor form runs of distinct names would need two stacks
    of one name; alternating ones repeat a unit of two and scan."""

    class Scattered(DeepseekV3):
        def _layer_options(self, layer: int) -> dict[str, Any]:
            return {"dense": layer in (0, 3)}

    class Alternating(DeepseekV3):
        def _layer_options(self, layer: int) -> dict[str, Any]:
            return {"dense": layer % 2 == 0}

    with pytest.raises(ConfigError, match="set model/scan_layers=false"):
        _ = build(Scattered, model__scan_layers=True, **RUNS).stacked_layers
    assert build(Scattered, model__scan_layers=False, **RUNS).stacked_layers == ()
    assert not build(Scattered, **{**RUNS, "architecture__n_layers": 8}).scans_layers  # the default unrolls it
    assert build(Alternating, model__scan_layers=True, **RUNS).stacked_layers == (
        LayerRun("blocks", "blocks", 0, 4, 2),
    )


#: Units whose positions differ in shape, ``(family, layers, unit, keys)``: Qwen3-Next's Gated DeltaNet and
#: full-attention layers as a unit of two (every second layer full, where its preset has every fourth: the
#: same mechanism at half the layers to trace; 4 layers: two whole units, the scan's state carried from one
#: to the next), and Llama 4's dense and mixture layers interleaved under its chunked RoPE and NoPE layers,
#: every second layer NoPE (where its preset has every fourth): a unit of two, a dense RoPE layer then a
#: NoPE mixture layer (5 layers: two whole units, then one layer left over; the unit of four took 9 layers).
#: Positions that differ in their attention alone (every layer a mixture, a unit of a RoPE and a NoPE layer)
#: scan against transformers' logits in tests/huggingface/test_import_parity.py.
UNITS: dict[str, tuple[type[TransformerLM], int, int, dict[str, Any]]] = {
    "qwen3-next": (Qwen3Next, 4, 2, {"architecture__full_attention_interval": 2}),
    "llama4": (Llama4, 5, 2, {"architecture__no_rope_layers": (1, 0, 1, 0, 1)}),
}


def unit_models(case: str, **scanned: Any) -> tuple[TransformerLM, TransformerLM]:
    """The same model of ``case``, unrolled and scanned (with the keys ``scanned``)."""
    cls, n_layers, _, keys = UNITS[case]
    unrolled = build(cls, model__scan_layers=False, architecture__n_layers=n_layers, **keys)
    return unrolled, build(cls, model__scan_layers=True, architecture__n_layers=n_layers, **keys, **scanned)


@pytest.mark.parametrize("case", list(UNITS))
def test_a_unit_of_layers_that_differ_in_shape_is_held_per_position(case: str) -> None:
    cls, n_layers, unit, _ = UNITS[case]
    unrolled, scanned = unit_models(case)
    assert scanned.scan_period == unit
    assert scanned.stacked_layers == (LayerRun("blocks", "blocks", 0, n_layers, unit),)
    assert build(cls, architecture__n_layers=SCAN_FROM_LAYERS).scans_layers  # the preset's unit: scanned by default
    shapes = jax.eval_shape(lambda: scanned.init(jax.random.key(0), jnp.zeros((1, 2), jnp.int32))["params"])
    blocks = shapes["blocks"]
    assert sorted(blocks) == ["periods", *(f"rest_{j}" for j in range(n_layers % unit))]
    for i in range(unit):
        boxes = jax.tree.leaves(blocks["periods"][f"layers_{i}"], is_leaf=lambda x: isinstance(x, nn.Partitioned))
        assert {box.names[0] for box in boxes} == {Axis.LAYERS}
        assert {box.value.shape[0] for box in boxes} == {n_layers // unit}
    params = random_params(unrolled)
    runs = stacked(params, scanned.stacked_layers)
    assert jax.tree.structure(runs) == jax.tree.structure(nn.unbox(shapes))
    assert jax.tree.map(np.shape, runs) == jax.tree.map(np.shape, nn.unbox(shapes))
    back = per_layer(runs, ("blocks",))  # the unit read from the names alone
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@functools.cache
def scanned_unit(case: str, remat: str = "none", unroll: int = 1) -> TransformerLM:
    """The scanned model of ``case`` (one object per setting, so that its compiled programs are kept)."""
    return unit_models(case, model__remat=remat, model__scan_unroll=unroll)[1]


@functools.cache
def unrolled_reference(case: str) -> tuple[Any, tuple[Any, Any, Any]]:
    """The unrolled model of ``case``: its parameters and their logits, loss and gradients on ``batch()``
    (computed once for the scanned variants compared with it)."""
    unrolled, _ = unit_models(case)
    params = random_params(unrolled, std=0.1)
    return params, logits_loss_grads(unrolled, params, *batch())


@pytest.mark.parametrize(
    ("case", "remat", "unroll"), [("qwen3-next", "none", 1), ("llama4", "none", 1), ("llama4", "full", 5)]
)
def test_a_scanned_unit_of_layers_that_differ_in_shape_gives_the_same_logits_and_gradients(
    case: str, remat: str, unroll: int
) -> None:
    """Also two units per loop iteration, and recomputed in the backward pass (on Llama 4's unit: what
    the unrolled loop carries from one unit to the next is the residual stream, whatever the family)."""
    scanned = scanned_unit(case, remat, unroll)
    params, (logits_a, loss_a, grads_a) = unrolled_reference(case)
    logits_b, loss_b, grads_b = logits_loss_grads(scanned, stacked(params, scanned.stacked_layers), *batch())
    np.testing.assert_allclose(np.asarray(logits_a), np.asarray(logits_b), atol=1e-5, rtol=0)
    assert abs(float(loss_a) - float(loss_b)) <= 1e-5
    for a, b in zip(jax.tree.leaves(stacked(grads_a, scanned.stacked_layers)), jax.tree.leaves(grads_b), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("saved_scanned", [False, True], ids=["per-layer-to-unit", "unit-to-per-layer"])
def test_a_checkpoint_loads_into_the_other_layout_of_a_unit(tmp_path: Path, saved_scanned: bool) -> None:
    assert_checkpoint_loads_in_the_other_layout(tmp_path, *unit_models("llama4"), saved_scanned)


@pytest.mark.parametrize("case", list(UNITS))
def test_greedy_generation_is_the_same_with_a_scanned_unit(case: str) -> None:
    """The KV caches and Gated DeltaNet states held per position of the unit: each token the scanned
    model decodes from them is the one its whole-sequence forward pass picks after the tokens before it
    (the forward pass that gives the unrolled model's logits, above), as greedy decoding without a
    cache would pick it."""
    from theseus.model.generation.decode import generate_tokens
    from theseus.model.generation.sampling import SamplingParams

    scanned = scanned_unit(case)
    params = stacked(random_params(unit_models(case)[0], seed=3, std=0.2), scanned.stacked_layers)
    prompts = [[5, 9, 2, 7], [3, 1]]
    got = [c.tokens for c in generate_tokens(scanned, params, prompts, 6, sampling=SamplingParams(temperature=0.0))]
    assert [len(tokens) for tokens in got] == [6, 6]

    def logits(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The forward pass of the scanned model's loss and gradients above, at ``batch()``'s shape."""
        x, y, padding = batch()  # its rows past the prompts' are left as they are
        rows, width = ids.shape
        x[:rows], padding[:rows] = 0, False
        x[:rows, :width], padding[:rows, :width] = ids, mask
        whole, _, _ = logits_loss_grads(scanned, params, x, y, padding)
        return np.asarray(whole)[:rows, :width]

    assert_greedy_picks(logits, prompts, got)


def assert_greedy_picks(
    logits: Callable[[np.ndarray, np.ndarray], np.ndarray], prompts: list[list[int]], got: list[list[int]]
) -> None:
    """Each of the tokens ``got`` after each prompt is the one a whole-sequence forward pass (``logits`` of
    the ids and their mask) picks after the tokens before it (greedy decoding without a cache), and they
    are not all alike."""
    width = max(len(prompt) + len(tokens) for prompt, tokens in zip(prompts, got, strict=True))
    ids, mask = np.zeros((len(prompts), width), np.int32), np.zeros((len(prompts), width), bool)
    for i, (prompt, tokens) in enumerate(zip(prompts, got, strict=True)):  # right-padded: after every position read
        ids[i, : len(prompt) + len(tokens)], mask[i, : len(prompt) + len(tokens)] = prompt + tokens, True
    picks = logits(ids, mask).argmax(-1)
    for i, (prompt, tokens) in enumerate(zip(prompts, got, strict=True)):
        assert picks[i, len(prompt) - 1 : len(prompt) + len(tokens) - 1].tolist() == tokens
    assert len({t for tokens in got for t in tokens}) > 2  # a non-trivial continuation
