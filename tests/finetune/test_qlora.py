"""QLoRA (``model/quantize``): LoRA over a tiny Llama imported from a local Hugging Face folder whose
projection kernels are stored as NF4 / int8: the first loss, the base's bytes in the compiled train
step, loading from ``hf:`` and ``run:`` sources, a short fine-tune, both exports, and ``train/pretrain``
over the same quantized base (every trainer holds it out alike)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.finetune.conftest import TINY_SFT, prepare_chat
from tests.models.conftest import forward
from tests.reliability.conftest import call_cli
from theseus.config import configuration
from theseus.model.finetune import SFTTrainer
from theseus.model.layers import quantization
from theseus.model.loading.adapters import load_base
from theseus.training import frozen
from theseus.training.init_from import open_source

pytestmark = pytest.mark.slow

ALL_TARGETS = ["query", "key", "value", "out", "up", "gate", "down"]
SETTINGS = {
    **{k: v for k, v in TINY_SFT.items() if not k.startswith("architecture/")},
    "model/lora/targets": ALL_TARGETS,
    "training/init_from": "run:base",
}
#: The first loss of LoRA on an NF4 base against the same LoRA on a bfloat16 base, relative (measured:
#: 0.16%): NF4 moves each weight of these random (std 0.15) kernels by up to half a level step of its block.
FIRST_LOSS_TOLERANCE = 0.01
PROJECTIONS = ("query", "key", "value", "out", "up", "gate", "down")


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared chat data, a random tiny Llama saved by transformers in float32 (``hf-llama``) and in
    bfloat16 (``hf-llama-bf16``), and the float32 one imported as run ``base``."""
    import torch

    from tests.huggingface.conftest import save_model

    root = tmp_path_factory.mktemp("qlora")
    prepare_chat(root)
    folder = root / "hf-llama"
    model = save_model(folder, "llama", vocab_size=257, bos_token_id=256, max_position_embeddings=64, tokenizer=False)
    model.to(torch.bfloat16).save_pretrained(root / "hf-llama-bf16")
    assert call_cli(["run", "hf/import", "--root", str(root), f"hf/source={folder}", "run/name=base"]) == 0
    return root


def trainer(root: Path, name: str, **values: Any) -> SFTTrainer:
    made = SFTTrainer.create(root, {**SETTINGS, "run/name": name, **values})
    made.setup()
    return made


def first_loss(made: SFTTrainer) -> float:
    state = made.init_state()
    rng = np.random.default_rng(0)
    x = rng.integers(0, 257, size=(4, 64)).astype(np.int32)
    batch = {"x": x, "y": np.roll(x, -1, axis=1), "padding_mask": np.ones_like(x, dtype=bool)}
    forward = jax.jit(lambda s, b: SFTTrainer.forward(s, s.params, b, deterministic=True)[1])
    with configuration(made.context.config):
        return float(forward(state, batch))


def is_projection_kernel(path: tuple[str, ...]) -> bool:
    """A projection kernel of the base, float (``query``, ``up/kernel``) or quantized (``query_nf4/...``)."""
    for i, key in enumerate(path):
        name = key[: -len(f"_{quantization.method_of(key)}")] if quantization.method_of(key) else key
        if name in PROJECTIONS and (i == len(path) - 1 or quantization.method_of(key)):
            return True
        if name == "kernel" and i >= 1 and path[i - 1] in PROJECTIONS:
            return True
    return False


