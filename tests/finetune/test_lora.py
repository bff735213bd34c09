"""LoRA in the standard layers: every projection of a Llama-style model takes adapters, fresh
adapters change nothing, and merging them into the kernels gives the same model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.huggingface.conftest import DSA, HYBRID, TWO_LAYERS
from tests.models.conftest import build, forward, parameter_shapes, random_params
from theseus.errors import ConfigError
from theseus.model.layers import lora
from theseus.model.models import DeepseekV3, DeepseekV32, Llama, decode_step, init_cache
from theseus.training.adapters import is_adapter, overlay, prune

ALL = ["query", "key", "value", "out", "up", "gate", "down"]


def test_llama_adapters_on_every_projection_merge_into_the_same_model() -> None:
    adapted_model = build(Llama, model__lora__rank=2, model__lora__targets=ALL, model__lora__alpha=4.0)
    plain_model = build(Llama)
    params = random_params(adapted_model, std=0.2)  # adapters with non-zero B: they change the model
    assert lora.adapter_names(params) == set(ALL)
    x = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)

    adapted = forward(adapted_model, params, x)
    merged = lora.merge(params, 4.0, 2)
    np.testing.assert_allclose(forward(plain_model, merged, x), adapted, atol=1e-5, rtol=0)
    base = lora.merge(params, 4.0, 0)  # adapters dropped, kernels untouched
    assert np.max(np.abs(forward(plain_model, base, x) - adapted)) > 1e-3

    fresh = jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.zeros_like(leaf) if str(getattr(path[-1], "key", "")).endswith("lora_b") else leaf,
        params,
    )
    np.testing.assert_array_equal(forward(adapted_model, fresh, x), forward(plain_model, base, x))


@pytest.mark.parametrize("cls", [DeepseekV3, DeepseekV32], ids=["deepseek_v3", "deepseek_v32"])
def test_latent_attention_adapters_merge_and_decode_against_the_compressed_cache(cls: type[Any]) -> None:
    """Multi-head latent attention (DeepSeek Sparse Attention's too) takes adapters on query, key, value and out:
    merged they give the same model, fresh ones change nothing, and decoding against the compressed cache (which
    reads the key and value kernels with their adapters folded in) gives the full forward's logits."""
    # the preset's dense layer and one of its two mixture layers: the adapters are the attention's
    tiny = {"architecture__preset": "tiny", "architecture__mtp_depth": 0, "architecture__n_layers": 2}
    adapted_model = build(cls, model__lora__rank=2, model__lora__alpha=4.0, **tiny)
    plain_model = build(cls, **tiny)
    params = random_params(adapted_model, std=0.2)
    assert lora.adapter_names(params) == {"query", "key", "value", "out"}
    x = np.random.default_rng(0).integers(0, 64, size=(2, 12)).astype(np.int32)

    adapted = forward(adapted_model, params, x)
    np.testing.assert_allclose(forward(plain_model, lora.merge(params, 4.0, 2), x), adapted, atol=2e-5, rtol=0)
    base = lora.merge(params, 4.0, 0)
    assert np.max(np.abs(forward(plain_model, base, x) - adapted)) > 1e-1
    fresh = jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.zeros_like(leaf) if str(getattr(path[-1], "key", "")).endswith("lora_b") else leaf,
        params,
    )
    np.testing.assert_allclose(forward(adapted_model, fresh, x), forward(plain_model, base, x), atol=2e-5, rtol=0)

    cache = init_cache(adapted_model, 2, 12)
    logits, cache = decode_step(adapted_model, params, cache, x[:, :9])
    steps = [np.asarray(logits)]
    for t in range(9, 12):
        logits, cache = decode_step(adapted_model, params, cache, x[:, t : t + 1])
        steps.append(np.asarray(logits))
    np.testing.assert_allclose(np.concatenate(steps, axis=1), adapted, atol=2e-5, rtol=0)


