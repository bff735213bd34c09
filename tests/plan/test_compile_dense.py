"""Every dense family, at a small size, compiles its training step (forward, backward, AdamW update) for
8 x H100 or a v5e:2x4 TPU slice, sharded over data and model (their replicated state measured without a
compile): what a user's first hour on GPUs or TPUs would otherwise find out."""

from __future__ import annotations

import pytest

from tests.plan.conftest import DEVICES, WATCHED, Family, compile_layouts

pytestmark = WATCHED

#: The TPU slice of the families compiled for a TPU: each family compiles for one target, and each kind of
#: layer (Llama's, Gemma's sliding and full layers, Qwen3.5's Gated DeltaNet) for both.
TPU = "v5e:2x4"
#: Gemma 3's and 4's tiny presets have one key/value head; tensor parallelism needs two.
TWO_KV_HEADS = ("architecture/n_kv_heads=2",)
#: Each family compiles in fsdp+tp, which applies both the fsdp and the tp rules to each of its parameters
#: (the layouts' rules are shared; the families' parameters are not), and reports its replicated (dp) state
#: without compiling it, the reference fsdp+tp divides. GPT, the reference, has its state measured under
#: fsdp and tp alone too (fsdp+tp compiles both rules; fsdp and dp alone compile in test_compile_steps.py's
#: cases), two layers deep: what fsdp leaves whole (norms, biases) is within 5 % of its state at two layers,
#: not at one. SmolLM3 (Llama's layers) and Gemma 4 (Gemma 3's) compile for the TPU slice: splash
#: attention with RoPE and NoPE layers, and with sliding and full layers of two head widths.
FAMILIES = {
    "gpt": Family(("fsdp+tp",), measures=("dp", "fsdp", "tp"), extra=("architecture/n_layers=2",)),
    "llama": Family(("fsdp+tp",)),
    "qwen3": Family(("fsdp+tp",)),
    "olmo2": Family(("fsdp+tp",)),
    "phi3": Family(("fsdp+tp",)),
    "gemma2": Family(("fsdp+tp",)),
    "gemma3": Family(("fsdp+tp",), extra=TWO_KV_HEADS),
    "qwen3_5": Family(("fsdp+tp",)),
    "smollm3": Family(("fsdp+tp",), target=TPU),
    "gemma4": Family(("fsdp+tp",), target=TPU, extra=TWO_KV_HEADS),
}
#: Gemma 2 soft-caps its attention scores, which cuDNN's fused kernel does not do: XLA attention.
WITHOUT_CUDNN = {"gemma2"}


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str], dict]:
    return compile_layouts(FAMILIES)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_family_compiles_in_its_layouts(matrix: dict, family: str) -> None:
    check_family(matrix, family)


def check_family(matrix: dict, family: str) -> None:
    """What every dense family's compiled steps must show, layout by layout."""
    spec = FAMILIES[family]
    held = {layout: matrix[(family, layout)]["plan"]["state_bytes"] for layout in spec.measured}
    for layout in spec.compiles:
        result = matrix[(family, layout)]
        assert "plan" in result, (layout, result.get("error"))
        plan = result["plan"]
        # what the accelerator runs: bf16 activations, its fused attention where it supports the case
        assert (plan["device"], plan["activation_dtype"]) == (DEVICES[spec.target], "bfloat16")
        if spec.target == TPU:
            # splash attention forward and its fused backward (one kernel forms dq, dk and dv, recomputing
            # the scores: 7 attention matmuls where the model counts 6), which these small models, their
            # attention a large share of the work, show in the ratio
            assert plan["splash"] == ["dkv", "fwd"], plan["custom_calls"]
            most = 1.25
        else:
            cudnn = plan["custom_calls"]
            fused = "__cudnn$fmhaSoftmax" in cudnn and "__cudnn$fmhaSoftmaxBackward" in cudnn
            assert fused == (family not in WITHOUT_CUDNN), cudnn
            most = 1.15
        # no redundant matmul work, and the whole state (donated) is reused by the outputs
        assert 0.9 <= plan["flops"]["ratio"] <= most, plan["flops"]
        assert plan["memory"]["aliased"] >= plan["state_bytes"]
        assert plan["memory"]["fits"]
        held[layout] = plan["state_bytes"]
    # fsdp holds an eighth of dp's state, tp (over 2) about half, fsdp+tp (data 4 x model 2) an eighth
    if "fsdp" in held:
        assert held["fsdp"] == pytest.approx(held["dp"] / 8, rel=0.05)
    if "tp" in held:
        assert held["tp"] < 0.65 * held["dp"]
    assert held["fsdp+tp"] == pytest.approx(held["dp"] / 8, rel=0.1)
