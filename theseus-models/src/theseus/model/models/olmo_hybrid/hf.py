"""OLMo Hybrid checkpoints (``OlmoHybridForCausalLM``, ``model_type: olmo_hybrid``) <-> theseus' ``OLMoHybrid``:
the ``hf/olmo_hybrid`` family.

Per layer, by ``layer_types``: a ``full_attention`` layer is OLMo 2's (``self_attn.{q,k,v,o}_proj``, the
whole-projection ``q_norm`` / ``k_norm``, norms after the branches); a ``linear_attention`` layer is pre-norm
around ``linear_attn``: separate ``q_proj``, ``k_proj``, ``v_proj``, ``a_proj``, ``b_proj``, ``g_proj`` (the
output gate) and ``o_proj``, the depthwise convolutions ``q_conv1d`` / ``k_conv1d`` / ``v_conv1d``, ``dt_bias``,
``A_log`` and the gated ``o_norm``. Every layer has a SwiGLU ``mlp``.

The tensors are named as the releases and ``save_pretrained`` store them: a layer's first norm is
``attention_layer_norm`` (transformers' ``input_layernorm``), the one after the attention branch (an attention
layer) or before the MLP (a linear layer) ``feedforward_layer_norm`` (``post_attention_layernorm``), an attention
layer's last ``post_feedforward_layernorm``; the three convolutions apart (transformers joins them into one
``conv1d`` when it loads them, and ``save_pretrained`` splits that evenly, whatever each one's channels: the
import joins the pieces it finds, the export writes each convolution's own).

A ``rope_parameters`` with a ``rope_theta`` rotates the attention layers; the releases have none
(``rope_theta`` null: no position embedding), which exports back the same way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import rope_keys
from theseus.model.huggingface.family import PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import TensorMap, heads_in, heads_out, same, transposed
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION
from theseus.model.models.llama.hf import MLP_PEFT_MODULES, projection_maps
from theseus.model.models.llama4.hf import swiglu_maps
from theseus.model.models.olmo2.hf import OLMo2Family
from theseus.model.stack.architecture import Architecture

OLMO_HYBRID_CLASS = "theseus.model.models.olmo_hybrid.model:OLMoHybrid"
#: A linear-attention layer's PEFT modules (the output gate ``z`` is ``g_proj``; ``a`` and ``b`` take no adapter).
LINEAR_PEFT_MODULES = {
    "query": "linear_attn.q_proj",
    "key": "linear_attn.k_proj",
    "value": "linear_attn.v_proj",
    "z": "linear_attn.g_proj",
    "out": "linear_attn.o_proj",
}
#: transformers' default: every this many layers one is full attention.
FULL_EVERY = 4
#: The stored name of the norm transformers calls ``post_attention_layernorm``, and of ``input_layernorm``.
FEEDFORWARD_NORM, ATTENTION_NORM = "feedforward_layer_norm", "attention_layer_norm"


def conv_map(hf: str, path: tuple[str, ...], arch: Any) -> TensorMap:
    """A Gated DeltaNet's depthwise convolution, stored as ``{q,k,v}_conv1d.weight`` ``[channels, 1, taps]``
    (joined: transformers' ``conv1d``) <-> ``conv_query`` / ``conv_key`` ``[taps, key_heads, key_dim]`` and
    ``conv_value`` ``[taps, value_heads, value_dim]`` at ``path``."""
    keys = (arch.linear_key_heads, arch.linear_key_dim)
    return qkv_conv_map(hf, path, arch.conv_kernel, keys, (arch.linear_value_heads, arch.linear_value_dim))


def qkv_conv_map(
    hf: str, path: tuple[str, ...], taps: int, keys: tuple[int, int], values: tuple[int, int]
) -> TensorMap:
    """The query, key and value convolutions stored as ``{hf}{q,k,v}_conv1d.weight`` ``[channels, 1, taps]``
    (joined: ``{hf}conv1d.weight``) <-> ``conv_query`` / ``conv_key`` ``[taps, *keys]`` and ``conv_value``
    ``[taps, *values]`` at ``path`` (``keys`` / ``values``: heads and head width)."""
    shapes = [(taps, *keys), (taps, *keys), (taps, *values)]
    rows = [keys[0] * keys[1], keys[0] * keys[1], values[0] * values[1]]
    edges = list(np.cumsum([0, *rows]))

    def to_theseus(w: np.ndarray) -> list[np.ndarray]:
        taps_major = w[:, 0, :].T  # [taps, channels]
        return [taps_major[:, lo:hi].reshape(s) for lo, hi, s in zip(edges, edges[1:], shapes, strict=False)]

    def to_hf(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([a.reshape(taps, -1) for a in arrays], axis=1).T[:, None, :]

    names = ("conv_query", "conv_key", "conv_value")
    pieces = tuple((f"{hf}{p}_conv1d.weight", n) for p, n in zip("qkv", rows, strict=True))
    paths = tuple((*path, n) for n in names)
    return TensorMap(hf + "conv1d.weight", (sum(rows), 1, taps), paths, to_theseus, to_hf, pieces=pieces)


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """``layer_types``, or transformers' default (every 4th layer full, the last one if no other)."""
    from theseus.model.models.olmo_hybrid.model import default_layer_types

    n_layers = int(require(config, "num_hidden_layers"))
    types = config.get("layer_types") or list(default_layer_types(n_layers, FULL_EVERY))
    if len(types) != n_layers or not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
        raise unsupported("layer_types", types, f"expected {n_layers} of linear_attention / full_attention")
    return list(types)


class OLMoHybridFamily(OLMo2Family):
    """``model_type: olmo_hybrid``."""

    model_type: ClassVar[str] = "olmo_hybrid"
    hf_class: ClassVar[str] = "OlmoHybridForCausalLM"
    model_class: ClassVar[str] = OLMO_HYBRID_CLASS
    fallback: ClassVar[bool] = True

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """A full-attention layer's modules are OLMo 2's; a linear-attention layer's are ``linear_attn``'s
        projections (:data:`LINEAR_PEFT_MODULES`) and its MLP's."""
        if (arch.layer_types or ())[layer] != LINEAR_ATTENTION:
            return super().peft_layout(arch, layer)
        return PeftLayout({**LINEAR_PEFT_MODULES, **MLP_PEFT_MODULES}, {}, {})

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        n_heads = keys["architecture/n_heads"]
        key_heads = int(config.get("linear_num_key_heads") or n_heads)
        key_dim = int(config.get("linear_key_head_dim") or int(0.75 * keys["architecture/n_embd"] / key_heads))
        keys.update(
            {
                "architecture/layer_types": layer_types(config),
                "architecture/linear_num_key_heads": key_heads,
                "architecture/linear_num_value_heads": int(config.get("linear_num_value_heads") or n_heads),
                "architecture/linear_key_head_dim": key_dim,
                "architecture/linear_value_head_dim": int(config.get("linear_value_head_dim") or 2 * key_dim),
                "architecture/linear_conv_kernel_dim": int(config.get("linear_conv_kernel_dim", 4)),
                "architecture/linear_allow_neg_eigval": bool(config.get("linear_allow_neg_eigval", True)),
            }
        )
        return keys

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RoPE as Llama's where ``rope_parameters`` (or ``rope_theta``) gives a base; none otherwise."""
        parameters = config.get("rope_parameters") or {}
        theta = config.get("rope_theta", parameters.get("rope_theta"))
        if theta is None:
            return {"architecture/rotary": False}
        return {**rope_keys(config), "architecture/rotary": True}

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No sliding window: ``layer_types`` name the linear and full layers."""
        return None

    # -- both ways ---------------------------------------------------------------------------------
    def layer_norm_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """OLMo 2's norms, the one after the attention branch stored as ``feedforward_layer_norm``."""
        stored = f"model.layers.{layer}.{FEEDFORWARD_NORM}.weight"
        renamed = ".post_attention_layernorm.weight"
        maps = super().layer_norm_maps(arch, layer)
        return [dataclasses.replace(m, hf=stored) if m.hf.endswith(renamed) else m for m in maps]

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        from theseus.model.models.olmo_hybrid.model import OLMoHybridArchitecture

        if not isinstance(arch, OLMoHybridArchitecture):
            raise cannot(self.model_type, "a model without OLMo Hybrid's layers")
        maps = super().tensor_maps(arch)
        linear = [i for i, kind in enumerate(arch.layer_types or ()) if kind == LINEAR_ATTENTION]
        replaced = {m.hf for i in linear for m in self.layer_norm_maps(arch, i) + projection_maps(arch, i)}
        maps = [m for m in maps if m.hf not in replaced]
        for i in linear:
            maps += self.linear_layer_maps(arch, i)
        return maps

    def linear_layer_maps(self, arch: Any, layer: int) -> list[TensorMap]:
        """One linear-attention layer's tensors: its pre-norms, the Gated DeltaNet and the MLP."""
        e, hf, ours = arch.n_embd, f"model.layers.{layer}.", f"blocks_{layer}"
        attn, lin = (ours, "attn"), f"model.layers.{layer}.linear_attn."
        nk, nv, dk, dv = arch.linear_key_heads, arch.linear_value_heads, arch.linear_key_dim, arch.linear_value_dim
        return [
            same(hf + f"{ATTENTION_NORM}.weight", (ours, "attn_norm", "scale"), (e,)),
            same(hf + f"{FEEDFORWARD_NORM}.weight", (ours, "mlp_norm", "scale"), (e,)),
            heads_in(lin + "q_proj.weight", (*attn, "query"), e, nk, dk),
            heads_in(lin + "k_proj.weight", (*attn, "key"), e, nk, dk),
            heads_in(lin + "v_proj.weight", (*attn, "value"), e, nv, dv),
            heads_in(lin + "g_proj.weight", (*attn, "z"), e, nv, dv),
            transposed(lin + "a_proj.weight", (*attn, "a"), nv, e),
            transposed(lin + "b_proj.weight", (*attn, "b"), nv, e),
            conv_map(lin, attn, arch),
            same(lin + "dt_bias", (*attn, "dt_bias"), (nv,)),
            same(lin + "A_log", (*attn, "A_log"), (nv,)),
            same(lin + "o_norm.weight", (*attn, "norm", "scale"), (dv,)),
            heads_out(lin + "o_proj.weight", (*attn, "out"), e, nv, dv),
            *swiglu_maps(hf + "mlp.", (ours, "mlp"), arch.feed_forward.d_ff, e),
        ]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.olmo_hybrid.model import OLMoHybridArchitecture

        if not isinstance(arch, OLMoHybridArchitecture):
            raise cannot(self.model_type, "a model without OLMo Hybrid's layers")
        types = list(arch.layer_types or ())
        if not {FULL_ATTENTION, LINEAR_ATTENTION} <= set(types):
            raise cannot(self.model_type, f"architecture/layer_types={types} (it needs both kinds of layer)")
        if arch.linear_beta_scale not in (1.0, 2.0):
            raise cannot(self.model_type, f"a write strength scaled by {arch.linear_beta_scale}")
        config = super().config(arch, settings)
        config.update(
            {
                "layer_types": types,
                "linear_num_key_heads": arch.linear_key_heads,
                "linear_num_value_heads": arch.linear_value_heads,
                "linear_key_head_dim": arch.linear_key_dim,
                "linear_value_head_dim": arch.linear_value_dim,
                "linear_conv_kernel_dim": arch.conv_kernel,
                "linear_allow_neg_eigval": arch.linear_beta_scale == 2.0,
                "pad_token_id": None,  # OlmoHybridConfig's default (100277) may be past the vocabulary
            }
        )
        return config

    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        """Llama's RoPE fields, or ``rope_parameters`` without a base for a model without position embeddings."""
        if arch.position.kind == "none":
            return {"rope_parameters": {"rope_type": "default", "rope_theta": None}}
        return super().rope_config(arch)

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {**super().family_config(arch), "sliding_window": None}


__all__ = ["LINEAR_PEFT_MODULES", "OLMO_HYBRID_CLASS", "OLMoHybridFamily", "conv_map", "layer_types", "qkv_conv_map"]
