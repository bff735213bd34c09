"""DeepSeek-V3 checkpoints (``DeepseekV3ForCausalLM``) <-> theseus' ``DeepseekV3``: the ``hf/deepseek_v3`` family.

Each layer's ``self_attn`` holds the latent attention: ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``
(or one ``q_proj`` when ``q_lora_rank`` is null), ``kv_a_proj_with_mqa`` (the latent's rows, then the
shared rotated key's), ``kv_a_layernorm`` and ``kv_b_proj`` (per head: the key's rows, then the
value's), ``o_proj``. The leading ``first_k_dense_replace`` layers have a dense ``mlp``; the others hold
the router ``mlp.gate`` with its ``e_score_correction_bias`` (theseus' ``router_bias``), the experts one
tensor each (``mlp.experts.<j>.gate_proj`` / ``up_proj`` / ``down_proj``, as ``save_pretrained`` writes
them; stacked on theseus' ``expert`` axis) and ``mlp.shared_experts``. RoPE scaling: ``yarn`` (the
releases' long-context setting) with ``mscale_all_dim`` (``architecture/mla/mscale_all_dim``), as well
as ``linear`` and ``llama3``.

The multi-token-prediction modules (``num_nextn_predict_layers`` <-> ``architecture/mtp_depth``) are
stored after the last layer: module ``k`` (1..D) is ``model.layers.<num_hidden_layers + k - 1>``, with
``enorm`` / ``hnorm`` / ``eh_proj`` (``[n_embd, 2 * n_embd]``, embedding half first), a mixture layer's
tensors (``input_layernorm``, ``self_attn.*``, ``post_attention_layernorm``, ``mlp.*``) and
``shared_head.norm`` (theseus' ``mtp_<k-1>/enorm``, ``hnorm``, ``eh_proj``, ``block/...``,
``head_norm``), plus copies of the shared embedding (``embed_tokens``) and head (``shared_head.head``):
export writes them, import reads the main model's (:class:`~theseus.model.huggingface.names.TensorMap`
``copy``). A checkpoint whose ``config.json`` declares them but holds none of their tensors (what
transformers' ``save_pretrained`` writes) imports without them; ``architecture/mtp_depth`` set lower at
import leaves the rest out. transformers' ``DeepseekV3ForCausalLM`` has no such module: it ignores
``model.layers.61.*`` (the release's) on load and reports the modules of other depths as unexpected keys.

PEFT adapters (``hf/export-adapter``, :meth:`DeepseekV3Family.peft_layout`): the ``query`` adapter is
``self_attn.q_b_proj``'s (``q_proj``'s without the query bottleneck), ``key`` and ``value`` together
``self_attn.kv_b_proj``'s (its rows interleave them head by head: one block-structured adapter), ``out``
``self_attn.o_proj``'s; the down-projections ``q_a_proj`` and ``kv_a_proj_with_mqa`` take none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import rope_config, rope_keys
from theseus.model.huggingface.family import HFFamily, Identity, PeftLayout, cannot, expect, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    fused,
    head_maps,
    heads_in,
    heads_out,
    same,
    transposed,
    vocab_embedding,
    vocab_head,
)
from theseus.model.layers.latent_attention import MLASpec
from theseus.model.layers.moe import MoESpec
from theseus.model.models.deepseek_v3.mtp import latent, mtp_depth
from theseus.model.models.mixtral.hf import expert_maps, mixture
from theseus.model.stack.architecture import Architecture

DEEPSEEK_V3_CLASS = "theseus.model.models.deepseek_v3.model:DeepseekV3"


def latent_of(arch: Architecture) -> MLASpec:
    mla = latent(arch)
    if mla is None:
        raise cannot("deepseek_v3", "grouped-query attention (it holds multi-head latent attention)")
    return mla


def key_value_up(hf: str, path: tuple[str, ...], mla: MLASpec, heads: int) -> TensorMap:
    """``kv_b_proj`` ``[heads * (nope + v), rank]`` <-> ``key`` ``[rank, heads, nope]`` and ``value``
    ``[rank, heads, v]``."""
    rank, nope, v = mla.kv_lora_rank, mla.qk_nope_head_dim, mla.v_head_dim

    def to_theseus(w: np.ndarray) -> list[np.ndarray]:
        per_head = w.T.reshape(rank, heads, nope + v)
        return [per_head[..., :nope], per_head[..., nope:]]

    def to_hf(leaves: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(leaves, axis=-1).reshape(rank, heads * (nope + v)).T

    paths = ((*path, "key"), (*path, "value"))
    return TensorMap(hf, (heads * (nope + v), rank), paths, to_theseus, to_hf)


def attention_maps(arch: Architecture, layer: int) -> list[TensorMap]:
    """The latent attention tensors of layer ``layer``."""
    mla, e, h = latent_of(arch), arch.n_embd, arch.attention.n_heads
    hf, ours = f"model.layers.{layer}.self_attn.", (f"blocks_{layer}", "attn")
    if mla.q_lora_rank:
        q = mla.q_lora_rank
        maps = [
            transposed(hf + "q_a_proj.weight", (*ours, "query_down"), q, e),
            same(hf + "q_a_layernorm.weight", (*ours, "query_norm", "scale"), (q,)),
            heads_in(hf + "q_b_proj.weight", (*ours, "query"), q, h, mla.qk_head_dim),
        ]
    else:
        maps = [heads_in(hf + "q_proj.weight", (*ours, "query"), e, h, mla.qk_head_dim)]
    down = [
        transposed("", (*ours, "kv_down"), mla.kv_lora_rank, e),
        transposed("", (*ours, "key_rope"), mla.qk_rope_head_dim, e),
    ]
    maps += [
        fused(hf + "kv_a_proj_with_mqa.weight", down),
        same(hf + "kv_a_layernorm.weight", (*ours, "kv_norm", "scale"), (mla.kv_lora_rank,)),
        key_value_up(hf + "kv_b_proj.weight", ours, mla, h),
        heads_out(hf + "o_proj.weight", (*ours, "out"), e, h, mla.v_head_dim),
    ]
    return maps


def feed_forward_maps(arch: Architecture, layer: int) -> list[TensorMap]:
    """The dense MLP of a leading layer, or the router, its bias, the experts and the shared experts."""
    moe, e = mixture(arch), arch.n_embd
    hf, ours = f"model.layers.{layer}.mlp.", (f"blocks_{layer}", "mlp")

    def swiglu(prefix: str, path: tuple[str, ...], width: int) -> list[TensorMap]:
        shapes = {"gate": (width, e), "up": (width, e), "down": (e, width)}
        return [transposed(f"{prefix}{n}_proj.weight", (*path, n, "kernel"), *s) for n, s in shapes.items()]

    if layer < moe.first_k_dense:
        return swiglu(hf, ours, arch.feed_forward.d_ff)
    projections = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
    maps = expert_maps(arch, layer, hf, "gate", projections)
    maps.append(same(hf + "gate.e_score_correction_bias", (*ours, "router_bias"), (moe.n_experts,)))
    return maps + swiglu(hf + "shared_experts.", (*ours, "shared"), moe.n_shared * moe.expert_hidden)


def layer_maps(arch: Architecture, layer: int) -> list[TensorMap]:
    """Every tensor of layer ``layer``: its norms, latent attention and feed-forward."""
    hf, ours = f"model.layers.{layer}.", f"blocks_{layer}"
    maps = [same(hf + "input_layernorm.weight", (ours, "attn_norm", "scale"), (arch.n_embd,))]
    maps += attention_maps(arch, layer)
    maps.append(same(hf + "post_attention_layernorm.weight", (ours, "mlp_norm", "scale"), (arch.n_embd,)))
    return maps + feed_forward_maps(arch, layer)


def mtp_maps(arch: Architecture, depth: int) -> list[TensorMap]:
    """The tensors of multi-token-prediction module ``depth`` (1..D): ``model.layers.<n_layers + depth - 1>``
    <-> ``mtp_<depth - 1>``; its mixture layer is :func:`layer_maps` of that index moved to ``block``,
    and the embedding and head are copies of the main model's."""
    layer, e = arch.n_layers + depth - 1, arch.n_embd
    hf, ours = f"model.layers.{layer}.", f"mtp_{depth - 1}"

    def moved(path: tuple[str, ...]) -> tuple[str, ...]:
        return (ours, "block", *path[1:]) if path[0] == f"blocks_{layer}" else path

    block = [dataclasses.replace(m, paths=tuple(moved(p) for p in m.paths)) for m in layer_maps(arch, layer)]
    head = ("token_embedding", "embedding") if arch.tied_embeddings else ("lm_head",)
    make_head = vocab_embedding if arch.tied_embeddings else vocab_head
    return [
        same(hf + "enorm.weight", (ours, "enorm", "scale"), (e,)),
        same(hf + "hnorm.weight", (ours, "hnorm", "scale"), (e,)),
        transposed(hf + "eh_proj.weight", (ours, "eh_proj"), e, 2 * e),
        *block,
        same(hf + "shared_head.norm.weight", (ours, "head_norm", "scale"), (e,)),
        dataclasses.replace(
            vocab_embedding(hf + "embed_tokens.weight", ("token_embedding", "embedding"), arch), copy=True
        ),
        dataclasses.replace(make_head(hf + "shared_head.head.weight", head, arch), copy=True),
    ]


