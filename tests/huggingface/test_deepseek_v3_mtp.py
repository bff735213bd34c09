"""DeepSeek-V3's multi-token prediction (``architecture/mtp_depth``): a checkpoint holding an MTP module
imports (main logits as transformers', every MTP tensor in its parameter) and exports it back tensor for
tensor; the sown MTP cross-entropy equals the module applied by hand on shifted inputs and targets, with
padded and ignored positions left out; a trainer logs ``mtp_loss`` and the MTP parameters train."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.huggingface.conftest import hf_logits, imported_logits, read_json
from tests.huggingface.test_deepseek_v3 import save_deepseek
from tests.huggingface.test_moe_families import VOCAB
from tests.models.conftest import jitted, random_params
from theseus.base.sown import AUX_COLLECTIONS, AUX_LOSSES, AUX_METRICS

LAST = "model.layers.1."  # the mixture layer after the dense one
MTP = "model.layers.2."  # module 1 of a 2-layer model


def add_mtp_module(folder: Path) -> dict[str, np.ndarray]:
    """Random tensors of one MTP module written into ``folder``'s checkpoint (its mixture layer shaped as
    the last layer's), with the copies of the embedding and the head; returns every tensor."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    rng = np.random.default_rng(3)
    e = tensors["model.embed_tokens.weight"].shape[1]
    for name, value in list(tensors.items()):
        if name.startswith(LAST):
            scale = 1.0 if name.endswith("norm.weight") else 0.2
            noise = scale * rng.standard_normal(value.shape).astype(np.float32)
            tensors[MTP + name.removeprefix(LAST)] = (1.0 if scale == 1.0 else 0.0) + noise
    for name in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{MTP}{name}.weight"] = 1.0 + 0.2 * rng.standard_normal(e).astype(np.float32)
    tensors[MTP + "eh_proj.weight"] = 0.2 * rng.standard_normal((e, 2 * e)).astype(np.float32)
    tensors[MTP + "embed_tokens.weight"] = tensors["model.embed_tokens.weight"]
    tensors[MTP + "shared_head.head.weight"] = tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return tensors


@pytest.fixture(scope="module")
def with_mtp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("mtp")
    model = save_deepseek(folder, "query_lora", num_hidden_layers=2)  # a dense layer, then a mixture
    assert model.config.num_nextn_predict_layers == 1  # transformers' default, written to config.json
    return folder, model, add_mtp_module(folder)


def test_import_export_round_trip_every_mtp_tensor(
    with_mtp: tuple[Path, Any, dict[str, np.ndarray]], tmp_path: Path, theseus: Any
) -> None:
    from safetensors.numpy import load_file
    from transformers import AutoModelForCausalLM

    from theseus.model.huggingface.importer import flat_paths, read_params

    folder, model, tensors = with_mtp
    ids = np.random.default_rng(1).integers(0, VOCAB, (2, 12))
    mask = np.ones_like(ids, dtype=bool)
    mask[0, :4] = False
    got, prepared = imported_logits(folder, ids, mask)
    error = float(np.max(np.abs(got - hf_logits(model, ids, mask))[mask]))
    assert error <= 1e-4, error
    assert prepared.model.architecture.mtp_depth == 1
    params = flat_paths(read_params(prepared))
    mtp = {m.hf: m for m in prepared.maps if m.hf.startswith(MTP)}
    assert len(mtp) == sum(n.startswith(MTP) for n in tensors) - 2  # the two copies are not read again
    for name, tensor_map in mtp.items():
        leaves = [np.asarray(params[path]) for path in tensor_map.paths]
        if tensor_map.index is not None:  # one expert of a stacked parameter
            leaves = [leaf[tensor_map.index] for leaf in leaves]
        assert tensor_map.paths[0][0] == "mtp_0"
        np.testing.assert_array_equal(tensor_map.to_hf(leaves), tensors[name], err_msg=name)
    np.testing.assert_array_equal(np.asarray(params[("mtp_0", "eh_proj")]), tensors[MTP + "eh_proj.weight"].T)

    code, _, err = theseus("run", "hf/import", f"hf/source={folder}", "run/name=imported")
    assert code == 0, err
    out = tmp_path / "export"
    code, _, err = theseus("run", "hf/export", "hf/run=imported", f"hf/out={out}")
    assert code == 0, err
    assert read_json(out / "config.json")["num_nextn_predict_layers"] == 1
    exported = load_file(out / "model.safetensors")
    assert sorted(exported) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(exported[name], value, err_msg=name)
    reloaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    assert all(k.startswith(MTP) for k in info["unexpected_keys"]), info  # transformers has no MTP module
    x = np.random.default_rng(0).integers(0, VOCAB, (2, 9))
    assert np.max(np.abs(hf_logits(reloaded.eval(), x) - hf_logits(model, x))) <= 1e-5
    again, _ = imported_logits(out, ids, mask)
    assert float(np.max(np.abs(again - got)[mask])) <= 1e-6


