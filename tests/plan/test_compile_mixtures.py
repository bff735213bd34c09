"""The mixtures compile for 8 x H100 or a v5e:2x4 TPU slice in their layouts, expert parallelism included,
and their expert dispatch does the routed work once: FLOPs near the active parameters', collectives that
do not grow with the number of expert blocks; on H100 at a Qwen3-30B-A3B-like width too, and DeepSeek-V3's
latent attention at its published head widths."""

from __future__ import annotations

import pytest

from tests.plan.conftest import DEVICES, WATCHED, Family, compile_cases, layout_cases

pytestmark = WATCHED

#: The TPU slice of the families compiled for a TPU: each family compiles for one target, and each kind of
#: layer (Mixtral's experts, Qwen3.5's Gated DeltaNet, DeepSeek Sparse Attention) for both.
TPU = "v5e:2x4"
#: DeepSeek-V3's head widths: queries and keys 128 + 64 = 192 wide, values 128 (padded to 192).
MLA_WIDTHS = tuple(f"architecture/mla/{k}_head_dim={w}" for k, w in (("qk_nope", 128), ("qk_rope", 64), ("v", 128)))
#: Each family compiles in one layout (an expert layout's state measured where it compiles none; the
#: replicated (dp) state is every family's reference), and each layout with an expert or a combined rule
#: compiles for one family at least: Mixtral, the reference, replicated and with the expert rule combined
#: with tp, its state measured with the expert rule alone; GLM-4.5 (H100) and the TPU families in fsdp+ep;
#: DeepSeek-V3.2 in fsdp+tp, which applies both of those rules to a mixture's parameters, latent attention
#: and the indexer's (its layers are DeepSeek-V3's with an indexer). DeepSeek-V3 compiles in fsdp at its
#: published head widths (test_latent_attention_falls_back_to_xla); Qwen3-MoE compiles in fsdp at a
#: Qwen3-30B-A3B-like width (:data:`WIDE`).
FAMILIES = {
    "mixtral": Family(("dp", "tp+ep"), measures=("ep",)),
    "deepseek_v3": Family(("fsdp",), measures=("fsdp+ep",), extra=MLA_WIDTHS),
    "glm4_moe": Family(("fsdp+ep",)),
    "deepseek_v32": Family(("fsdp+tp",), measures=("fsdp+ep",)),
    "minimax_m2": Family(("fsdp+ep",), target=TPU),
    "qwen3_5_moe": Family(("fsdp+ep",), target=TPU),
    "glm_moe_dsa": Family(("fsdp+ep",), target=TPU),
}
#: A Qwen3-30B-A3B-shaped expert layer (128 experts, top 8) at a width the suite can afford: 4,096 token
#: copies per device in blocks of 8 rows, hundreds of them, so that a path with a collective per block
#: shows it.
WIDE = (
    "model=qwen3_moe",
    "architecture/n_layers=1",
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
    grid, cases = layout_cases(FAMILIES)
    cases += [
        {"job": "train/pretrain", "overrides": [*WIDE, f"architecture/moe/dispatch={d}"]}
        for d in ("auto", "ragged_dot")
    ]
    results = compile_cases("h100x8", cases)
    found = dict(zip(grid, results[: len(grid)], strict=True))
    found["wide", "auto"], found["wide", "ragged_dot"] = results[len(grid) :]
    return found


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_mixture_compiles_in_its_layouts(matrix: dict, family: str) -> None:
    check_family(matrix, family)


def check_family(matrix: dict, family: str) -> None:
    """What every mixture's compiled steps must show, layout by layout."""
    spec = FAMILIES[family]
    for layout in spec.compiles:
        result = matrix[(family, layout)]
        assert "plan" in result, (layout, result.get("error"))
        plan = result["plan"]
        assert (plan["device"], plan["activation_dtype"]) == (DEVICES[spec.target], "bfloat16")
        assert plan["memory"]["aliased"] >= plan["state_bytes"]
        # blocked dispatch: close to the routed work (ragged_dot on XLA:GPU would be E/k times the experts').
        # Expert parallelism's receive buffers are sized for the worst case and their empty blocks skipped
        # at run time, which the count (the heavier branch of each skip) cannot see: a looser bound there.
        bound = 2.5 if "ep" in layout else 1.3
        assert plan["flops"]["ratio"] <= bound, (layout, plan["flops"])
        # the expert computation sums over the model axis once per layer, not once per expert block
        # (per block, these tiny models ran 92 to 181 all-reduces per step at two layers, half as many at one)
        all_reduces = plan["collectives"].get("all-reduce", {}).get("count", 0)
        assert all_reduces <= 40, (layout, plan["collectives"])
    # the experts split over the expert axis: less state per device than replicated
    expert_layout = "ep" if (family, "ep") in matrix else "fsdp+ep"
    assert matrix[(family, expert_layout)]["plan"]["state_bytes"] < matrix[(family, "dp")]["plan"]["state_bytes"]


@pytest.mark.slow
def test_latent_attention_falls_back_to_xla(matrix: dict) -> None:
    """DeepSeek-V3's 192-wide heads: Hopper's cuDNN takes up to 256, but jax checks that against the
    host's backend, so a program compiled here (or with cuDNN refused) uses XLA's attention."""
    plan = matrix["deepseek_v3", "fsdp"]["plan"]
    assert "__cudnn$fmhaSoftmax" not in plan["custom_calls"]
    assert plan["flops"]["ratio"] <= 1.3


@pytest.mark.slow
def test_expert_dispatch_on_h100_does_the_routed_work_once(matrix: dict) -> None:
    """Qwen3-MoE at a Qwen3-30B-A3B-like width, in fsdp."""
    for dispatch in ("auto", "ragged_dot"):
        assert "plan" in matrix["wide", dispatch], matrix["wide", dispatch].get("error")
    auto, ragged = matrix["wide", "auto"]["plan"], matrix["wide", "ragged_dot"]["plan"]
    assert (auto["device"], auto["activation_dtype"]) == (DEVICES["h100x8"], "bfloat16")
    assert auto["memory"]["aliased"] >= auto["state_bytes"]
    # XLA:GPU runs ragged_dot as a dense product over all 128 experts; the default takes the blocks
    assert ragged["flops"]["ratio"] > 5
    assert auto["flops"]["ratio"] <= 1.3
    # each device dispatches its own rows: a few collectives per layer, none per block
    executed = sum(entry["count"] for entry in auto["collectives"].values())
    assert executed <= 40, auto["collectives"]
    assert auto["memory"]["temporaries"] < ragged["memory"]["temporaries"]