#: What transformers' ``DeepseekV3Config`` reads where ``config.json`` omits a field (the published
#: model's values); import falls back to the same, so a sparse config.json builds transformers' model.
HF_DEFAULTS: dict[str, Any] = {
    "q_lora_rank": 1536,
    "first_k_dense_replace": 3,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "num_nextn_predict_layers": 1,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
}


def sigmoid_mixture(family: str, arch: Architecture) -> MoESpec:
    """The mixture of ``arch``, refused in one line unless it is DeepSeek-V3's kind (sigmoid router, shared
    experts), which :func:`mixture_config` writes."""
    moe = mixture(arch)
    if moe.router != "sigmoid":
        raise cannot(family, f"architecture/moe/router={moe.router} (its router is sigmoid)")
    if not moe.n_shared:
        raise cannot(family, "architecture/moe/n_shared=0 (its mixture layers have shared experts)")
    return moe


def mixture_config(moe: MoESpec) -> dict[str, Any]:
    """The ``config.json`` fields of DeepSeek-V3's mixture (GLM-4.5's too)."""
    return {
        "n_routed_experts": moe.n_experts,
        "num_experts_per_tok": moe.top_k,
        "moe_intermediate_size": moe.expert_hidden,
        "n_shared_experts": moe.n_shared,
        "norm_topk_prob": moe.norm_topk_prob,
        "first_k_dense_replace": moe.first_k_dense,
        "n_group": moe.n_group,
        "topk_group": moe.topk_group,
        "routed_scaling_factor": moe.routed_scaling_factor,
    }