def tiny(**keys: Any) -> Any:
    from tests.models.test_moe import model_of
    from theseus.model.models import DeepseekV3

    base = {
        "architecture/n_layers": 2,
        "architecture/block_size": 16,
        "architecture/vocab_size": 61,
        "model/activation_dtype": "float32",
    }
    return model_of(DeepseekV3, **{**base, **keys})


def test_the_sown_mtp_loss_is_the_module_applied_by_hand_on_shifted_tokens() -> None:
    """Module 1 at position i reads [enorm(emb(x[i+1])); hnorm(h[i])] and predicts y[i+1]; a position
    counts where that target is not -1 and positions i and i+1 are real."""
    model = tiny(**{"architecture/mtp_depth": 1, "model/mtp_weight": 0.5})
    rng = np.random.default_rng(0)
    x = rng.integers(0, 61, (2, 10))
    y = np.concatenate([x[:, 1:], rng.integers(0, 61, (2, 1))], axis=1)
    y[0, 3] = -1  # an ignored target: position 2 of the module does not count
    mask = np.ones_like(x, dtype=bool)
    mask[1, 7:] = False  # a right-padded row: positions 6.. of the module do not count
    variables = {"params": random_params(model, std=0.1)}  # drawn with numpy: no initialiser compiled

    @jax.jit
    def sown(targets: jax.Array) -> tuple[Any, Any]:
        (_, loss), out = model.apply(
            variables, jnp.asarray(x), targets, jnp.asarray(mask), True, mutable=list(AUX_COLLECTIONS)
        )
        return loss, out

    _, out = sown(jnp.asarray(y))
    got = float(out[AUX_METRICS]["mtp_loss"])
    assert float(out[AUX_LOSSES]["mtp"]) == pytest.approx(0.5 * got, rel=1e-6)

    def by_hand(m: Any) -> Any:
        h, _, positions = m.hidden(jnp.asarray(x), jnp.asarray(mask), True, False)
        nxt = np.concatenate([x[:, 1:], np.zeros((2, 1), x.dtype)], axis=1)
        emb = m.token_embedding(jnp.asarray(nxt))
        module = m.mtp[0]
        joined = jnp.concatenate([module.enorm(emb), module.hnorm(h)], axis=-1) @ module.eh_proj
        out = module.block(joined, jnp.asarray(mask), positions, True, False)
        return m.head(module.head_norm(out))[..., :61]

    logits = np.asarray(jax.jit(lambda v: model.apply(v, method=by_hand))(variables), np.float64)
    logp = logits - np.log(np.sum(np.exp(logits - logits.max(-1, keepdims=True)), -1, keepdims=True))
    logp -= logits.max(-1, keepdims=True)
    terms = []
    for b in range(2):
        for i in range(9):
            if y[b, i + 1] != -1 and mask[b, i] and mask[b, i + 1]:
                terms.append(-logp[b, i, y[b, i + 1]])
    assert len(terms) == 9 + 6 - 1
    assert got == pytest.approx(float(np.mean(terms)), abs=1e-5)
    changed = y.copy()
    changed[1, 7:] = (y[1, 7:] + 5) % 61  # targets of padded positions
    changed[0, 3] = -1
    changed[:, 0] = (y[:, 0] + 7) % 61  # the main model's first target: no module predicts it
    assert float(sown(jnp.asarray(changed))[1][AUX_METRICS]["mtp_loss"]) == pytest.approx(got, abs=1e-7)

    grads = jax.jit(jax.grad(lambda p: sown_total(model, p, x, y, mask)))(variables["params"])
    for path, leaf in jax.tree_util.tree_flatten_with_path(grads["mtp_0"])[0]:
        if "router_bias" not in jax.tree_util.keystr(path):  # moved by its balancing update, not trained
            assert float(jnp.max(jnp.abs(leaf))) > 0, jax.tree_util.keystr(path)


