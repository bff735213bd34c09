"""OLMo 2 checkpoints (``Olmo2ForCausalLM``) <-> theseus' ``OLMo2``: the ``hf/olmo2`` family.

Llama's tensor layout, except the norms: ``post_attention_layernorm`` follows the attention and
``post_feedforward_layernorm`` the MLP (no ``input_layernorm``), and ``self_attn.q_norm`` / ``k_norm``
span the whole projections.
"""

from __future__ import annotations

from typing import ClassVar

from theseus.model.huggingface.names import TensorMap, same
from theseus.model.models.architecture import Architecture
from theseus.model.models.llama_hf import AttentionBiasFamily

OLMO2_CLASS = "theseus.model.models.olmo2:OLMo2"


class OLMo2Family(AttentionBiasFamily):
    """``model_type: olmo2``."""

    model_type: ClassVar[str] = "olmo2"
    hf_class: ClassVar[str] = "Olmo2ForCausalLM"
    model_class: ClassVar[str] = OLMO2_CLASS
    fallback: ClassVar[bool] = True

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps: list[TensorMap] = []
        for entry in super().tensor_maps(arch):
            if entry.hf.endswith(".input_layernorm.weight"):  # no norm before a branch
                continue
            if not entry.hf.endswith(".post_attention_layernorm.weight"):
                maps.append(entry)
                continue
            layer = entry.hf.removesuffix("post_attention_layernorm.weight")
            block = f"blocks_{layer.split('.')[2]}"
            maps.append(same(entry.hf, (block, "attn_norm", "scale"), (arch.n_embd,)))
            maps.append(same(layer + "post_feedforward_layernorm.weight", (block, "mlp_norm", "scale"), (arch.n_embd,)))
        q, k = arch.n_heads * arch.head_dim, arch.n_kv_heads * arch.head_dim
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.self_attn.", f"blocks_{i}"
            maps.append(same(hf + "q_norm.weight", (ours, "attn", "query_norm", "scale"), (q,)))
            maps.append(same(hf + "k_norm.weight", (ours, "attn", "key_norm", "scale"), (k,)))
        return maps


__all__ = ["OLMO2_CLASS", "OLMo2Family"]
