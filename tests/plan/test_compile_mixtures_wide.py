"""DeepSeek-V3 replicated and sharded (see test_compile_mixtures.py), and the expert dispatch on H100 at a
Qwen3-30B-A3B-like width: the routed work done once, collectives that do not grow with the blocks."""

from __future__ import annotations

import pytest

from tests.plan import test_compile_mixtures as mixtures
from tests.plan.conftest import compile_cases, layout_cases

#: A Qwen3-30B-A3B-shaped expert layer (128 experts, top 8) at a width the suite can afford: 4,096 token
#: copies per device in blocks, so that a path with a collective per block shows it.
WIDE = (
    "model=qwen3_moe",
    "architecture/n_layers=2",
    "architecture/n_embd=256",
    "architecture/n_heads=4",
    "architecture/n_kv_heads=2",
    "architecture/moe/n_experts=128",
    "architecture/moe/top_k=8",
    "architecture/moe/expert_hidden=64",
    "architecture/block_size=512",
    "training/sequence_length=512",
    "training/batch_size=8",
    "mesh/layout=fsdp",
)


@pytest.fixture(scope="module")
def matrix() -> dict:
    grid, cases = layout_cases(("deepseek_v3",), mixtures.layouts_of)
    cases += [
        {"job": "train/pretrain", "overrides": [*WIDE, f"architecture/moe/dispatch={d}"]}
        for d in ("auto", "ragged_dot")
    ]
    results = compile_cases("h100x8", cases)
    found = dict(zip(grid, results[: len(grid)], strict=True))
    found["wide", "auto"], found["wide", "ragged_dot"] = results[len(grid) :]
    return found


@pytest.mark.slow
def test_deepseek_v3_compiles_for_h100_in_its_layouts(matrix: dict) -> None:
    mixtures.check_family(matrix, "deepseek_v3")


@pytest.mark.slow
def test_expert_dispatch_on_h100_does_the_routed_work_once(matrix: dict) -> None:
    auto, ragged = matrix["wide", "auto"]["plan"], matrix["wide", "ragged_dot"]["plan"]
    # XLA:GPU runs ragged_dot as a dense product over all 128 experts; the default takes the blocks
    assert ragged["flops"]["ratio"] > 5
    assert auto["flops"]["ratio"] <= 1.3
    # each device dispatches its own rows: a few collectives per layer, none per block
    executed = sum(entry["count"] for entry in auto["collectives"].values())
    assert executed <= 40, auto["collectives"]
    assert auto["memory"]["temporaries"] < ragged["memory"]["temporaries"]
