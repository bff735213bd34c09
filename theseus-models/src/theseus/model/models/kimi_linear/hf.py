"""Kimi Linear checkpoints (``KimiLinearForCausalLM``, ``model_type: kimi_linear``) <-> theseus' ``KimiLinear``:
the ``hf/kimi_linear`` family.

Per layer, by ``layer_types``: a ``full_attention`` layer's ``self_attn`` is DeepSeek-V3's latent attention
(``q_proj``, or ``q_a_proj`` / ``q_a_layernorm`` / ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
``kv_b_proj``, ``o_proj``), without RoPE; a ``linear_attention`` layer's ``self_attn`` is Kimi Delta Attention:
``q_proj`` / ``k_proj`` / ``v_proj``, their convolutions ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d`` (transformers
joins them into one ``conv1d``), the forget gate's ``f_a_proj`` / ``f_b_proj`` with ``dt_bias`` ``[heads *
head_dim]`` and ``A_log`` ``[1, 1, heads, 1]``, ``b_proj``, the output gate's ``g_a_proj`` / ``g_b_proj``,
``o_norm`` and ``o_proj``.

The feed-forwards are stored under ``block_sparse_moe.`` (the releases' mixtures and everything
``save_pretrained`` writes; the releases' dense first layers are ``mlp.``, which import reads the same): a dense
layer's ``gate_proj`` / ``up_proj`` / ``down_proj``, a mixture's router ``gate.weight`` and its
``gate.e_score_correction_bias`` (theseus' ``router_bias``), the experts ``experts.<j>.w1`` (gate) / ``w3`` (up)
/ ``w2`` (down) and ``shared_experts.*_proj``.

``config.json``: the releases nest the linear layers' shape in ``linear_attn_config`` (``num_heads``,
``head_dim``, ``short_conv_kernel_size``, ``full_attn_layers`` / ``kda_layers`` counted from 1) and name the
mixture's fields ``num_experts``, ``num_experts_per_token``, ``num_shared_experts``, ``moe_renormalize``,
``num_expert_group``; transformers' own names (``linear_num_heads``, ``layer_types``, ``mlp_layer_types``,
``num_local_experts``, ...) are read as well. Export writes transformers' flat fields.

PEFT adapters: a latent-attention layer's are DeepSeek-V3's (``q_proj`` / ``q_b_proj``, ``kv_b_proj``,
``o_proj``); a Kimi Delta Attention layer's ``query`` / ``key`` / ``value`` / ``out`` are ``self_attn.q_proj`` /
``k_proj`` / ``v_proj`` / ``o_proj``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import HFFamily, Identity, PeftLayout, cannot, expect, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    heads_in,
    heads_out,
    same,
    transposed,
)
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION
from theseus.model.models.deepseek_v3.hf import (
    DeepseekV3Family,
    attention_maps,
    feed_forward_maps,
    latent_of,
    sigmoid_mixture,
)
from theseus.model.models.olmo_hybrid.hf import qkv_conv_map
from theseus.model.stack.architecture import Architecture

KIMI_LINEAR_CLASS = "theseus.model.models.kimi_linear.model:KimiLinear"
#: A Kimi Delta Attention layer's PEFT modules.
KDA_PEFT_MODULES = {
    "query": "self_attn.q_proj",
    "key": "self_attn.k_proj",
    "value": "self_attn.v_proj",
    "out": "self_attn.o_proj",
}
#: transformers' ``KimiLinearConfig`` defaults (Kimi-Linear-48B-A3B's) for the fields a config.json may omit.
HF_DEFAULTS: dict[str, Any] = {
    "rms_norm_eps": 1e-5,
    "q_lora_rank": None,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "moe_intermediate_size": 1024,
    "routed_scaling_factor": 2.446,
    "topk_group": 1,
    "linear_num_heads": 32,
    "linear_head_dim": 128,
    "linear_conv_kernel_dim": 4,
}
#: Each mixture field: its names in config.json (the releases', then transformers') and the default.
MOE_FIELDS: dict[str, tuple[tuple[str, ...], Any]] = {
    "n_experts": (("num_experts", "num_local_experts", "n_routed_experts"), 256),
    "top_k": (("num_experts_per_token", "num_experts_per_tok"), 8),
    "n_shared": (("num_shared_experts", "n_shared_experts"), 1),
    "norm_topk_prob": (("moe_renormalize", "norm_topk_prob"), True),
    "n_group": (("num_expert_group", "n_group"), 1),
}
#: Fields whose other values transformers' Kimi Linear does not compute either: (field, the value, why).
REFUSED = (
    ("tie_word_embeddings", False, "Kimi Linear's head is untied"),
    ("moe_router_activation_func", "sigmoid", "Kimi Linear routes by sigmoid scores"),
    ("mla_use_nope", True, "Kimi Linear's latent attention has no position embedding"),
)
#: The experts' stored projection names.
EXPERT_NAMES = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}


def first(config: Mapping[str, Any], names: tuple[str, ...], default: Any) -> Any:
    """The first of ``names`` that ``config`` holds (not null), else ``default``."""
    return next((config[n] for n in names if config.get(n) is not None), default)


def linear_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """``linear_attn_config``'s fields (the releases) over transformers' flat ones."""
    nested = config.get("linear_attn_config") or {}
    if not isinstance(nested, Mapping):
        raise unsupported("linear_attn_config", nested, "expected a mapping")
    names = {
        "num_heads": "linear_num_heads",
        "head_dim": "linear_head_dim",
        "short_conv_kernel_size": "linear_conv_kernel_dim",
    }
    flat = {ours: config.get(ours, HF_DEFAULTS[ours]) for ours in names.values()}
    return {**flat, **{names[k]: v for k, v in nested.items() if k in names}}


def layer_types(config: Mapping[str, Any], n_layers: int) -> list[str]:
    """``layer_types``; else ``linear_attn_config``'s ``full_attn_layers`` / ``kda_layers`` (from 1); else
    transformers' default (layers 4, 8, ... from 0 full attention)."""
    from theseus.model.models.kimi_linear.model import default_layer_types, full_at

    nested = config.get("linear_attn_config") or {}
    types = config.get("layer_types")
    if types is None and "full_attn_layers" in nested and "kda_layers" in nested:
        full = tuple(int(i) - 1 for i in nested["full_attn_layers"])
        types = list(full_at(n_layers, full))
        if sorted([*full, *(int(i) - 1 for i in nested["kda_layers"])]) != list(range(n_layers)):
            raise unsupported(
                "linear_attn_config.kda_layers", nested["kda_layers"], "with full_attn_layers, each layer once"
            )
    types = list(default_layer_types(n_layers)) if types is None else list(types)
    if len(types) != n_layers or not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
        raise unsupported("layer_types", types, f"expected {n_layers} of linear_attention / full_attention")
    return types


