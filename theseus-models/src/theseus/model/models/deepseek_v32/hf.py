"""DeepSeek-V3.2 checkpoints (``DeepseekV32ForCausalLM``) <-> theseus' ``DeepseekV32``: the ``hf/deepseek_v32`` family.

DeepSeek-V3's layout (:mod:`theseus.model.models.deepseek_v3.hf`: latent attention, leading dense layers,
sigmoid-routed experts with ``e_score_correction_bias`` and shared experts, the multi-token-prediction
layers after the last one) plus each layer's ``self_attn.indexer``: ``wq_b`` (``[index_n_heads *
index_head_dim, q_lora_rank]``, theseus' ``indexer/query``), ``wk`` (``indexer/key``), ``k_norm``
(a LayerNorm: ``weight`` and ``bias``, theseus' ``indexer/key_norm``) and ``weights_proj``
(``[index_n_heads, hidden_size]``, ``indexer/weights``). ``index_n_heads``, ``index_head_dim`` and
``index_topk`` <-> ``architecture/dsa/*``.

The query bottleneck is required (``q_lora_rank`` set), the latent attention rotates interleaved pairs
(``rope_interleave`` is no field of this family) and ``mlp_layer_types`` must be the leading dense
layers ``first_k_dense_replace`` describes; anything else is refused in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, cannot, unsupported
from theseus.model.huggingface.names import TensorMap, heads_in, same, transposed
from theseus.model.layers.sparse_attention import DSASpec
from theseus.model.models.deepseek_v3.hf import DeepseekV3Family, latent_of
from theseus.model.models.deepseek_v3.mtp import mtp_depth
from theseus.model.models.deepseek_v32.model import sparse_attention
from theseus.model.stack.architecture import Architecture

DEEPSEEK_V32_CLASS = "theseus.model.models.deepseek_v32.model:DeepseekV32"

#: What transformers' ``DeepseekV32Config`` reads where ``config.json`` omits a field (``save_pretrained``
#: writes only the fields that differ from these); import falls back to the same.
V32_DEFAULTS: dict[str, Any] = {
    "q_lora_rank": 1536,
    "first_k_dense_replace": 3,
    "n_group": 8,
    "topk_group": 4,
    "routed_scaling_factor": 2.5,
    "n_shared_experts": 1,
    "norm_topk_prob": True,
    "rms_norm_eps": 1e-6,
    "num_nextn_predict_layers": 0,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 64,
}


def dsa_of(arch: Architecture, model_type: str) -> DSASpec:
    dsa = sparse_attention(arch)
    if dsa is None:
        raise cannot(model_type, "dense latent attention (every layer has a lightning indexer)")
    return dsa


def indexer_maps(arch: Architecture, layer: int, ours: tuple[str, ...]) -> list[TensorMap]:
    """The lightning indexer of checkpoint layer ``layer`` <-> the theseus attention at path ``ours``."""
    dsa, mla, e = dsa_of(arch, "deepseek_v32"), latent_of(arch), arch.n_embd
    hf, path = f"model.layers.{layer}.self_attn.indexer.", (*ours, "indexer")
    h, d = dsa.index_n_heads, dsa.index_head_dim
    return [
        heads_in(hf + "wq_b.weight", (*path, "query"), mla.q_lora_rank, h, d),
        transposed(hf + "wk.weight", (*path, "key"), d, e),
        same(hf + "k_norm.weight", (*path, "key_norm", "scale"), (d,)),
        same(hf + "k_norm.bias", (*path, "key_norm", "bias"), (d,)),
        transposed(hf + "weights_proj.weight", (*path, "weights"), h, e),
    ]


class DeepseekV32Family(DeepseekV3Family):
    """``model_type: deepseek_v32``."""

    identity: ClassVar[Identity] = Identity("deepseek_v32", "DeepseekV32ForCausalLM", DEEPSEEK_V32_CLASS)
    #: transformers' defaults of the fields ``config.json`` may omit.
    hf_defaults: ClassVar[Mapping[str, Any]] = V32_DEFAULTS
    #: Whether the indexer rotates interleaved pairs (GLM-5) rather than halves (DeepSeek-V3.2).
    indexer_rope_interleave: ClassVar[bool] = False

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        full = {**self.hf_defaults, **config}
        if not full.get("q_lora_rank"):
            raise unsupported("q_lora_rank", full.get("q_lora_rank"), "the indexer reads the query bottleneck")
        if "rope_interleave" in config and not config["rope_interleave"]:
            raise unsupported("rope_interleave", config["rope_interleave"], "the latent attention's pairs interleave")
        n_layers = int(full.get("num_hidden_layers") or 0)
        first = min(int(full["first_k_dense_replace"] or 0), n_layers)
        expected = ["dense"] * first + ["sparse"] * (n_layers - first)
        if full.get("mlp_layer_types") is not None and list(full["mlp_layer_types"]) != expected:
            raise unsupported("mlp_layer_types", full["mlp_layer_types"], "only leading dense layers are supported")
        layer_types = full.get("layer_types")
        if layer_types is not None and set(layer_types) - {"indexed_attention"}:
            raise unsupported("layer_types", layer_types, "every layer has DeepSeek Sparse Attention")
        if int(full["index_head_dim"]) < int(full.get("qk_rope_head_dim") or 0):
            raise unsupported("index_head_dim", full["index_head_dim"], "narrower than qk_rope_head_dim")
        keys = super().keys({**full, "rope_interleave": True})
        return {
            **keys,
            "architecture/dsa/index_n_heads": int(full["index_n_heads"]),
            "architecture/dsa/index_head_dim": int(full["index_head_dim"]),
            "architecture/dsa/index_topk": int(full["index_topk"]),
            "architecture/dsa/rope_interleave": self.indexer_rope_interleave,
        }

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        return super().set_aside(name, {**self.hf_defaults, **config})

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = super().tensor_maps(arch)
        for i in range(arch.n_layers):
            maps += indexer_maps(arch, i, (f"blocks_{i}", "attn"))
        for depth in range(1, mtp_depth(arch) + 1):
            maps += indexer_maps(arch, arch.n_layers + depth - 1, (f"mtp_{depth - 1}", "block", "attn"))
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        dsa, mla = dsa_of(arch, self.model_type), latent_of(arch)
        if not mla.q_lora_rank:
            raise cannot(self.model_type, "architecture/mla/q_lora_rank=0 (the indexer reads the query bottleneck)")
        if not mla.rope_interleave:
            raise cannot(self.model_type, "architecture/mla/rope_interleave=false (its pairs interleave)")
        if dsa.rope_interleave != self.indexer_rope_interleave:
            raise cannot(self.model_type, f"architecture/dsa/rope_interleave={str(dsa.rope_interleave).lower()}")
        written = super().config(arch, settings)
        del written["rope_interleave"]
        first = written["first_k_dense_replace"]
        return {
            **written,
            "mlp_layer_types": ["dense"] * first + ["sparse"] * (arch.n_layers - first),
            "index_n_heads": dsa.index_n_heads,
            "index_head_dim": dsa.index_head_dim,
            "index_topk": dsa.index_topk,
        }


__all__ = ["DEEPSEEK_V32_CLASS", "V32_DEFAULTS", "DeepseekV32Family", "dsa_of", "indexer_maps"]
