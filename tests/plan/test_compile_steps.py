"""Beyond pretraining: the SFT and DPO steps and generation compile for 8 x H100; what each fix of the
accelerator compile changed is checked in the compiled program; single TPU chips compile too (TPU slices:
the dense and mixture matrices compile some of their families for one)."""

from __future__ import annotations

import re

import pytest

from tests.plan.conftest import WATCHED, compile_cases, tiny

pytestmark = WATCHED

#: The small preset at 512 tokens, its six layers scanned (one layer's body to compile instead of six).
LONG = (
    "architecture/block_size=512",
    "training/sequence_length=512",
    "training/batch_size=8",
    "model/scan_layers=true",
)
#: One chip, as on Colab or Kaggle: its device kind and the bytes a program may use on it. A v5e chip's
#: (16.91 GB) compiles in docs/accelerators.md's one-chip flow and refuses "one chip too large" below.
ONE_CHIP = {"v6e:1": ("TPU v6 lite", 33_550_237_696)}


@pytest.fixture(scope="module")
def h100() -> dict[str, dict]:
    # one case of each step: every model runs the same SFT, DPO and sampling code (the dense matrices
    # compile every family's training step); last, the single chips' cases, in the same process
    named = {
        "llama sft": tiny("llama", "fsdp+tp", job="train/sft"),
        "llama dpo": tiny("llama", "fsdp", "model/lora/rank=4", job="train/dpo"),
        "llama generate": {**tiny("llama", "fsdp+tp"), "generate": {"batch": 8, "prompt": 16, "new": 4}},
        "remat none": {
            "job": "train/pretrain",
            "overrides": ["model=llama", "architecture/preset=small", *LONG, "model/remat=none"],
        },
        "remat dots": {
            "job": "train/pretrain",
            "overrides": ["model=llama", "architecture/preset=small", *LONG, "model/remat=dots"],
        },
        "remat full": {
            "job": "train/pretrain",
            "overrides": ["model=llama", "architecture/preset=small", *LONG, "model/remat=full"],
        },
        "fp8": {
            "job": "train/pretrain",
            "overrides": ["model=llama", "architecture/preset=small", *LONG, "training/precision=fp8"],
        },
        "fp8 mixtral": tiny("mixtral", "fsdp", "training/precision=fp8"),
        **{
            f"qlora {base}": {
                **tiny(
                    "llama",
                    "dp",
                    "model/lora/rank=4",
                    "model/lora/targets=[query,key,value,out,up,gate,down]",
                    *keys,
                    job="train/sft",
                ),
                "held": True,
            }
            for base, keys in (
                ("bf16", ["model/param_dtype=bfloat16"]),
                # computing in float32 changes nothing the step holds: the float32 case of
                # test_activation_dtype_follows_the_mesh_and_can_be_set, without a compile of its own
                ("nf4", ["model/quantize=nf4", "model/activation_dtype=float32"]),
            )
        },
        **{f"one chip {target}": {**tiny("llama", "dp"), "target": target} for target in ONE_CHIP},
        # two layers: the case whose message docs/errors.md shows. model/remat=auto would compile none and
        # dots first, each refused the same way, and raise the refusal of full, whose line is the one below
        # (test_remat_ladder.py checks that order with stand-in compiles): full alone is compiled here
        "one chip too large": {
            **tiny("llama", "dp", "training/batch_size=65536", "architecture/n_layers=2", "model/remat=full"),
            "target": "v5e:1",
        },
    }
    return dict(zip(named, compile_cases("h100x8", list(named.values())), strict=True))


