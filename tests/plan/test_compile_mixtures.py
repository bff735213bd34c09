"""The mixtures compile for 8 x H100 in their layouts, expert parallelism included, and their expert
dispatch does the routed work once: FLOPs near the active parameters', collectives that do not grow
with the number of expert blocks."""

from __future__ import annotations

import pytest

from tests.plan.conftest import compile_layouts

#: The mixtures of this module; test_compile_mixtures_wide.py compiles DeepSeek-V3 and the dispatch check
#: (two modules run in parallel).
FAMILIES = ("mixtral", "qwen3_moe")
#: Mixtral compiles replicated and in every layout with an expert or a combined rule (fsdp and tp alone
#: are the dense matrices' reference layouts; fsdp+tp applies both to the mixture); the other mixtures
#: in the two that apply each rule (fsdp, tp, ep) to their parameters, with their replicated (dp) state
#: measured without a compile.
LAYOUTS = ("dp", "fsdp+tp", "ep", "fsdp+ep", "tp+ep")
OTHER_LAYOUTS = ("fsdp+tp", "fsdp+ep")


def layouts_of(family: str) -> tuple[str, ...]:
    return LAYOUTS if family == "mixtral" else OTHER_LAYOUTS


@pytest.fixture(scope="module")
def matrix() -> dict:
    return compile_layouts(FAMILIES, layouts_of)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_mixture_compiles_for_h100_in_its_layouts(matrix: dict, family: str) -> None:
    check_family(matrix, family)


def check_family(matrix: dict, family: str) -> None:
    """What every mixture's compiled steps must show, layout by layout."""
    for layout in layouts_of(family):
        result = matrix[(family, layout)]
        assert "plan" in result, (layout, result.get("error"))
        plan = result["plan"]
        assert plan["activation_dtype"] == "bfloat16"
        assert plan["memory"]["aliased"] >= plan["state_bytes"]
        # blocked dispatch: close to the routed work (ragged_dot on XLA:GPU would be E/k times the experts').
        # Expert parallelism's receive buffers are sized for the worst case and their empty blocks skipped
        # at run time, which the count (the heavier branch of each skip) cannot see: a looser bound there.
        bound = 2.5 if "ep" in layout else 1.3
        assert plan["flops"]["ratio"] <= bound, (layout, plan["flops"])
        # the expert computation sums over the model axis once per layer, not once per expert block
        # (per block, these tiny models ran 92 to 181 all-reduces per step)
        all_reduces = plan["collectives"].get("all-reduce", {}).get("count", 0)
        assert all_reduces <= 40, (layout, plan["collectives"])
    # the experts split over the expert axis: less state per device than replicated
    expert_layout = "ep" if "ep" in layouts_of(family) else "fsdp+ep"
    assert matrix[(family, expert_layout)]["plan"]["state_bytes"] < matrix[(family, "dp")]["plan"]["state_bytes"]