def first_dense(config: Mapping[str, Any], n_layers: int) -> int:
    """How many leading layers are dense: ``mlp_layer_types`` (dense layers first, then sparse ones), else
    ``first_k_dense_replace`` (default 1)."""
    kinds = config.get("mlp_layer_types")
    if kinds is None:
        return int(config.get("first_k_dense_replace", 1) or 0)
    dense = sum(1 for kind in kinds if kind == "dense")
    if len(kinds) != n_layers or list(kinds) != ["dense"] * dense + ["sparse"] * (n_layers - dense):
        raise unsupported("mlp_layer_types", kinds, "theseus' mixtures need the dense layers first, then sparse ones")
    return dense


def stored_name(name: str) -> str:
    """A feed-forward tensor's name as Kimi Linear stores it: under ``block_sparse_moe.``, the experts' projections
    ``w1`` / ``w3`` / ``w2``."""
    name = re.sub(r"^(model\.layers\.\d+)\.mlp\.", r"\1.block_sparse_moe.", name)
    return re.sub(r"(\.experts\.\d+\.)(\w+_proj)\.", lambda m: f"{m[1]}{EXPERT_NAMES[m[2]]}.", name)


class KimiLinearFamily(HFFamily):
    """``model_type: kimi_linear``."""

    identity: ClassVar[Identity] = Identity("kimi_linear", "KimiLinearForCausalLM", KIMI_LINEAR_CLASS)

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "hidden_act", "silu")
        expect(config, "attention_bias", False)
        for field, allowed, why in REFUSED:
            if config.get(field, allowed) != allowed:
                raise unsupported(field, config[field], why)
        n_layers, n_heads = int(require(config, "num_hidden_layers")), int(require(config, "num_attention_heads"))
        n_kv = config.get("num_key_value_heads")
        if n_kv is not None and int(n_kv) != n_heads:
            raise unsupported("num_key_value_heads", n_kv, f"latent attention has one key/value per head ({n_heads})")
        moe = {key: first(config, names, default) for key, (names, default) in MOE_FIELDS.items()}
        if not moe["n_shared"]:
            raise unsupported("num_shared_experts", moe["n_shared"], "Kimi Linear's mixtures have shared experts")
        linear = linear_fields(config)

        def get(name: str) -> Any:
            return config.get(name, HF_DEFAULTS[name])

        q_lora = get("q_lora_rank")
        return {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/n_layers": n_layers,
            "architecture/n_heads": n_heads,
            "architecture/n_embd": int(require(config, "hidden_size")),
            "architecture/d_ff": int(require(config, "intermediate_size")),
            "architecture/activation": "swiglu",
            "architecture/norm_eps": float(get("rms_norm_eps")),
            "architecture/tied_embeddings": False,
            "architecture/dropout": 0.0,
            "architecture/block_size": int(first(config, ("model_max_length", "max_position_embeddings"), 1048576)),
            "architecture/layer_types": layer_types(config, n_layers),
            "architecture/linear_num_heads": int(linear["linear_num_heads"]),
            "architecture/linear_head_dim": int(linear["linear_head_dim"]),
            "architecture/linear_conv_kernel_dim": int(linear["linear_conv_kernel_dim"]),
            "architecture/mla/q_lora_rank": 0 if q_lora is None else int(q_lora),
            "architecture/mla/kv_lora_rank": int(get("kv_lora_rank")),
            "architecture/mla/qk_nope_head_dim": int(get("qk_nope_head_dim")),
            "architecture/mla/qk_rope_head_dim": int(get("qk_rope_head_dim")),
            "architecture/mla/v_head_dim": int(get("v_head_dim")),
            "architecture/moe/n_experts": int(moe["n_experts"]),
            "architecture/moe/top_k": int(moe["top_k"]),
            "architecture/moe/expert_hidden": int(get("moe_intermediate_size")),
            "architecture/moe/n_shared": int(moe["n_shared"]),
            "architecture/moe/router": "sigmoid",
            "architecture/moe/norm_topk_prob": bool(moe["norm_topk_prob"]),
            "architecture/moe/first_k_dense": first_dense(config, n_layers),
            "architecture/moe/n_group": int(moe["n_group"]),
            "architecture/moe/topk_group": int(get("topk_group") or 1),
            "architecture/moe/routed_scaling_factor": float(get("routed_scaling_factor")),
        }

    def canonical_name(self, name: str) -> str:
        """The releases' dense ``mlp.`` tensors under ``block_sparse_moe.``, as ``save_pretrained`` writes them."""
        return re.sub(r"^(model\.layers\.\d+)\.mlp\.", r"\1.block_sparse_moe.", name)

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        from theseus.model.models.kimi_linear.model import KimiLinearArchitecture

        if not isinstance(arch, KimiLinearArchitecture):
            raise cannot(self.model_type, "a model without Kimi Linear's layers")
        maps = embedding_maps(arch)
        for i, kind in enumerate(arch.layer_types or ()):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            maps.append(same(hf + "input_layernorm.weight", (ours, "attn_norm", "scale"), (arch.n_embd,)))
            maps += attention_maps(arch, i) if kind == FULL_ATTENTION else kda_maps(arch, i)
            maps.append(same(hf + "post_attention_layernorm.weight", (ours, "mlp_norm", "scale"), (arch.n_embd,)))
            maps += [dataclasses.replace(m, hf=stored_name(m.hf)) for m in feed_forward_maps(arch, i)]
        return maps + head_maps(arch)

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.kimi_linear.model import KimiLinearArchitecture

        if not isinstance(arch, KimiLinearArchitecture):
            raise cannot(self.model_type, "a model without Kimi Linear's layers")
        if arch.tied_embeddings:
            raise cannot(self.model_type, "a tied head (architecture/tied_embeddings=true)")
        if arch.position.kind != "none":
            raise cannot(self.model_type, "rotary positions (its latent attention is NoPE)")
        mla, moe = latent_of(arch), sigmoid_mixture(self.model_type, arch)
        if arch.feed_forward.activation != "swiglu":
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "biases")
        if arch.attention.sliding_window is not None:
            raise cannot(self.model_type, f"architecture/sliding_window={arch.attention.sliding_window}")
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
            "q_lora_rank": mla.q_lora_rank or None,
            "kv_lora_rank": mla.kv_lora_rank,
            "qk_nope_head_dim": mla.qk_nope_head_dim,
            "qk_rope_head_dim": mla.qk_rope_head_dim,
            "v_head_dim": mla.v_head_dim,
            "num_local_experts": moe.n_experts,
            "num_experts_per_tok": moe.top_k,
            "moe_intermediate_size": moe.expert_hidden,
            "n_shared_experts": moe.n_shared,
            "norm_topk_prob": moe.norm_topk_prob,
            "n_group": moe.n_group,
            "topk_group": moe.topk_group,
            "routed_scaling_factor": moe.routed_scaling_factor,
            "layer_types": list(arch.layer_types or ()),
            "mlp_layer_types": ["dense" if i < moe.first_k_dense else "sparse" for i in range(arch.n_layers)],
            "linear_num_heads": arch.linear_heads,
            "linear_head_dim": arch.linear_head_dim,
            "linear_conv_kernel_dim": arch.conv_kernel,
            "output_router_logits": False,
            "pad_token_id": None,  # KimiLinearConfig's default (163839) may be past the vocabulary
        }

    def peft_layer_prefix(self, layer: int) -> str:
        return f"model.layers.{layer}."

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """A latent-attention layer's modules are DeepSeek-V3's; a Kimi Delta Attention layer's are
        :data:`KDA_PEFT_MODULES`."""
        if (arch.layer_types or ())[layer] == LINEAR_ATTENTION:
            return PeftLayout(dict(KDA_PEFT_MODULES), {}, {})
        return DeepseekV3Family().peft_layout(arch, layer)


