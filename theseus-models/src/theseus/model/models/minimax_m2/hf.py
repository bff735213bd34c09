"""MiniMax-M2 checkpoints (``MiniMaxM2ForCausalLM``) <-> theseus' ``MiniMaxM2``: the ``hf/minimax_m2`` family.

Mixtral's layout (each layer's ``block_sparse_moe`` holds the router ``gate`` and the experts one tensor
each, ``experts.<j>.w1`` gate, ``w3`` up, ``w2`` down, as ``save_pretrained`` writes them) plus the router's
balancing bias ``block_sparse_moe.e_score_correction_bias`` and the query/key norms over the whole
projections, ``self_attn.q_norm`` / ``k_norm``. The partial rotation is ``rotary_dim`` (the releases'
field) or ``partial_rotary_factor``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.config_fields import partial_rotary_factor, rope_keys, setting, without_partial_rotary
from theseus.model.huggingface.family import Identity, cannot, expect, require, unsupported
from theseus.model.huggingface.names import TensorMap, same
from theseus.model.models.mixtral.hf import MixtralFamily, mixture
from theseus.model.stack.architecture import Architecture

MINIMAX_M2_CLASS = "theseus.model.models.minimax_m2.model:MiniMaxM2"
ROTARY_KEY = "architecture/partial_rotary_factor"
#: ``MiniMaxM2Attention``'s default, the releases' ``rotary_dim`` 64 of ``head_dim`` 128.
DEFAULT_PARTIAL = 0.5


def rotary_fraction(config: Mapping[str, Any]) -> float:
    """The rotated fraction of each head as transformers reads it: ``partial_rotary_factor`` (the RoPE
    entry's, then the top level), else ``rotary_dim / head_dim``, else the whole head."""
    rotary_dim = config.get("rotary_dim")
    if rotary_dim is None:
        return partial_rotary_factor(config)
    head_dim = config.get("head_dim") or int(require(config, "hidden_size")) // int(
        require(config, "num_attention_heads")
    )
    return partial_rotary_factor(config, int(rotary_dim) / int(head_dim))


class MiniMaxM2Family(MixtralFamily):
    """``model_type: minimax_m2``."""

    identity: ClassVar[Identity] = Identity("minimax_m2", "MiniMaxM2ForCausalLM", MINIMAX_M2_CLASS)
    holds_window: ClassVar[bool] = False

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "scoring_func", "sigmoid")
        expect(config, "use_routing_bias", True)
        expect(config, "use_qk_norm", True)
        expect(config, "qk_norm_type", "per_layer")
        if config.get("shared_intermediate_size"):
            raise unsupported("shared_intermediate_size", config["shared_intermediate_size"], "no shared experts")
        if config.get("sliding_window") is not None:
            raise unsupported("sliding_window", config["sliding_window"], "MiniMax-M2's layers attend fully")
        keys = super().keys(config)
        keys.update(
            {
                "architecture/moe/router": "sigmoid",
                "architecture/moe/n_group": 1,
                "architecture/moe/topk_group": 1,
                "architecture/moe/routed_scaling_factor": 1.0,
                "architecture/moe/aux_loss": float(config.get("router_aux_loss_coef", 0.001)),
                ROTARY_KEY: rotary_fraction(config),
            }
        )
        return keys

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RoPE as Llama's, the partial rotation read apart (``architecture/partial_rotary_factor``)."""
        return rope_keys(without_partial_rotary(config))

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = super().tensor_maps(arch)
        q, k = arch.attention.n_heads * arch.head_dim, arch.attention.kv_heads * arch.head_dim
        n_experts = mixture(arch).n_experts
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            maps += [
                same(hf + "self_attn.q_norm.weight", (ours, "attn", "query_norm", "scale"), (q,)),
                same(hf + "self_attn.k_norm.weight", (ours, "attn", "key_norm", "scale"), (k,)),
                same(hf + "block_sparse_moe.e_score_correction_bias", (ours, "mlp", "router_bias"), (n_experts,)),
            ]
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = mixture(arch)
        if moe.router != "sigmoid" or moe.n_group > 1 or moe.routed_scaling_factor != 1.0 or not moe.norm_topk_prob:
            raise cannot(
                self.model_type,
                f"architecture/moe/router={moe.router} with n_group={moe.n_group}, routed_scaling_factor="
                f"{moe.routed_scaling_factor}, norm_topk_prob={moe.norm_topk_prob} (its router is sigmoid, "
                "one group, renormalised, unscaled)",
            )
        if moe.n_shared or moe.first_k_dense:
            raise cannot(self.model_type, "shared experts or dense layers")
        if not (arch.attention.qk_norm and arch.attention.qk_norm_span == "projection"):
            raise cannot(self.model_type, "attention without query/key norms over the whole projections")
        self.check_biases(arch)
        config = super(MixtralFamily, self).config(arch, settings)
        fraction = setting(settings, ROTARY_KEY, DEFAULT_PARTIAL)
        config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": fraction}
        config.update(
            {
                "intermediate_size": moe.expert_hidden,
                "num_local_experts": moe.n_experts,
                "num_experts_per_tok": moe.top_k,
                "rotary_dim": int(arch.head_dim * fraction),
                "scoring_func": "sigmoid",
                "use_routing_bias": True,
                "use_qk_norm": True,
                "qk_norm_type": "per_layer",
                "router_jitter_noise": 0.0,
                "output_router_logits": False,
                "router_aux_loss_coef": moe.aux_loss,
            }
        )
        return config

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {}


__all__ = ["MINIMAX_M2_CLASS", "MiniMaxM2Family", "rotary_fraction"]
