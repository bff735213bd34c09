"""OLMo 2 checkpoints (``Olmo2ForCausalLM``) <-> theseus' ``OLMo2``: the ``hf/olmo2`` family.

Llama's tensor layout, except the norms: ``post_attention_layernorm`` follows the attention and
``post_feedforward_layernorm`` the MLP (no ``input_layernorm``), and ``self_attn.q_norm`` / ``k_norm``
span the whole projections.
"""

from __future__ import annotations

from typing import ClassVar

from theseus.model.huggingface.family import Identity
from theseus.model.huggingface.names import TensorMap, same
from theseus.model.models.llama.hf import AttentionBiasFamily
from theseus.model.stack.architecture import Architecture

OLMO2_CLASS = "theseus.model.models.olmo2.model:OLMo2"


class OLMo2Family(AttentionBiasFamily):
    """``model_type: olmo2``."""

    identity: ClassVar[Identity] = Identity("olmo2", "Olmo2ForCausalLM", OLMO2_CLASS)

    def layer_norm_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """``post_attention_layernorm`` / ``post_feedforward_layernorm`` after the branches, and the
        query/key norms over the whole projections."""
        hf, ours = f"model.layers.{layer}.", f"blocks_{layer}"
        q, k = arch.attention.n_heads * arch.head_dim, arch.attention.kv_heads * arch.head_dim
        return [
            same(hf + "post_attention_layernorm.weight", (ours, "attn_norm", "scale"), (arch.n_embd,)),
            same(hf + "post_feedforward_layernorm.weight", (ours, "mlp_norm", "scale"), (arch.n_embd,)),
            same(hf + "self_attn.q_norm.weight", (ours, "attn", "query_norm", "scale"), (q,)),
            same(hf + "self_attn.k_norm.weight", (ours, "attn", "key_norm", "scale"), (k,)),
        ]


__all__ = ["OLMO2_CLASS", "OLMo2Family"]
