"""Granite 4 hybrid checkpoints (``GraniteMoeHybridForCausalLM``, ``model_type: granitemoehybrid``) <-> theseus'
``GraniteMoeHybrid``: the ``hf/granitemoehybrid`` family.

Layer ``i`` is ``model.layers.<i>.``: ``input_layernorm``, then per ``layer_types`` (``mamba`` or
``linear_attention``; ``attention`` or ``full_attention``) ``mamba`` (``in_proj``, the depthwise ``conv1d``
``[conv_dim, 1, conv_kernel]``, ``dt_bias``, ``A_log``, ``D``, the gated group ``norm``, ``out_proj``) or
``self_attn`` (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), then ``post_attention_layernorm``,
``block_sparse_moe`` (``router.layer`` ``[E, D]``, ``input_linear`` ``[E, 2F, D]``: each expert's gate rows then
its up rows, ``output_linear`` ``[E, D, F]``; absent with ``num_local_experts: 0``) and ``shared_mlp``
(``input_linear`` ``[2S, D]``: gate rows then up rows, ``output_linear`` ``[D, S]``); ``model.embed_tokens``,
``model.norm`` and ``lm_head``. RoPE only with ``position_embedding_type: rope``. The multipliers
(``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier``: the score scale, ``logits_scaling``:
the logits' divisor) become the model's keys. Refused in one line: another activation, another position
embedding, a sliding window and a layer kind other than Mamba-2 and attention.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from theseus.model.huggingface.family import Identity, PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import TensorMap, embedding_maps, fused, head_maps, transposed
from theseus.model.layers.attention import FULL_ATTENTION
from theseus.model.layers.mamba2 import MAMBA
from theseus.model.models.falcon_h1.hf import multiplier
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, LlamaFamily, attention_maps
from theseus.model.models.nemotron_h.hf import mamba_config, mamba_keys, mamba_maps, time_step_keys
from theseus.model.stack.architecture import Architecture

if TYPE_CHECKING:
    from theseus.model.models.granitemoehybrid.model import GraniteMoeHybridArchitecture

GRANITE_CLASS = "theseus.model.models.granitemoehybrid.model:GraniteMoeHybrid"
#: ``layer_types`` entries (transformers 5's names and the releases') -> theseus' layer kinds.
HF_KINDS = {"mamba": MAMBA, "linear_attention": MAMBA, "attention": FULL_ATTENTION, "full_attention": FULL_ATTENTION}
#: theseus' layer kinds -> the ``layer_types`` entries the export writes (the releases' names, which transformers 5
#: reads as ``linear_attention`` and ``full_attention``).
EXPORT_KINDS = {MAMBA: "mamba", FULL_ATTENTION: "attention"}
#: transformers' ``GraniteMoeHybridConfig`` defaults of the fields a ``config.json`` may leave out.
DEFAULTS: dict[str, Any] = {
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "shared_intermediate_size": 1024,
    "router_aux_loss_coef": 0.001,
    "rms_norm_eps": 1e-6,
}
#: theseus' ``architecture/mamba_*`` keys -> Granite's ``config.json`` fields (the heads and their width are
#: read by :func:`~theseus.model.models.falcon_h1.hf.mamba_shape`).
MAMBA_FIELDS = {
    "mamba_state_size": "mamba_d_state",
    "mamba_groups": "mamba_n_groups",
    "mamba_conv_kernel": "mamba_d_conv",
    "mamba_chunk_size": "mamba_chunk_size",
    "mamba_conv_bias": "mamba_conv_bias",
    "mamba_bias": "mamba_proj_bias",
}
#: The scalar multipliers: ``config.json`` name -> theseus key.
MULTIPLIERS = {
    name: f"architecture/{name}"
    for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")
}


def read(config: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of ``config``, else transformers' default (a ``null`` reads as the default too)."""
    value = config.get(name)
    return DEFAULTS.get(name) if value is None else value


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """theseus' layer kinds of ``layer_types`` (transformers' default: every layer Mamba-2)."""
    types = config.get("layer_types") or config.get("layers_block_type")
    if not types:
        return [MAMBA] * int(require(config, "num_hidden_layers"))
    unknown = sorted(set(types) - set(HF_KINDS))
    if unknown:
        raise unsupported("layer_types", unknown, f"supported: {', '.join(HF_KINDS)}")
    return [HF_KINDS[t] for t in types]


def mamba_shape(config: Mapping[str, Any]) -> tuple[int, int]:
    """``(heads, head width)`` of the Mamba-2 mixers, ``mamba_n_heads`` heads making ``mamba_expand *
    hidden_size`` (``mamba_d_head`` auto: that over the heads)."""
    heads = int(read(config, "mamba_n_heads"))
    inner = int(read(config, "mamba_expand")) * int(require(config, "hidden_size"))
    head_dim = read(config, "mamba_d_head")
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    if head_dim * heads != inner:
        raise unsupported("mamba_d_head", head_dim, f"mamba_n_heads={heads} heads of it must make {inner}")
    return heads, head_dim