def base_bytes_per_device(made: SFTTrainer) -> tuple[int, int]:
    """Bytes one device holds of the projection kernels among the compiled train step's arguments, and
    the bytes of all its arguments."""
    from theseus.plan.build import held_bytes
    from theseus.training.state import with_shardings

    state = with_shardings(made.abstract_state, made.state_shardings)
    key = jax.ShapeDtypeStruct(made.dropout_key.shape, made.dropout_key.dtype, sharding=made.sharding.replicated)
    with configuration(made.context.config):
        compiled = made.train_step_fn().trace(state, made.abstract_train_batch(), key).lower().compile()
    shardings = compiled.input_shardings[0][0].params
    leaves = jax.tree_util.tree_flatten_with_path(made.abstract_state.params)[0]
    where = jax.tree.leaves(shardings)
    chosen = [
        (leaf, sharding)
        for (path, leaf), sharding in zip(leaves, where, strict=True)
        if is_projection_kernel(tuple(str(getattr(k, "key", k)) for k in path))
    ]
    held = held_bytes([leaf for leaf, _ in chosen], [sharding for _, sharding in chosen])
    return held, int(compiled.memory_analysis().argument_size_in_bytes)


@pytest.fixture(scope="module")
def bf16(root: Path) -> SFTTrainer:
    return trainer(root, "bf16", **{"model/param_dtype": "bfloat16"})


@pytest.fixture(scope="module")
def nf4(root: Path) -> SFTTrainer:
    return trainer(root, "nf4", **{"model/quantize": "nf4", "model/param_dtype": "bfloat16"})


def test_first_loss_on_an_nf4_base_is_near_the_bf16_base(bf16: SFTTrainer, nf4: SFTTrainer) -> None:
    reference, quantized = first_loss(bf16), first_loss(nf4)
    print(f"first loss nf4 {quantized:.4f} bf16 {reference:.4f}")
    assert abs(quantized - reference) <= FIRST_LOSS_TOLERANCE * reference, (quantized, reference)


def test_nf4_base_takes_under_a_third_of_bf16_in_the_compiled_step(bf16: SFTTrainer, nf4: SFTTrainer) -> None:
    nf4_base, nf4_args = base_bytes_per_device(nf4)
    bf16_base, bf16_args = base_bytes_per_device(bf16)
    # two layers: query and out 32x32, key and value 32x(2 kv heads x 8), up/gate/down 32x48; two bytes each
    assert bf16_base == 2 * 2 * (2 * 32 * 32 + 2 * 32 * 16 + 3 * 32 * 48)
    assert nf4_base / bf16_base <= 0.3, (nf4_base, bf16_base)
    print(f"base bytes per device nf4 {nf4_base} bf16 {bf16_base}; arguments nf4 {nf4_args} bf16 {bf16_args}")
    assert nf4_args < bf16_args


def test_hf_run_and_bf16_sources_quantize_as_they_load(root: Path, nf4: SFTTrainer) -> None:
    made = nf4
    abstract, shardings = made.abstract_state.params, made.state_shardings.params
    loaded = {}
    for spec in ("run:base", f"hf:{root / 'hf-llama'}", f"hf:{root / 'hf-llama-bf16'}"):
        with configuration(made.context.config):
            loaded[spec] = load_base(open_source(spec, root), made.model, abstract, shardings)
    codes = lambda tree: tree["blocks_0"]["mlp"]["up"]["kernel_nf4"]["codes"]  # noqa: E731
    assert codes(loaded["run:base"]).dtype == jnp.uint8
    np.testing.assert_array_equal(
        np.asarray(codes(loaded["run:base"])), np.asarray(codes(loaded[f"hf:{root / 'hf-llama'}"]))
    )
    same = np.mean(np.asarray(codes(loaded["run:base"])) == np.asarray(codes(loaded[f"hf:{root / 'hf-llama-bf16'}"])))
    assert same > 0.9  # bfloat16 rounding moves only values near a level boundary