def kda_maps(arch: Any, layer: int) -> list[TensorMap]:
    """One Kimi Delta Attention layer's tensors (``model.layers.<layer>.self_attn.*`` <-> ``blocks_<layer>/attn``)."""
    e, h, d = arch.n_embd, arch.linear_heads, arch.linear_head_dim
    hf, attn = f"model.layers.{layer}.self_attn.", (f"blocks_{layer}", "attn")

    def low_rank(name: str, ours: str) -> list[TensorMap]:
        return [
            transposed(f"{hf}{name}_a_proj.weight", (*attn, f"{ours}_down"), d, e),
            heads_in(f"{hf}{name}_b_proj.weight", (*attn, f"{ours}_up"), d, h, d),
        ]

    a_log = TensorMap(
        hf + "A_log", (1, 1, h, 1), ((*attn, "A_log"),), lambda w: [w.reshape(h)], lambda a: a[0].reshape(1, 1, h, 1)
    )
    dt_bias = TensorMap(
        hf + "dt_bias", (h * d,), ((*attn, "dt_bias"),), lambda w: [w.reshape(h, d)], lambda a: a[0].reshape(-1)
    )
    return [
        *(
            heads_in(f"{hf}{p}_proj.weight", (*attn, name), e, h, d)
            for p, name in zip("qkv", ("query", "key", "value"), strict=True)
        ),
        qkv_conv_map(hf, attn, arch.conv_kernel, (h, d), (h, d)),
        *low_rank("f", "f"),
        dt_bias,
        a_log,
        transposed(hf + "b_proj.weight", (*attn, "b"), h, e),
        *low_rank("g", "g"),
        same(hf + "o_norm.weight", (*attn, "norm", "scale"), (d,)),
        heads_out(hf + "o_proj.weight", (*attn, "out"), e, h, d),
    ]


__all__ = ["KDA_PEFT_MODULES", "KIMI_LINEAR_CLASS", "KimiLinearFamily", "kda_maps", "layer_types"]