def test_latent_attention_refuses_dropout_on_its_folded_key_and_value_adapters() -> None:
    model = build(DeepseekV3, architecture__preset="tiny", model__lora__rank=2, model__lora__dropout=0.1)
    with pytest.raises(ConfigError, match=r"model/lora/dropout=0.1 cannot reach the 'key' adapter"):
        parameter_shapes(model)
    query_out = build(
        DeepseekV3,
        architecture__preset="tiny",
        model__lora__rank=2,
        model__lora__dropout=0.1,
        model__lora__targets=["query", "out"],
    )
    assert lora.adapter_names(parameter_shapes(query_out)) == {"query", "out"}


#: (family, layer layout, targets, PEFT modules per layer). Phi-3 fuses q/k/v into qkv_proj and gate/up
#: into gate_up_proj: their adapters become one block-structured adapter each (GQA: 4 query, 2 kv heads);
#: with key and gate left out, their rows of the fused B stay zero.
PEFT_CASES = {
    "llama": ("llama", False, ALL, 7),
    "phi3": ("phi3", False, ALL, 4),
    "phi3-scanned-subset": ("phi3", True, ["query", "value", "up", "down"], 3),
    "gemma2": ("gemma2", False, ALL, 7),
    "gemma3-scanned": ("gemma3_text", True, ALL, 7),  # layer indices scanned in: a window on layer 0 only
    "olmo3-scanned": ("olmo3", True, ALL, 7),  # OLMo 2's norms, a window on layer 0 only
    "gpt_oss-scanned": ("gpt_oss", True, ["query", "key", "value", "out"], 4),  # sinks; experts not adapted
    # chunked RoPE and NoPE layers, dense and mixture layers interleaved, scanned: a unit of a dense and a
    # mixture layer per scan step, each position held apart; experts not adapted (the export reads the layers
    # one by one, as it reads an unrolled model's: its unrolled layers against transformers' logits,
    # tests/huggingface/test_import_parity.py)
    "llama4_text-scanned": ("llama4_text", True, ["query", "key", "value", "out"], 4),
    # full-attention layers (q_proj: each head's query, then its output gate) and linear-attention layers
    # (LINEAR_RANKS); experts not adapted
    "qwen3_next": ("qwen3_next", False, ["query", "key", "value", "out"], 4),
    "qwen3_next-value-out": ("qwen3_next", False, ["value", "out"], 2),
    # Qwen3.5: the linear-attention layers' split projections (in_proj_qkv fuses query, key and value; in_proj_z
    # holds z, which follows value); a dense MLP on every layer, adapted on both kinds of layer
    "qwen3_5_text": ("qwen3_5_text", False, ["query", "key", "value", "out", "up", "down"], 6),
    "qwen3_5_moe_text": ("qwen3_5_moe_text", False, ["key", "value", "out"], 3),
    # q/k norms over the whole projections after the adapted query and key, partial RoPE; experts not adapted
    "minimax_m2-scanned": ("minimax_m2", True, ["query", "key", "value", "out"], 4),
    # a RoPE layer then a NoPE one; attention biases, a tied head
    "smollm3": ("smollm3", False, ALL, 7),
    # partial RoPE, query/key/value biases and norms, a dense layer then mixtures; experts not adapted
    "glm4_moe": ("glm4_moe", False, ["query", "key", "value", "out"], 4),
    # latent attention (MLA_RANKS): q_b_proj, kv_b_proj (each head's key rows, then its value rows) and o_proj;
    # a dense layer then a mixture layer, scanned as two runs; experts not adapted
    "deepseek_v3-scanned": ("deepseek_v3", True, ["query", "key", "value", "out"], 3),
    # no query bottleneck (q_proj); kv_b_proj with only its value rows adapted
    "deepseek_v3-plain-query": ("deepseek_v3", False, ["query", "value", "out"], 3),
    # the same latent attention with a lightning indexer keeping 4 of the 10 keys (sparse)
    "deepseek_v32": ("deepseek_v32", False, ["query", "key", "value", "out"], 3),
    "glm_moe_dsa": ("glm_moe_dsa", False, ["key", "value", "out"], 2),
    # a sliding layer (heads of 8) and a full one (heads of 16, proportional RoPE), value norms, per-layer inputs
    "gemma4_text": ("gemma4_text", False, ALL, 7),
    # a short-convolution layer (its feed-forward adapted: LINEAR_RANKS) and an attention layer (out_proj,
    # feed_forward.w1 / w3 / w2)
    "lfm2": ("lfm2", False, ALL, 7),
    # a Mamba-2 layer (LAYER_RANKS: in_proj, adapted for query, key and value; PEFT refuses its out_proj, so
    # no out), an attention layer and a squared-ReLU MLP layer (up_proj, down_proj: no gate)
    "nemotron_h": ("nemotron_h", False, ["query", "key", "value", "up", "down"], 0),
    # attention and a Mamba-2 mixer in parallel (LAYER_RANKS: the mixer's in_proj adapted for query, key and value;
    # PEFT refuses its out_proj, so no out), the multipliers applied after the adapted projections as transformers
    # applies them
    "falcon_h1": ("falcon_h1", False, ["query", "key", "value", "up", "gate", "down"], 0),
    # OLMo Hybrid (LAYER_RANKS): a Gated DeltaNet layer's separate projections (value adapts v_proj and the
    # output gate g_proj) and a post-norm attention layer, a SwiGLU MLP adapted on both
    "olmo_hybrid": ("olmo_hybrid", False, ["query", "value", "out", "up", "down"], 0),
    # Granite without experts (LAYER_RANKS): a Mamba-2 layer's in_proj (adapted for query, key and value; PEFT
    # refuses its out_proj, so no out) and an attention layer's, each with the shared MLP (input_linear: the
    # gate rows then the up rows, output_linear), the multipliers applied as transformers applies them
    "granitemoehybrid-dense": ("granitemoehybrid", False, ["query", "key", "value", "up", "gate", "down"], 0),
    # Kimi Linear (LAYER_RANKS): a Kimi Delta Attention layer's q/k/v/o projections (the gates' low-rank pairs take
    # none) and a NoPE latent-attention layer (q_proj, kv_b_proj with key and value rows, o_proj)
    "kimi_linear": ("kimi_linear", False, ["query", "key", "value", "out"], 0),
}

