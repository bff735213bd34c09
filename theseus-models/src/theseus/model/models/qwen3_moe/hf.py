"""Qwen3-MoE checkpoints (``Qwen3MoeForCausalLM``) <-> theseus' ``Qwen3MoE``: the ``hf/qwen3_moe`` family.

Qwen3's attention (per-head ``q_norm`` / ``k_norm``) and norms; each mixture layer's ``mlp`` holds the
router ``gate`` and the experts one tensor each (``experts.<j>.gate_proj`` / ``up_proj`` /
``down_proj``), as ``save_pretrained`` writes them; the dense layers (``mlp_only_layers``) have
Qwen3's dense MLP. theseus expresses dense layers as the leading ``architecture/moe/first_k_dense``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, require, unsupported
from theseus.model.huggingface.names import TensorMap
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES
from theseus.model.models.mixtral.hf import (
    check_routing,
    expert_maps,
    mixture,
    without_dense_mlp,
)
from theseus.model.models.qwen3.hf import Qwen3Family
from theseus.model.stack.architecture import Architecture

QWEN3_MOE_CLASS = "theseus.model.models.qwen3_moe.model:Qwen3MoE"


def first_dense_layers(config: Mapping[str, Any]) -> int:
    """How many leading layers are dense, from ``mlp_only_layers`` and ``decoder_sparse_step``; other
    layouts (dense layers that are not a leading run) are refused in one line."""
    n_layers = int(require(config, "num_hidden_layers"))
    step = int(config.get("decoder_sparse_step", 1) or 1)
    only = set(config.get("mlp_only_layers") or [])
    dense = [i for i in range(n_layers) if i in only or (i + 1) % step != 0]
    if dense != list(range(len(dense))):
        field = "mlp_only_layers" if only else "decoder_sparse_step"
        value = sorted(only) if only else step
        raise unsupported(field, value, f"dense layers {dense} are not the leading layers theseus supports")
    return len(dense)


class Qwen3MoEFamily(Qwen3Family):
    """``model_type: qwen3_moe``."""

    identity: ClassVar[Identity] = Identity("qwen3_moe", "Qwen3MoeForCausalLM", QWEN3_MOE_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        experts = config.get("num_experts", config.get("num_local_experts"))
        if experts is None:
            raise unsupported("num_experts", None, "a qwen3_moe checkpoint needs its number of experts")
        keys.update(
            {
                "architecture/moe/n_experts": int(experts),
                "architecture/moe/top_k": int(require(config, "num_experts_per_tok")),
                "architecture/moe/expert_hidden": int(require(config, "moe_intermediate_size")),
                "architecture/moe/norm_topk_prob": bool(config.get("norm_topk_prob", False)),
                "architecture/moe/router": "softmax",
                "architecture/moe/n_shared": 0,
                "architecture/moe/first_k_dense": first_dense_layers(config),
            }
        )
        return keys

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = without_dense_mlp(super().tensor_maps(arch), arch)
        projections = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        for i in range(mixture(arch).first_k_dense, arch.n_layers):
            maps.extend(expert_maps(arch, i, f"model.layers.{i}.mlp.", "gate", projections))
        return maps

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = mixture(arch)
        check_routing(self.model_type, moe, normalised=None)
        config = super().config(arch, settings)
        config.update(
            {
                "num_experts": moe.n_experts,
                "num_experts_per_tok": moe.top_k,
                "moe_intermediate_size": moe.expert_hidden,
                "norm_topk_prob": moe.norm_topk_prob,
                "decoder_sparse_step": 1,
                "mlp_only_layers": list(range(moe.first_k_dense)),
                "output_router_logits": False,
                "router_aux_loss_coef": moe.aux_loss,
            }
        )
        return config


__all__ = ["QWEN3_MOE_CLASS", "Qwen3MoEFamily", "first_dense_layers"]