def hf_default(config: Mapping[str, Any], field: str) -> Any:
    """``config[field]``, or transformers' default where it is absent."""
    return config.get(field, HF_DEFAULTS[field])


class DeepseekV3Family(HFFamily):
    """``model_type: deepseek_v3``."""

    identity: ClassVar[Identity] = Identity("deepseek_v3", "DeepseekV3ForCausalLM", DEEPSEEK_V3_CLASS)

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "hidden_act", "silu")
        expect(config, "attention_bias", False)
        expect(config, "scoring_func", "sigmoid")
        expect(config, "topk_method", "noaux_tc")
        n_heads = int(require(config, "num_attention_heads"))
        n_kv = config.get("num_key_value_heads")
        if n_kv is not None and int(n_kv) != n_heads:
            raise unsupported("num_key_value_heads", n_kv, f"latent attention has one key/value per head ({n_heads})")
        rope = rope_keys(config)
        scaling = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
        mscale_all_dim = float(scaling.get("mscale_all_dim") or 0.0)
        q_lora, shared = hf_default(config, "q_lora_rank"), hf_default(config, "n_shared_experts")
        if not shared:
            raise unsupported("n_shared_experts", shared, "theseus' DeepSeek-V3 layers have shared experts")
        return {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/n_layers": int(require(config, "num_hidden_layers")),
            "architecture/n_heads": n_heads,
            "architecture/n_embd": int(require(config, "hidden_size")),
            "architecture/d_ff": int(require(config, "intermediate_size")),
            "architecture/activation": "swiglu",
            "architecture/norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            "architecture/dropout": 0.0,
            "architecture/block_size": int(config.get("max_position_embeddings", 4096)),
            **rope,
            "architecture/mla/q_lora_rank": 0 if q_lora is None else int(q_lora),
            "architecture/mla/kv_lora_rank": int(require(config, "kv_lora_rank")),
            "architecture/mla/qk_nope_head_dim": int(require(config, "qk_nope_head_dim")),
            "architecture/mla/qk_rope_head_dim": int(require(config, "qk_rope_head_dim")),
            "architecture/mla/v_head_dim": int(require(config, "v_head_dim")),
            "architecture/mla/rope_interleave": bool(config.get("rope_interleave", True)),
            "architecture/mla/mscale_all_dim": mscale_all_dim,
            "architecture/moe/n_experts": int(config.get("n_routed_experts") or require(config, "num_local_experts")),
            "architecture/moe/top_k": int(require(config, "num_experts_per_tok")),
            "architecture/moe/expert_hidden": int(require(config, "moe_intermediate_size")),
            "architecture/moe/n_shared": int(shared),
            "architecture/moe/router": "sigmoid",
            "architecture/moe/norm_topk_prob": bool(hf_default(config, "norm_topk_prob")),
            "architecture/moe/first_k_dense": int(hf_default(config, "first_k_dense_replace") or 0),
            "architecture/moe/n_group": int(hf_default(config, "n_group") or 1),
            "architecture/moe/topk_group": int(hf_default(config, "topk_group") or 1),
            "architecture/moe/routed_scaling_factor": float(hf_default(config, "routed_scaling_factor")),
            "architecture/mtp_depth": int(hf_default(config, "num_nextn_predict_layers") or 0),
        }

    def checkpoint_keys(self, keys: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
        """No multi-token prediction when the checkpoint holds none of its layers (``save_pretrained`` of
        transformers' model keeps ``num_nextn_predict_layers`` but writes no such tensor)."""
        first = f"model.layers.{keys['architecture/n_layers']}."
        if keys["architecture/mtp_depth"] and not any(name.startswith(first) for name in names):
            return {**keys, "architecture/mtp_depth": 0}
        return keys

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """The multi-token-prediction layers ``config.json`` declares (``model.layers.<n>`` for
        ``num_hidden_layers`` <= n < ``num_hidden_layers + num_nextn_predict_layers``) that the model
        leaves out: ``architecture/mtp_depth`` set lower at import."""
        n_layers = int(config.get("num_hidden_layers") or 0)
        extra = int(hf_default(config, "num_nextn_predict_layers") or 0)
        index = name.split(".")[2] if name.startswith("model.layers.") else ""
        return index.isdigit() and n_layers <= int(index) < n_layers + extra

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            maps += layer_maps(arch, i)
        maps += head_maps(arch)
        for depth in range(1, mtp_depth(arch) + 1):
            maps += mtp_maps(arch, depth)
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        mla, moe = latent_of(arch), sigmoid_mixture(self.model_type, arch)
        if arch.feed_forward.activation != "swiglu":
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "biases")
        if arch.attention.sliding_window is not None:
            raise cannot(self.model_type, f"architecture/sliding_window={arch.attention.sliding_window}")
        if arch.position.scaling.kind not in ("none", "linear", "llama3", "yarn"):
            raise cannot(self.model_type, f"architecture/rope_scaling={arch.position.scaling.kind}")
        rope = rope_config(arch)
        if rope["rope_scaling"] is not None and mla.mscale_all_dim:
            rope["rope_parameters"]["mscale_all_dim"] = mla.mscale_all_dim
        return {
            "hidden_size": arch.n_embd,
            "intermediate_size": arch.feed_forward.d_ff,
            "num_hidden_layers": arch.n_layers,
            "num_attention_heads": arch.attention.n_heads,
            "num_key_value_heads": arch.attention.n_heads,
            "max_position_embeddings": arch.block_size,
            "rms_norm_eps": arch.norm.eps,
            "hidden_act": "silu",
            "attention_bias": False,
            "attention_dropout": 0.0,
            **rope,
            "rope_interleave": mla.rope_interleave,
            "q_lora_rank": mla.q_lora_rank or None,
            "kv_lora_rank": mla.kv_lora_rank,
            "qk_nope_head_dim": mla.qk_nope_head_dim,
            "qk_rope_head_dim": mla.qk_rope_head_dim,
            "v_head_dim": mla.v_head_dim,
            **mixture_config(moe),
            "num_nextn_predict_layers": mtp_depth(arch),
            "output_router_logits": False,
        }

    def peft_layer_prefix(self, layer: int) -> str:
        return f"model.layers.{layer}."

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """Latent attention's modules (:class:`~theseus.model.layers.latent_attention.LatentAttention`): the
        query's ``q_b_proj`` (``q_proj`` without the bottleneck), ``kv_b_proj`` holding each head's key then
        value rows, ``o_proj``."""
        query = "self_attn.q_b_proj" if latent_of(arch).q_lora_rank else "self_attn.q_proj"
        modules = {"query": query, "out": "self_attn.o_proj"}
        return PeftLayout(modules, {}, {"self_attn.kv_b_proj": ("key", "value")})


__all__ = [
    "DEEPSEEK_V3_CLASS",
    "DeepseekV3Family",
    "attention_maps",
    "feed_forward_maps",
    "key_value_up",
    "layer_maps",
    "mixture_config",
    "mtp_maps",
    "sigmoid_mixture",
]
