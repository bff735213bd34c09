"""GLM-4.5 / 4.6 / 4.7 checkpoints (``Glm4MoeForCausalLM``, ``model_type: glm4_moe``) <-> theseus' ``Glm4Moe``:
the ``hf/glm4_moe`` family.

Llama's norms and attention projections, ``attention_bias`` on the query, key and value projections only
(``o_proj`` has none), ``self_attn.q_norm`` / ``k_norm`` (per head) with ``use_qk_norm``, and
``partial_rotary_factor`` (in ``rope_parameters`` or at the top level; transformers' default 0.5) <->
``architecture/partial_rotary_factor``. The feed-forwards are DeepSeek-V3's: the leading
``first_k_dense_replace`` layers a dense ``mlp``, the others the router ``mlp.gate`` with its
``e_score_correction_bias``, the experts one tensor each (``mlp.experts.<j>.gate_proj`` / ``up_proj`` /
``down_proj``, as ``save_pretrained`` writes them) and ``mlp.shared_experts``.

The releases' multi-token-prediction layers (``num_nextn_predict_layers``: ``model.layers.<num_hidden_layers>``
on) are set aside on import, as transformers does, and not exported (``num_nextn_predict_layers: 0``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.config_fields import partial_rotary_factor, rope_keys, setting, without_partial_rotary
from theseus.model.huggingface.family import Identity, cannot, expect, require, unsupported
from theseus.model.huggingface.names import TensorMap, embedding_maps, head_maps, same
from theseus.model.models.deepseek_v3.hf import feed_forward_maps, mixture_config, sigmoid_mixture
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, LlamaFamily, attention_maps
from theseus.model.stack.architecture import Architecture

GLM4_MOE_CLASS = "theseus.model.models.glm4_moe.model:Glm4Moe"

#: transformers' ``Glm4MoeConfig`` defaults of the fields a ``config.json`` may leave out.
DEFAULT_PARTIAL = 0.5
ROTARY_KEY, QK_NORM_KEY = "architecture/partial_rotary_factor", "architecture/qk_norm"
HF_DEFAULTS: dict[str, Any] = {
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 1.0,
    "norm_topk_prob": True,
    "num_nextn_predict_layers": 1,
}


def hf_default(config: Mapping[str, Any], field: str) -> Any:
    """``config[field]``, or transformers' default where it is absent (or null)."""
    value = config.get(field)
    return HF_DEFAULTS[field] if value is None else value


class Glm4MoeFamily(LlamaFamily):
    """``model_type: glm4_moe``."""

    identity: ClassVar[Identity] = Identity("glm4_moe", "Glm4MoeForCausalLM", GLM4_MOE_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "hidden_act", "silu")
        shared = int(hf_default(config, "n_shared_experts"))
        if shared < 1:
            raise unsupported("n_shared_experts", shared, "theseus' GLM-4.5 mixture layers have shared experts")
        experts = config.get("n_routed_experts", config.get("num_local_experts"))
        if experts is None:
            raise unsupported("n_routed_experts", None, "a glm4_moe checkpoint needs its number of experts")
        keys = super().keys(config)
        keys.update(
            {
                "architecture/moe/n_experts": int(experts),
                "architecture/moe/top_k": int(require(config, "num_experts_per_tok")),
                "architecture/moe/expert_hidden": int(require(config, "moe_intermediate_size")),
                "architecture/moe/n_shared": shared,
                "architecture/moe/router": "sigmoid",
                "architecture/moe/norm_topk_prob": bool(hf_default(config, "norm_topk_prob")),
                "architecture/moe/first_k_dense": int(hf_default(config, "first_k_dense_replace")),
                "architecture/moe/n_group": int(hf_default(config, "n_group")),
                "architecture/moe/topk_group": int(hf_default(config, "topk_group")),
                "architecture/moe/routed_scaling_factor": float(hf_default(config, "routed_scaling_factor")),
                ROTARY_KEY: partial_rotary_factor(config, DEFAULT_PARTIAL),
                QK_NORM_KEY: bool(config.get("use_qk_norm", False)),
            }
        )
        return keys

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "architecture/attention_bias": bool(config.get("attention_bias", False)),
            "architecture/attention_out_bias": False,
            "architecture/mlp_bias": False,
        }

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No sliding window (GLM-4.5's layers attend to the whole sequence)."""
        return None

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RoPE as Llama's, the partial rotation read apart (``architecture/partial_rotary_factor``)."""
        return rope_keys(without_partial_rotary(config))

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """The multi-token-prediction layers ``config.json`` declares (``model.layers.<n>`` for
        ``num_hidden_layers`` <= n < ``num_hidden_layers + num_nextn_predict_layers``): transformers'
        model has none and ignores them on load; so does theseus'."""
        n_layers = int(config.get("num_hidden_layers") or 0)
        extra = int(hf_default(config, "num_nextn_predict_layers"))
        index = name.split(".")[2] if name.startswith("model.layers.") else ""
        return index.isdigit() and n_layers <= int(index) < n_layers + extra

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.self_attn.", (f"blocks_{i}", "attn")
            maps += self.layer_norm_maps(arch, i)
            maps += attention_maps(arch, i)
            if arch.attention.qk_norm:
                maps.append(same(hf + "q_norm.weight", (*ours, "query_norm", "scale"), (arch.head_dim,)))
                maps.append(same(hf + "k_norm.weight", (*ours, "key_norm", "scale"), (arch.head_dim,)))
            maps += feed_forward_maps(arch, i)
        maps += head_maps(arch)
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = sigmoid_mixture(self.model_type, arch)
        if arch.attention.qk_norm and arch.attention.qk_norm_span != "head":
            raise cannot(self.model_type, "query/key norms over the whole projections (its norms are per head)")
        if arch.position.scaling.kind not in ("none", "linear", "llama3", "yarn"):
            raise cannot(self.model_type, f"architecture/rope_scaling={arch.position.scaling.kind}")
        config = super().config(arch, settings)
        fraction = setting(settings, ROTARY_KEY, DEFAULT_PARTIAL)
        config["rope_parameters"] = {**config["rope_parameters"], "partial_rotary_factor": fraction}
        config.update(
            {
                "partial_rotary_factor": fraction,
                "use_qk_norm": arch.attention.qk_norm,
                **mixture_config(moe),
                "num_nextn_predict_layers": 0,
                "output_router_logits": False,
            }
        )
        return config

    def check_biases(self, arch: Architecture) -> None:
        if arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "attention output or MLP biases (it has query/key/value biases only)")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"attention_bias": arch.attention.qkv_bias}


__all__ = ["GLM4_MOE_CLASS", "Glm4MoeFamily"]
