"""Every dense family, at a small size, compiles its training step (forward, backward, AdamW update) for
8 x H100: GPT replicated and in each sharded layout, the others sharded over data and model (their
replicated state measured without a compile): what a user's first hour on GPUs would otherwise find out."""

from __future__ import annotations

import pytest

from tests.plan.conftest import compile_layouts

#: The dense families of this module; test_compile_dense_gemma.py compiles the others (two modules run
#: in parallel).
FAMILIES = ("gpt", "llama", "qwen3", "olmo2")
LAYOUTS = ("dp", "fsdp", "tp", "fsdp+tp")
#: GPT compiles in every layout; the other families in fsdp+tp, which applies both the fsdp and the tp
#: rules to each of their parameters (the layouts' rules are shared; the families' parameters are not),
#: and report their replicated (dp) state without compiling it, the reference fsdp+tp divides.
REFERENCE = "gpt"


def layouts_of(family: str) -> tuple[str, ...]:
    return LAYOUTS if family == REFERENCE else ("fsdp+tp",)


#: Gemma 3's tiny preset has one key/value head; tensor parallelism needs two.
EXTRA = {"gemma3": ("architecture/n_kv_heads=2",)}
#: Gemma 2 soft-caps its attention scores, which cuDNN's fused kernel does not do: XLA attention.
WITHOUT_CUDNN = {"gemma2"}


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str], dict]:
    return compile_layouts(FAMILIES, layouts_of, EXTRA)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_family_compiles_for_h100_in_its_layouts(matrix: dict, family: str) -> None:
    check_family(matrix, family)


def check_family(matrix: dict, family: str) -> None:
    """What every dense family's compiled steps must show, layout by layout."""
    held = {"dp": matrix[(family, "dp")]["plan"]["state_bytes"]}
    for layout in layouts_of(family):
        result = matrix[(family, layout)]
        assert "plan" in result, result.get("error")
        plan = result["plan"]
        # what an H100 run gets: bf16 activations, cuDNN attention where cuDNN supports the case
        assert plan["activation_dtype"] == "bfloat16"
        fused = "__cudnn$fmhaSoftmax" in plan["custom_calls"] and "__cudnn$fmhaSoftmaxBackward" in plan["custom_calls"]
        assert fused == (family not in WITHOUT_CUDNN), plan["custom_calls"]
        # no redundant matmul work, and the whole state (donated) is reused by the outputs
        assert 0.9 <= plan["flops"]["ratio"] <= 1.15, plan["flops"]
        assert plan["memory"]["aliased"] >= plan["state_bytes"]
        assert plan["memory"]["fits"]
        held[layout] = plan["state_bytes"]
    # fsdp holds an eighth of dp's state, tp (over 2) about half, fsdp+tp (data 4 x model 2) an eighth
    if "fsdp" in held:
        assert held["fsdp"] == pytest.approx(held["dp"] / 8, rel=0.05)
    if "tp" in held:
        assert held["tp"] < 0.65 * held["dp"]
    assert held["fsdp+tp"] == pytest.approx(held["dp"] / 8, rel=0.1)