def check(config: Mapping[str, Any]) -> None:
    """What the model does not compute, refused in one line each."""
    if config.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", config["hidden_act"], "supported: silu")
    kind = config.get("position_embedding_type")
    if kind not in (None, "nope", "rope"):
        raise unsupported("position_embedding_type", kind, "supported: rope, nope or null")
    if config.get("sliding_window") is not None:
        raise unsupported("sliding_window", config["sliding_window"], "Granite's attention has no window")
    if config.get("mlp_bias"):
        raise unsupported("mlp_bias", True, "Granite's MLPs have no biases")


def mixture_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``architecture/moe/*`` keys: softmax routing over the top-k logits (the renormalised top-k of the
    softmax) and one shared MLP of ``shared_intermediate_size``; ``num_local_experts`` 0: none."""
    experts = int(read(config, "num_local_experts"))
    if experts < 0:
        raise unsupported("num_local_experts", experts, "expected 0 or more")
    if experts == 0:
        return {"architecture/moe/n_experts": 0}
    return {
        "architecture/moe/n_experts": experts,
        "architecture/moe/top_k": int(read(config, "num_experts_per_tok")),
        "architecture/moe/expert_hidden": int(require(config, "intermediate_size")),
        "architecture/moe/n_shared": 1,
        "architecture/moe/shared_hidden": int(read(config, "shared_intermediate_size")),
        "architecture/moe/router": "softmax",
        "architecture/moe/norm_topk_prob": True,
        "architecture/moe/first_k_dense": 0,
        "architecture/moe/aux_loss": float(read(config, "router_aux_loss_coef")),
    }


def expert_linear(hf: str, path: tuple[str, ...], shape: tuple[int, int, int]) -> TensorMap:
    """Stacked ``nn.Linear`` weights ``[E, out, in]`` <-> theseus' stacked kernels ``[E, in, out]``."""
    return TensorMap(hf, shape, (path,), lambda w: [w.transpose(0, 2, 1)], lambda a: np.transpose(a[0], (0, 2, 1)))


def swiglu_input(hf: str, path: tuple[str, ...], width: int, n_embd: int) -> TensorMap:
    """A fused ``input_linear`` ``[2 * width, n_embd]`` (the gate rows, then the up rows) <-> the MLP's
    ``gate`` and ``up`` kernels at ``path``."""
    parts = [transposed(hf, (*path, name, "kernel"), width, n_embd) for name in ("gate", "up")]
    return fused(hf, parts)


class GraniteMoeHybridFamily(LlamaFamily):
    """``model_type: granitemoehybrid``."""

    identity: ClassVar[Identity] = Identity("granitemoehybrid", "GraniteMoeHybridForCausalLM", GRANITE_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES
    #: A Mamba-2 layer's adapted projection -> its PEFT module. PEFT refuses LoRA on a Mamba model's
    #: ``out_proj``, so an ``out_proj`` adapter (target ``out``) has no module and the export refuses it.
    mamba_peft_modules: ClassVar[Mapping[str, str]] = {"in_proj": "mamba.in_proj"}

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """Each layer's mixer (the attention layers' four projections, the Mamba-2 layers' ``in_proj``) and,
        without experts, the shared MLP (``input_linear`` holds the gate and up adapters' rows, ``down`` is
        ``output_linear``); a mixture's experts take no adapters."""
        kind = (arch.layer_types or (FULL_ATTENTION,) * arch.n_layers)[layer]
        modules = dict(self.mamba_peft_modules if kind == MAMBA else self.peft_modules)
        if arch.moe is not None:
            return PeftLayout(modules, {}, {})
        return PeftLayout(
            {**modules, "down": "shared_mlp.output_linear"}, {"shared_mlp.input_linear": ("gate", "up")}, {}
        )

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        check(config)
        keys = super().keys({**config, "intermediate_size": int(read(config, "shared_intermediate_size"))})
        keys.pop("architecture/sliding_window", None)
        keys["architecture/norm_eps"] = float(read(config, "rms_norm_eps"))
        heads, head_dim = mamba_shape(config)
        keys.update(
            {
                "architecture/layer_types": layer_types(config),
                "architecture/mamba_heads": heads,
                "architecture/mamba_head_dim": head_dim,
                **mamba_keys(MAMBA_FIELDS, lambda name: read(config, name)),
                **time_step_keys(config),
                **mixture_keys(config),
                **{ours: multiplier(config, name) for name, ours in MULTIPLIERS.items()},
            }
        )
        return keys

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RoPE as Llama's with ``position_embedding_type: rope``; none otherwise."""
        if config.get("position_embedding_type") != "rope":
            return {"architecture/rotary": False}
        return {**super().rope(config), "architecture/rotary": True}

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No sliding window (refused by :func:`check`): ``layer_types`` name the Mamba-2 and attention layers."""
        return None

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        spec = granite_arch(self.model_type, arch).mamba
        e = arch.n_embd
        maps = embedding_maps(arch)
        for i, kind in enumerate(arch.layer_types or ()):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            maps += self.layer_norm_maps(arch, i)
            if kind == MAMBA:
                maps += mamba_maps(spec, e, hf + "mamba.", (ours, "attn"))
            else:
                maps += attention_maps(arch, i)
            maps += self.feed_forward_maps(arch, hf, (ours, "mlp"))
        return maps + head_maps(arch)

    def feed_forward_maps(self, arch: Architecture, hf: str, ours: tuple[str, ...]) -> list[TensorMap]:
        """One layer's mixture (``block_sparse_moe``) and shared MLP (``shared_mlp``), or the shared MLP alone as
        the dense MLP."""
        e, moe = arch.n_embd, arch.moe
        if moe is None:
            shared, path = arch.feed_forward.d_ff, ours
            maps = []
        else:
            n, f = moe.n_experts, moe.expert_hidden
            shared, path = moe.shared_width, (*ours, "shared")
            joined = hf + "block_sparse_moe.input_linear.weight"
            gate_up = [expert_linear(joined, (*ours, name), (n, f, e)) for name in ("gate", "up")]
            maps = [
                transposed(hf + "block_sparse_moe.router.layer.weight", (*ours, "router"), n, e),
                fused(joined, gate_up, axis=1),
                expert_linear(hf + "block_sparse_moe.output_linear.weight", (*ours, "down"), (n, e, f)),
            ]
        return [
            *maps,
            swiglu_input(hf + "shared_mlp.input_linear.weight", path, shared, e),
            transposed(hf + "shared_mlp.output_linear.weight", (*path, "down", "kernel"), e, shared),
        ]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        granite = granite_arch(self.model_type, arch)
        if arch.attention.qk_norm:
            raise cannot(self.model_type, "query/key norms")
        if arch.position.kind not in ("rope", "none") or arch.position.scaling.kind != "none":
            raise cannot(self.model_type, f"position embeddings {arch.position.kind} with scaling")
        if arch.feed_forward.bias or arch.attention.qkv_bias != arch.attention.has_out_bias:
            raise cannot(self.model_type, "MLP biases or different query/key/value and output biases")
        spec, inner = granite.mamba, granite.mamba.n_heads * granite.mamba.head_dim
        if inner % arch.n_embd:
            raise cannot(self.model_type, f"Mamba-2 mixers {inner} wide (a whole multiple of n_embd={arch.n_embd})")
        config = super().config(arch, settings)
        config.pop("sliding_window", None)
        config.pop("mlp_bias", None)
        return {
            **config,
            **self.mixture_config(arch),
            "layer_types": [EXPORT_KINDS[t] for t in arch.layer_types or ()],
            "position_embedding_type": "rope" if arch.position.kind == "rope" else "nope",
            "mamba_expand": inner // arch.n_embd,
            **mamba_config(spec, {**MAMBA_FIELDS, "mamba_heads": "mamba_n_heads", "mamba_head_dim": "mamba_d_head"}),
            "embedding_multiplier": arch.embedding_multiplier,
            "residual_multiplier": arch.residual_multiplier,
            "attention_multiplier": attention_scale(arch),
            "logits_scaling": 1.0 / arch.logits_multiplier,
        }

    def mixture_config(self, arch: Architecture) -> dict[str, Any]:
        """The mixture's ``config.json`` fields: Granite's routing and one shared MLP, or none."""
        moe = arch.moe
        if moe is None:
            return {"num_local_experts": 0, "shared_intermediate_size": arch.feed_forward.d_ff}
        routing = (moe.router, moe.norm_topk_prob, moe.n_shared, moe.first_k_dense, moe.n_group)
        if routing != ("softmax", True, 1, 0, 1) or moe.routed_scaling_factor != 1.0:
            raise cannot(self.model_type, "a mixture other than Granite's (softmax, renormalised, one shared MLP)")
        return {
            "intermediate_size": moe.expert_hidden,
            "num_local_experts": moe.n_experts,
            "num_experts_per_tok": moe.top_k,
            "shared_intermediate_size": moe.shared_width,
            "router_aux_loss_coef": moe.aux_loss,
            "output_router_logits": False,
        }


def granite_arch(model_type: str, arch: Architecture) -> GraniteMoeHybridArchitecture:
    """``arch`` as a ``GraniteMoeHybridArchitecture``, or one line refusing it."""
    from theseus.model.models.granitemoehybrid.model import GraniteMoeHybridArchitecture

    if not isinstance(arch, GraniteMoeHybridArchitecture):
        raise cannot(model_type, "a model without Granite's Mamba-2 and attention layers")
    return arch


def attention_scale(arch: Architecture) -> float:
    """The attention's score scale: ``query_pre_attn_scalar ** -0.5``, else ``head_dim ** -0.5``."""
    scalar = arch.attention.query_pre_attn_scalar
    return float(scalar) ** -0.5 if scalar is not None else float(arch.head_dim) ** -0.5


__all__ = ["GRANITE_CLASS", "GraniteMoeHybridFamily", "attention_scale"]