def test_qlora_fine_tune_learns_and_its_adapter_loads_in_peft(root: Path, tmp_path: Path) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    values = {"model/quantize": "nf4", "training/steps": 6, "training/lr": 3e-2}
    made = trainer(root, "qlora", **values)
    made.run()
    rows = [json.loads(line) for line in (root / "runs" / "qlora" / "metrics.jsonl").read_text().splitlines()]
    losses = [row["loss"] for row in rows if row.get("split") == "train"]
    print("QLoRA losses", " ".join(f"{loss:.3f}" for loss in losses))
    assert np.mean(losses[-2:]) < losses[0] - 0.5, losses

    for job, out in (("hf/export-adapter", "adapter"), ("hf/export", "merged")):
        assert call_cli(["run", job, "--root", str(root), "hf/run=qlora", f"hf/out={tmp_path / out}"]) == 0
    x = np.random.default_rng(3).integers(0, 257, size=(2, 24)).astype(np.int32)
    ours = forward(made.model, made.state.params, x)
    with torch.no_grad():
        base = AutoModelForCausalLM.from_pretrained(root / "hf-llama", attn_implementation="eager")
        peft_model = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
        assert any("lora_A" in k for k in peft_model.state_dict())
        assert np.isfinite(peft_model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()).all()
        merged_model = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", attn_implementation="eager").eval()
        merged = merged_model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
    assert np.max(np.abs(merged - ours)) <= 1e-4  # the merged export is the dequantized base plus adapters
    # PEFT holds our trained adapters (lora_A = A.T, lora_B = B.T) on the float base
    state = {k: v.float().numpy() for k, v in peft_model.state_dict().items() if "lora_" in k}
    assert len(state) == 2 * 7 * 2  # two layers, seven projections, A and B
    query = made.state.params["blocks_0"]["attn"]
    found = lambda part: next(v for k, v in state.items() if f"layers.0.self_attn.q_proj.{part}" in k)  # noqa: E731
    np.testing.assert_allclose(found("lora_A"), np.asarray(query["query_lora_a"]).T, atol=1e-7)
    np.testing.assert_allclose(found("lora_B"), np.asarray(query["query_lora_b"]).reshape(4, -1).T, atol=1e-7)


def test_pretrain_trains_lora_over_an_nf4_base_read_from_hf_as_sft_does(root: Path) -> None:
    """``train/pretrain`` holds a quantized base out as the fine-tuning jobs do: over the chat data's packed
    rows and an NF4 base quantized as it is read from ``hf:``, it gives SFT's losses step for step and
    leaves every quantized kernel bit for bit as it was read."""
    from theseus.training.adapters import base_only
    from theseus.training.pretrain import Pretrain

    values = {
        **SETTINGS,
        "training/init_from": f"hf:{root / 'hf-llama'}",
        "model/quantize": "nf4",
        "training/steps": 3,
        "training/lr": 3e-2,
    }
    runs = {
        "pretrain": Pretrain.create(
            root,
            {
                **values,
                "run/name": "pretrain-nf4",
                "dataset": "chat:1:packed",
                "schedule": "constant",
                "evaluation": "",
            },
        ),
        "sft": SFTTrainer.create(root, {**values, "run/name": "sft-nf4"}),
    }
    losses = {}
    for name, made in runs.items():
        made.run()
        rows = (root / "runs" / made.run_name / "metrics.jsonl").read_text().splitlines()
        losses[name] = [row["loss"] for row in map(json.loads, rows) if row.get("split") == "train"]
    print("pretrain", losses["pretrain"], "sft", losses["sft"])
    assert len(losses["pretrain"]) == 3 and losses["pretrain"][-1] < losses["pretrain"][0]
    np.testing.assert_allclose(losses["pretrain"], losses["sft"], rtol=1e-6)

    made = runs["pretrain"]
    with configuration(made.context.config):
        read = made.load_base(
            made.init_source, base_only(made.abstract_state.params), base_only(made.state_shardings.params)
        )
    trained, _ = frozen.split(made.state.params)
    as_read, _ = frozen.split(read)
    assert jax.tree.leaves(trained) and jax.tree.structure(trained) == jax.tree.structure(as_read)
    for after, before in zip(jax.tree.leaves(trained), jax.tree.leaves(as_read), strict=True):
        assert after.dtype == before.dtype
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