def sown_total(model: Any, params: Any, x: np.ndarray, y: np.ndarray, mask: np.ndarray) -> Any:
    (_, loss), out = model.apply(
        {"params": params}, jnp.asarray(x), jnp.asarray(y), jnp.asarray(mask), True, mutable=[AUX_LOSSES]
    )
    return loss + out[AUX_LOSSES]["mtp"]


def test_depth_zero_is_the_model_without_mtp_and_decoding_skips_it() -> None:
    from theseus.model.models import init_cache

    x = jnp.asarray(np.random.default_rng(1).integers(0, 61, (2, 8)))
    y = jnp.roll(x, -1, axis=1)
    plain, deep = tiny(), tiny(**{"architecture/mtp_depth": 2})
    # both initialisations in one program (XLA shares their common part: 40 % less to compile than two)
    params, deep_params = (
        v["params"] for v in jitted(lambda key, x: (plain.init(key, x), deep.init(key, x)), jax.random.key(0), x)
    )
    assert set(deep_params) == {*params, "mtp_0", "mtp_1"}
    assert jax.tree.all(jax.tree.map(np.array_equal, params, {k: deep_params[k] for k in params}))
    sown_collections = tuple(AUX_COLLECTIONS)
    (_, loss), sown = jitted(plain.apply, {"params": params}, x, y, deterministic=True, mutable=sown_collections)
    (_, deep_loss), deep_sown = jitted(
        deep.apply, {"params": deep_params}, x, y, deterministic=True, mutable=sown_collections
    )
    assert float(loss) == float(deep_loss)  # the main loss is the main model's
    assert "mtp" not in sown[AUX_LOSSES] and "mtp_loss" not in sown[AUX_METRICS]
    assert "mtp" in deep_sown[AUX_LOSSES] and deep.flops(8) > plain.flops(8)
    # what is sown without targets: its structure, traced (nothing to compute)
    _, no_targets = jax.eval_shape(
        lambda p: deep.apply({"params": p}, x, deterministic=True, mutable=sown_collections), deep_params
    )
    assert "mtp" not in no_targets[AUX_LOSSES]
    assert not any(k.startswith("mtp") for k in init_cache(deep, 2, 8))


def test_training_logs_a_falling_mtp_loss(tmp_path: Path) -> None:
    """Also what any DeepSeek-V3 training run does (tests/huggingface/test_deepseek_v3.py trains none of
    its own): every step's loss finite, and the routers' balancing biases moved by their updates. Two
    layers: the tiny preset's dense layer and one of its mixture layers."""
    from tests.training.conftest import write_byte_corpus
    from theseus.runs.params import restore_params
    from theseus.training.pretrain import Pretrain

    write_byte_corpus(tmp_path, "fineweb", documents=16)
    args = [
        "model=deepseek_v3",
        "architecture/mtp_depth=1",
        "architecture/n_layers=2",
        "architecture/block_size=32",
        "training/batch_size=4",
        "training/steps=8",
        "training/lr=3e-3",
        "training/log_interval=1",
        "training/eval_batches=0",
        "training/checkpoint_interval=8",
        "training/async_checkpoints=false",
        "training/progress=false",
        "training/compilation_cache=false",
        "training/peak_flops=1e12",
        "evaluation=",
        "run/name=mtp",
    ]
    job = Pretrain.create(tmp_path, args)
    job.run()
    lines = (tmp_path / "runs" / "mtp" / "metrics.jsonl").read_text().splitlines()
    train = [r for r in map(json.loads, lines) if r.get("split") == "train"]
    assert [r["step"] for r in train] == list(range(1, 9)) and all(np.isfinite(r["loss"]) for r in train)
    mtp = [r["mtp_loss"] for r in train]
    assert len(mtp) == 8 and all(np.isfinite(mtp))
    assert np.mean(mtp[-2:]) < mtp[0] - 0.3, mtp
    checkpoint = tmp_path / "runs" / "mtp" / "checkpoints" / "8" / "state"
    params = restore_params(checkpoint, job.abstract_state.params, what="step 8", fix="rerun the test")
    assert np.any(np.asarray(params["blocks_1"]["mlp"]["router_bias"]) != 0)
