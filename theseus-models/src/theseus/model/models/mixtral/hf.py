"""Mixtral checkpoints (``MixtralForCausalLM``) <-> theseus' ``Mixtral``: the ``hf/mixtral`` family.

Llama's attention and norms; each layer's ``block_sparse_moe`` holds the router ``gate`` and the
experts one tensor each (``experts.<j>.w1`` gate, ``w3`` up, ``w2`` down), as ``save_pretrained``
writes them. theseus stacks the experts of a layer on the leading ``expert`` axis
(:func:`theseus.model.huggingface.names.stacked_slice`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, cannot, expect, require, unsupported
from theseus.model.huggingface.names import TensorMap, stacked_slice, transposed
from theseus.model.layers.moe import MoESpec
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, LlamaFamily
from theseus.model.stack.architecture import Architecture

MIXTRAL_CLASS = "theseus.model.models.mixtral.model:Mixtral"


def expert_maps(
    arch: Architecture, layer: int, prefix: str, router: str, projections: Mapping[str, str]
) -> list[TensorMap]:
    """The mixture tensors of layer ``layer``: ``<prefix><router>.weight`` ``[E, embed]`` and
    ``<prefix>experts.<j>.<name>.weight`` for each theseus kernel (``gate`` / ``up`` / ``down``) named in
    ``projections`` (theseus name -> checkpoint name)."""
    moe = mixture(arch)
    e, f, d, ours = moe.n_experts, moe.expert_hidden, arch.n_embd, (f"blocks_{layer}", "mlp")
    maps = [transposed(f"{prefix}{router}.weight", (*ours, "router"), e, d)]
    for j in range(e):
        for name, hf_name in projections.items():
            out_features, in_features = (d, f) if name == "down" else (f, d)
            hf = f"{prefix}experts.{j}.{hf_name}.weight"
            maps.append(stacked_slice(j, transposed(hf, (*ours, name), out_features, in_features)))
    return maps


def mixture(arch: Architecture) -> MoESpec:
    if arch.moe is None:
        raise cannot("mixture-of-experts", "a dense model")
    return arch.moe


def without_dense_mlp(maps: list[TensorMap], arch: Architecture) -> list[TensorMap]:
    """``maps`` less the dense MLP tensors of the mixture layers (``model.layers.<i>.mlp.*_proj``)."""
    first = mixture(arch).first_k_dense
    kept = []
    for entry in maps:
        parts = entry.hf.split(".")
        is_mlp = len(parts) > 4 and parts[:2] == ["model", "layers"] and parts[3] == "mlp"
        if not (is_mlp and int(parts[2]) >= first):
            kept.append(entry)
    return kept


def check_routing(family: str, moe: MoESpec, *, normalised: bool | None) -> None:
    """Refuse what a softmax-routed checkpoint cannot express (``normalised``: the top-k weights must be
    renormalised, or None when the checkpoint says either)."""
    if moe.router != "softmax" or moe.n_group > 1 or moe.routed_scaling_factor != 1.0:
        raise cannot(family, f"architecture/moe/router={moe.router} with groups or a routed scaling factor")
    if moe.n_shared:
        raise cannot(family, f"architecture/moe/n_shared={moe.n_shared} (shared experts)")
    if normalised is not None and moe.norm_topk_prob != normalised:
        raise cannot(family, f"architecture/moe/norm_topk_prob={moe.norm_topk_prob}")


def softmax_mixture_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """The ``architecture/moe/*`` keys of a softmax-routed mixture in every layer, renormalised top-k and no
    shared experts (Mixtral, GPT-OSS): experts, top-k and expert width from ``config.json``."""
    experts = int(require(config, "num_local_experts"))
    if experts < 1:
        raise unsupported("num_local_experts", experts, "a mixture needs at least one expert")
    return {
        "architecture/moe/n_experts": experts,
        "architecture/moe/top_k": int(require(config, "num_experts_per_tok")),
        "architecture/moe/expert_hidden": int(require(config, "intermediate_size")),
        "architecture/moe/norm_topk_prob": True,
        "architecture/moe/router": "softmax",
        "architecture/moe/n_shared": 0,
        "architecture/moe/first_k_dense": 0,
    }


def softmax_mixture(family: str, arch: Architecture) -> MoESpec:
    """The mixture of ``arch``, refused in one line unless :func:`softmax_mixture_keys` can describe it."""
    moe = mixture(arch)
    check_routing(family, moe, normalised=True)
    if moe.first_k_dense:
        raise cannot(family, f"architecture/moe/first_k_dense={moe.first_k_dense} (dense layers)")
    return moe


class MixtralFamily(LlamaFamily):
    """``model_type: mixtral``."""

    identity: ClassVar[Identity] = Identity("mixtral", "MixtralForCausalLM", MIXTRAL_CLASS)
    holds_window: ClassVar[bool] = True
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "router_jitter_noise", 0.0)
        keys = super().keys(config)
        keys.update(softmax_mixture_keys(config))
        return keys

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "architecture/attention_bias": False,
            "architecture/attention_out_bias": False,
            "architecture/mlp_bias": False,
        }

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = without_dense_mlp(super().tensor_maps(arch), arch)
        for i in range(arch.n_layers):
            prefix = f"model.layers.{i}.block_sparse_moe."
            maps.extend(expert_maps(arch, i, prefix, "gate", {"gate": "w1", "up": "w3", "down": "w2"}))
        return maps

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = softmax_mixture(self.model_type, arch)
        config = super().config(arch, settings)
        config.update(
            {
                "intermediate_size": moe.expert_hidden,
                "num_local_experts": moe.n_experts,
                "num_experts_per_tok": moe.top_k,
                "router_jitter_noise": 0.0,
                "output_router_logits": False,
                "router_aux_loss_coef": moe.aux_loss,
            }
        )
        return config

    def check_biases(self, arch: Architecture) -> None:
        if arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "biases")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"sliding_window": arch.attention.sliding_window}


__all__ = [
    "MIXTRAL_CLASS",
    "MixtralFamily",
    "check_routing",
    "expert_maps",
    "mixture",
    "softmax_mixture",
    "softmax_mixture_keys",
    "without_dense_mlp",
]