#: Latent attention (DeepSeek-V3 and its descendants) at the DSA sizes of tests/huggingface/conftest.py, without
#: the indexer; the families with an indexer take it from there. ``plain-query``: no query bottleneck.
MLA = {k: v for k, v in DSA.items() if not k.startswith("index_")}
HF_OVERRIDES: dict[str, dict[str, Any]] = {
    "deepseek_v3-scanned": MLA,
    "deepseek_v3-plain-query": {**MLA, "q_lora_rank": None},
    # two layers where the import tests save 3 or 4: a linear-attention layer then a full one, a dense MLP then
    # a mixture (each kind of adapted layer once, at about half the tracing and compiling)
    "qwen3_next": HYBRID,
    "qwen3_next-value-out": HYBRID,
    "qwen3_5_text": HYBRID,
    "qwen3_5_moe_text": HYBRID,
    "glm4_moe": TWO_LAYERS,
    "granitemoehybrid-dense": {"num_local_experts": 0},
}
#: The latent attention's PEFT modules and each one's rank in units of the LoRA rank (kv_b_proj: one block of B
#: per adapted projection of key and value).
MLA_RANKS = {
    "deepseek_v3-scanned": {"self_attn.q_b_proj": 1, "self_attn.kv_b_proj": 2, "self_attn.o_proj": 1},
    "deepseek_v3-plain-query": {"self_attn.q_proj": 1, "self_attn.kv_b_proj": 1, "self_attn.o_proj": 1},
    "deepseek_v32": {"self_attn.q_b_proj": 1, "self_attn.kv_b_proj": 2, "self_attn.o_proj": 1},
    "glm_moe_dsa": {"self_attn.kv_b_proj": 2, "self_attn.o_proj": 1},
}

