"""Qwen3 checkpoints (``Qwen3ForCausalLM``) <-> theseus' ``Qwen3``: the ``hf/qwen3`` family.

Llama's tensor layout plus ``self_attn.q_norm`` / ``k_norm`` per layer; ``attention_bias`` covers
query, key, value and output as in Llama; the window fields are Qwen2's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.config_fields import qwen_window, window_config
from theseus.model.huggingface.family import Identity
from theseus.model.huggingface.names import TensorMap, same
from theseus.model.models.llama.hf import AttentionBiasFamily
from theseus.model.stack.architecture import Architecture

QWEN3_CLASS = "theseus.model.models.qwen3.model:Qwen3"


class Qwen3Family(AttentionBiasFamily):
    """``model_type: qwen3`` (dense Qwen3)."""

    identity: ClassVar[Identity] = Identity("qwen3", "Qwen3ForCausalLM", QWEN3_CLASS)
    holds_window: ClassVar[bool] = True

    def window(self, config: Mapping[str, Any]) -> int | None:
        return qwen_window(config, self.sliding_window(config))

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = super().tensor_maps(arch)
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.self_attn.", f"blocks_{i}"
            maps.append(same(hf + "q_norm.weight", (ours, "attn", "query_norm", "scale"), (arch.head_dim,)))
            maps.append(same(hf + "k_norm.weight", (ours, "attn", "key_norm", "scale"), (arch.head_dim,)))
        return maps

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"attention_bias": arch.attention.qkv_bias, "head_dim": arch.head_dim, **window_config(arch)}


__all__ = ["QWEN3_CLASS", "Qwen3Family"]
