"""Phi-3 checkpoints (``Phi3ForCausalLM``) <-> theseus' ``Phi3``: the ``hf/phi3`` family.

Llama's tensor layout with two fused projections per layer: ``self_attn.qkv_proj`` holds the query
rows, then the key rows, then the value rows, and ``mlp.gate_up_proj`` the gate rows, then the up
rows. No biases. ``sliding_window`` (every layer; a token sees itself and the ``sliding_window - 1``
before it, as Mistral's) is ``architecture/sliding_window``. LongRoPE (``rope_scaling`` of type
``longrope`` in the 128k releases) is ``architecture/rope_scaling=longrope``: the short factors while
a sequence fits ``original_max_position_embeddings``, the long ones past it, and the attention factor
``sqrt(1 + log(s) / log(original))`` (``s = max_position_embeddings / original``) unless given.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, cannot, require, unsupported
from theseus.model.huggingface.names import TensorMap, fused
from theseus.model.models.llama.hf import LlamaFamily
from theseus.model.stack.architecture import Architecture

PHI3_CLASS = "theseus.model.models.phi3.model:Phi3"

#: Fused checkpoint tensor (below ``model.layers.<i>.``) <- its parts, in the order of their rows.
FUSED: dict[str, tuple[str, ...]] = {
    "self_attn.qkv_proj.weight": ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
    "mlp.gate_up_proj.weight": ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
}


def rope_kind(config: Mapping[str, Any]) -> tuple[str, str]:
    """(``config.json``'s RoPE type, the field naming it)."""
    scaling = rope_scaling(config)
    if "rope_type" in scaling:
        return str(scaling["rope_type"]), "rope_scaling.rope_type"
    if "type" in scaling:
        return str(scaling["type"]), "rope_scaling.type"
    return "default", "rope_scaling.rope_type"


def rope_scaling(config: Mapping[str, Any]) -> dict[str, Any]:
    """The RoPE parameters: the older ``rope_scaling`` when set, else ``rope_parameters`` (as ``Phi3Config``
    reads them)."""
    return dict(config.get("rope_scaling") or config.get("rope_parameters") or {})


def longrope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """A ``longrope`` ``rope_scaling`` as ``architecture/rope_*`` keys (the attention factor resolved as
    transformers resolves it)."""
    scaling = rope_scaling(config)
    # transformers prefers the top-level field (Phi3Config always has one) over the rope entry's
    original = int(
        config.get("original_max_position_embeddings") or require(scaling, "original_max_position_embeddings")
    )
    factor = scaling.get("factor") or int(require(config, "max_position_embeddings")) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1.0 + math.log(factor) / math.log(original))
    return {
        "architecture/rope_scaling": "longrope",
        "architecture/rope_short_factor": [float(f) for f in require(scaling, "short_factor")],
        "architecture/rope_long_factor": [float(f) for f in require(scaling, "long_factor")],
        "architecture/rope_original_max_positions": original,
        "architecture/rope_attention_factor": float(attention),
    }


def fuse_layer(maps: list[TensorMap], layer: int) -> list[TensorMap]:
    """Llama's maps of layer ``layer`` with each group of :data:`FUSED` parts made one fused map."""
    prefix = f"model.layers.{layer}."
    by_name = {entry.hf: entry for entry in maps}
    merged = [fused(prefix + name, [by_name.pop(prefix + part) for part in parts]) for name, parts in FUSED.items()]
    return [*by_name.values(), *merged]


class Phi3Family(LlamaFamily):
    """``model_type: phi3`` (Phi-3 and Phi-3.5 mini and medium; Phi-4-mini's partial RoPE is refused)."""

    identity: ClassVar[Identity] = Identity("phi3", "Phi3ForCausalLM", PHI3_CLASS)
    windowed: ClassVar[bool] = True
    holds_window: ClassVar[bool] = True
    peft_modules: ClassVar[Mapping[str, str]] = {"out": "self_attn.o_proj", "down": "mlp.down_proj"}
    peft_fused: ClassVar[Mapping[str, tuple[str, ...]]] = {
        "self_attn.qkv_proj": ("query", "key", "value"),
        "mlp.gate_up_proj": ("gate", "up"),
    }

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        kind, field = rope_kind(config)
        if kind not in ("default", "longrope", "su", "yarn"):  # transformers reads su and yarn as longrope
            raise unsupported(field, kind, "supported for phi3: default, longrope")
        if kind == "default":
            return super().keys(config)
        scaling = rope_scaling(config)
        plain = {  # the rest read as Llama's, with plain RoPE of the same base and rotary fraction
            "rope_type": "default",
            "rope_theta": config.get("rope_theta", scaling.get("rope_theta", 10000.0)),
            "partial_rotary_factor": config.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0)),
        }
        keys = super().keys({**config, "rope_parameters": plain, "rope_scaling": None})
        return {**keys, **longrope_keys(config)}

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "architecture/attention_bias": False,
            "architecture/attention_out_bias": False,
            "architecture/mlp_bias": False,
        }

    def check_biases(self, arch: Architecture) -> None:
        if arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "biases")

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        layers: dict[int, list[TensorMap]] = {i: [] for i in range(arch.n_layers)}
        others: list[TensorMap] = []
        for entry in super().tensor_maps(arch):
            if entry.hf.startswith("model.layers."):
                layers[int(entry.hf.split(".")[2])].append(entry)
            else:
                others.append(entry)
        return [*others, *(entry for i, layer in layers.items() for entry in fuse_layer(layer, i))]

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        scaling = arch.position.scaling
        if scaling.kind not in ("none", "longrope"):
            raise cannot(self.model_type, f"architecture/rope_scaling={scaling.kind}")
        config = super().config(arch, settings)
        if scaling.kind == "longrope":
            config["original_max_position_embeddings"] = scaling.original_max_positions
        return config

    def export_overrides(self, eos_id: int | None) -> dict[str, Any]:
        """Phi-3 pads with its end-of-text token (``Phi3Config``'s default, 32000, is past a smaller vocabulary)."""
        return {**super().export_overrides(eos_id), "pad_token_id": eos_id}

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {
            "sliding_window": arch.attention.sliding_window,
            "original_max_position_embeddings": arch.block_size,
            "resid_pdrop": 0.0,
            "embd_pdrop": 0.0,
        }


__all__ = ["FUSED", "PHI3_CLASS", "Phi3Family", "fuse_layer", "longrope_keys", "rope_kind", "rope_scaling"]