#: Qwen3-Next's linear-attention layers: their PEFT modules and each one's rank in units of the LoRA rank
#: (in_proj_qkvz: the adapted ones of query, key, value and z, which follows value, grouped per key head).
LINEAR_RANKS = {
    "qwen3_next": {"linear_attn.in_proj_qkvz": 4, "linear_attn.out_proj": 1},
    "qwen3_next-value-out": {"linear_attn.in_proj_qkvz": 2, "linear_attn.out_proj": 1},
    "qwen3_5_text": {
        "linear_attn.in_proj_qkv": 3,
        "linear_attn.in_proj_z": 1,
        "linear_attn.out_proj": 1,
        "mlp.up_proj": 1,
        "mlp.down_proj": 1,
    },
    "qwen3_5_moe_text": {"linear_attn.in_proj_qkv": 2, "linear_attn.in_proj_z": 1, "linear_attn.out_proj": 1},
    # LFM2's short-convolution layers: only their feed-forward is adapted
    "lfm2": {"feed_forward.w1": 1, "feed_forward.w3": 1, "feed_forward.w2": 1},
}
#: The layer types without attention, whose adapters LINEAR_RANKS lists.
UNATTENDED = ("linear_attention", "conv", "mamba")
#: Families whose layers each have their own modules: every layer's PEFT modules (below its prefix).
LAYER_RANKS = {
    "nemotron_h": [
        {"mixer.in_proj": 1},
        {"mixer.q_proj": 1, "mixer.k_proj": 1, "mixer.v_proj": 1},
        {"mixer.up_proj": 1, "mixer.down_proj": 1},
    ],
    "falcon_h1": [
        {
            **{f"self_attn.{p}_proj": 1 for p in "qkv"},
            "mamba.in_proj": 1,
            **{f"feed_forward.{p}_proj": 1 for p in ("up", "gate", "down")},
        }
    ],
    "olmo_hybrid": [
        {f"linear_attn.{p}_proj": 1 for p in ("q", "v", "g", "o")} | {"mlp.up_proj": 1, "mlp.down_proj": 1},
        {"self_attn.q_proj": 1, "self_attn.v_proj": 1, "self_attn.o_proj": 1, "mlp.up_proj": 1, "mlp.down_proj": 1},
    ],
    "granitemoehybrid-dense": [
        {"mamba.in_proj": 1, "shared_mlp.input_linear": 2, "shared_mlp.output_linear": 1},
        {**{f"self_attn.{p}_proj": 1 for p in "qkv"}, "shared_mlp.input_linear": 2, "shared_mlp.output_linear": 1},
    ],
    "kimi_linear": [
        {f"self_attn.{p}_proj": 1 for p in "qkvo"},
        {"self_attn.q_proj": 1, "self_attn.kv_b_proj": 2, "self_attn.o_proj": 1},
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(PEFT_CASES))
def test_peft_loads_the_exported_adapter_and_gives_the_same_logits(case: str, tmp_path: Path) -> None:
    """The PEFT layout of the adapted projections, written as hf/export-adapter writes it and loaded by peft."""
    import torch
    from peft import PeftModel

    from tests.huggingface.conftest import save_model
    from theseus.config import configuration, configure
    from theseus.model.finetune.peft_export import adapter_config, peft_tensors, write_adapter
    from theseus.model.huggingface.family import family
    from theseus.model.huggingface.importer import prepare, read_params

    name, scan, targets, modules = PEFT_CASES[case]
    hf_model = save_model(tmp_path / "base", name, tokenizer=False, **HF_OVERRIDES.get(case, {}))
    imported = prepare(tmp_path / "base", {"model/scan_layers": scan})
    base = read_params(imported)
    rank, alpha = 2, 4
    adapters = {"model/lora/rank": rank, "model/lora/alpha": float(alpha), "model/lora/targets": targets}
    with configuration({**dict(imported.config), **adapters}):
        model = configure(type(imported.model))
    assert model.scans_layers == scan
    shapes = random_params(model, seed=3, std=0.2)
    params = jax.tree_util.tree_map_with_path(lambda path, leaf: leaf if is_adapter(path) else None, shapes)
    params = overlay(base, prune(params))
    x = np.random.default_rng(0).integers(0, 256, size=(2, 10)).astype(np.int32)
    ours = forward(model, params, x)

    hf_family = family(name)
    tensors, ranks = peft_tensors(hf_family, params, model.architecture, model.stacked_layers)
    linear = sum(t in UNATTENDED for t in model.architecture.layer_types or ())
    linear_ranks = LINEAR_RANKS.get(case, {})
    if case not in LAYER_RANKS:
        assert len(ranks) == modules * (model.architecture.n_layers - linear) + len(linear_ranks) * linear
    if case in LAYER_RANKS:  # each layer its own modules, nothing else
        assert len(ranks) == sum(map(len, LAYER_RANKS[case]))
        for layer, expected in enumerate(LAYER_RANKS[case]):
            got = {m.split(".", 3)[3]: r for m, r in ranks.items() if f"layers.{layer}." in m}
            assert got == {m: rank * k for m, k in expected.items()}
    elif name == "phi3":  # a fused module's rank: rank times its adapted projections
        fused = {"self_attn.qkv_proj": 3 if "key" in targets else 2, "mlp.gate_up_proj": 2 if "gate" in targets else 1}
        assert {m.split(".", 3)[3]: r for m, r in ranks.items() if "layers.0." in m} == {
            **{m: rank * k for m, k in fused.items()},
            "mlp.down_proj": rank,
            **({"self_attn.o_proj": rank} if "out" in targets else {}),
        }
    elif case in MLA_RANKS:  # every layer alike, kv_b_proj one adapter for key and value
        for layer in range(model.architecture.n_layers):
            got = {m.split(".", 3)[3]: r for m, r in ranks.items() if f"layers.{layer}." in m}
            assert got == {m: rank * k for m, k in MLA_RANKS[case].items()}
    elif linear_ranks:  # layer 0 is a linear-attention layer
        first = {m.split(".", 3)[3]: r for m, r in ranks.items() if "layers.0." in m}
        assert first == {m: rank * k for m, k in linear_ranks.items()}
        assert {r for m, r in ranks.items() if "self_attn" in m} == {rank}
    else:
        assert set(ranks.values()) == {rank}
    config = adapter_config(hf_family, ranks, rank=rank, alpha=float(alpha), dropout=0.0, base=str(tmp_path / "base"))
    (tmp_path / "adapter").mkdir()
    write_adapter(tmp_path / "adapter", config, tensors)
    peft_model = PeftModel.from_pretrained(hf_model, tmp_path / "adapter").eval()
    loaded = {k.replace(".default.", ".") for k in peft_model.state_dict() if "lora_" in k}
    assert loaded == set(tensors)  # nothing missing, nothing unexpected
    with torch.no_grad():
        theirs = peft_model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
        with peft_model.disable_adapter():
            plain = peft_model(torch.tensor(x, dtype=torch.long)).logits.float().numpy()
    assert np.max(np.abs(theirs - ours)) <= 1e-4
    assert np.max(np.abs(plain - ours)) > 1e-2  # the adapters change the model: not a vacuous match
    if linear_ranks or linear:  # and the adapters of the layers without attention do, by themselves
        kept = without_linear_adapters(params, model.architecture.layer_types or ())
        without = forward(model, kept, x)
        assert np.max(np.abs(without - ours)) > 1e-2


def without_linear_adapters(params: Any, layer_types: tuple[str, ...]) -> Any:
    """``params`` with the adapters of the layers without attention (linear attention, short convolution) zeroed."""

    def zero(path: Any, leaf: Any) -> Any:
        name = str(getattr(path[0], "key", ""))
        linear = name.startswith("blocks_") and layer_types[int(name.split("_")[1])] in UNATTENDED
        return leaf * 0 if linear and is_adapter(path) else leaf

    return jax.tree_util.tree_map_with_path(zero, params)