def _plan(result: dict) -> dict:
    assert "plan" in result, result.get("error")
    return result["plan"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama sft", "llama dpo"])
def test_fine_tuning_steps_compile_for_h100(h100: dict, name: str) -> None:
    plan = _plan(h100[name])
    assert plan["activation_dtype"] == "bfloat16"
    assert "__cudnn$fmhaSoftmaxBackward" in plan["custom_calls"]
    assert plan["memory"]["aliased"] >= plan["state_bytes"]
    assert 0.9 <= plan["flops"]["ratio"] <= (2.2 if "dpo" in name else 1.15)  # DPO runs the reference too


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama generate"])
def test_generation_compiles_for_h100(h100: dict, name: str) -> None:
    result = h100[name]
    assert "generate" in result, result.get("error")
    assert result["generate"]["flops"] > 0


@pytest.mark.slow
def test_padding_reaches_cudnn_as_lengths_not_a_dense_bias(h100: dict) -> None:
    """The flywheel's padding mask used to become a [B, 1, T, T] bias operand of the fused kernel."""
    plan = _plan(h100["remat none"])
    assert plan["attention_operands"], "no cuDNN attention in the program"
    for operands in plan["attention_operands"]:
        squares = [shape for shape in operands if len(shape) == 4 and shape[-1] == shape[-2] == 512]
        assert not squares, operands


@pytest.mark.slow
def test_activation_dtype_follows_the_mesh_and_can_be_set(h100: dict) -> None:
    """model/activation_dtype=float32 on H100 (the NF4 QLoRA step's), where the mesh's default is bfloat16."""
    plan = _plan(h100["qlora nf4"])
    assert plan["activation_dtype"] == "float32"
    assert "__cudnn$fmhaSoftmax" not in plan["custom_calls"]  # cuDNN is half precision only
    assert _plan(h100["qlora bf16"])["activation_dtype"] == "bfloat16"


@pytest.mark.slow
def test_remat_policies_trade_temporaries_for_flops(h100: dict) -> None:
    none, dots, full = (_plan(h100[f"remat {p}"]) for p in ("none", "dots", "full"))
    assert full["memory"]["temporaries"] < dots["memory"]["temporaries"] < none["memory"]["temporaries"]
    assert none["flops"]["ratio"] < dots["flops"]["ratio"] <= full["flops"]["ratio"]
    assert full["flops"]["ratio"] == pytest.approx(none["flops"]["ratio"] * 4 / 3, rel=0.1)  # forward again


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(ONE_CHIP))
def test_one_chip_compiles_against_the_memory_a_program_may_use(h100: dict, target: str) -> None:
    plan = _plan(h100[f"one chip {target}"])
    kind, usable = ONE_CHIP[target]
    assert (plan["devices"], plan["device"], plan["memory"]["device"]) == (1, kind, usable)
    assert plan["memory"]["fits"] and plan["collectives"] == {}


@pytest.mark.slow
def test_a_step_larger_than_the_chip_is_one_line_naming_what_to_lower(h100: dict) -> None:
    """XLA's TPU compiler refuses a program larger than the chip even with every layer recomputed (full, the
    last policy model/remat=auto tries); the plan says what it needed and what else needs less without
    changing the model."""
    error = h100["one chip too large"].get("error", "")
    found = re.fullmatch(
        r"StepTooLarge: the training step of 65536 x 64 tokens does not fit in the device's memory \(the "
        r"compiler needs ([\d,.]+) GB of 16\.91 GB\); use less memory per step with training/batch_size=32768, "
        r"training/micro_batch_size=32768 \(the same batch in 2 passes\), "
        r"optimizer/state_dtype=bfloat16, optimizer/offload=true or training/sequence_length=32",
        error,
    )
    assert found and float(found.group(1).replace(",", "")) > 16.91, error


@pytest.mark.slow
def test_fp8_training_runs_its_projections_as_fp8_gemms(h100: dict) -> None:
    """training/precision=fp8: the projections' GEMMs take e4m3 operands forward and e5m2 gradients
    backward (XLA:GPU compiles them as Triton GEMM fusions on FP8 inputs), the same matmuls as the model
    in bf16 ("remat none") does; the estimate counts them at the FP8 peak (benchmarks/fp8_estimates.py)."""
    fp8, bf16 = _plan(h100["fp8"]), _plan(h100["remat none"])
    shares = fp8["flops"]["by_input_type"]
    total = sum(shares.values())
    assert shares["f8e4m3fn"] / total > 0.45 and shares["f8e5m2"] / total > 0.2, shares
    assert set(bf16["flops"]["by_input_type"]).isdisjoint({"f8e4m3fn", "f8e5m2"})
    assert fp8["flops"]["compiled"] == pytest.approx(bf16["flops"]["compiled"], rel=0.02)  # the same matmuls
    assert "__cudnn$fmhaSoftmaxBackward" in fp8["custom_calls"]  # attention keeps bf16 and cuDNN
    mixture = _plan(h100["fp8 mixtral"])["flops"]["by_input_type"]
    assert mixture.get("f8e4m3fn", 0) / sum(mixture.values()) > 0.3, mixture  # the expert kernels too


@pytest.mark.slow
def test_qlora_holds_its_base_in_under_a_third_of_bf16(h100: dict) -> None:
    """model/quantize=nf4: the frozen projection kernels of the compiled H100 step take at most 0.3 of
    their bf16 bytes (4.13 bits per weight with double-quantized block maxima); adapters and their
    optimizer state are the same."""
    bf16, nf4 = (_plan(h100[f"qlora {base}"])["held"] for base in ("bf16", "nf4"))
    assert nf4["base"] <= 0.3 * bf16["base"], (nf4, bf16)
    assert nf4["adapters"] == 2 * bf16["adapters"]  # float32 adapters beside a bf16 model's bf16 ones
    assert nf4["optimizer"] == pytest.approx(2 * bf16["optimizer"], rel=1e-3)  # (step counters aside)
