"""Gemma 4 checkpoints <-> theseus' ``Gemma4``: the ``hf/gemma4_text`` (``Gemma4ForCausalLM``) and
``hf/gemma4`` (``Gemma4ForConditionalGeneration``, its language model) families.

Gemma 3's layout (:mod:`theseus.model.models.gemma.hf`: four norms per layer, per-head ``q_norm`` /
``k_norm``) with these differences:

- a layer's attention tensors have the heads of its kind: the ``full_attention`` layers ``global_head_dim``
  wide (transformers' default 512 when ``config.json`` has none; or ``per_layer_config``'s ``head_dim``,
  as transformers 5.x writes it) with ``num_global_key_value_heads`` key/value heads when
  ``attention_k_eq_v`` (which also drops their ``v_proj``: the keys are the values);
- the per-layer inputs (``hidden_size_per_layer_input``, default 256; 0 or null: none):
  ``model.embed_tokens_per_layer`` (``vocab_size_per_layer_input`` rows, at least ``vocab_size``),
  ``model.per_layer_model_projection`` and ``model.per_layer_projection_norm``; per layer
  ``per_layer_input_gate``, ``per_layer_projection`` and ``post_per_layer_input_norm``;
- each layer's ``layer_scalar`` (a saved buffer) is read and written as a parameter;
- ``rope_parameters`` per layer type: ``proportional`` (``partial_rotary_factor``, a linear ``factor``) or
  ``default`` on the full layers, ``default`` on the sliding ones; the last layer is always full (transformers
  forces it).

Refused on import, one line naming the field: ``enable_moe_block`` (the mixture beside the dense MLP),
``num_kv_shared_layers`` > 0 (layers that reuse earlier layers' keys and values; ``use_double_wide_mlp``
only widens those), ``use_bidirectional_attention``, a ``per_layer_config`` that changes more than the full
layers' heads. The ``gemma4`` checkpoints nest these fields in ``text_config`` and the tensors under
``model.language_model.``; their vision and audio towers (``model.vision_tower.``, ``model.embed_vision.``,
``model.audio_tower.``, ``model.embed_audio.``) are skipped on import, and such a run exports as
``gemma4_text``, the language model alone (theseus holds no tower to write).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.errors import ConfigError
from theseus.model.huggingface.family import Identity, NestedLanguageModel, PeftLayout, cannot, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    same,
    transposed,
)
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.models.gemma.hf import Gemma3TextFamily
from theseus.model.models.gemma4.model import Gemma4Architecture
from theseus.model.models.llama.hf import projection_maps
from theseus.model.stack.architecture import Architecture
from theseus.model.stack.windows import pattern_layer_types

GEMMA4_CLASS = "theseus.model.models.gemma4.model:Gemma4"

#: transformers' values of the fields a ``gemma4_text`` ``config.json`` may leave out.
DEFAULTS: dict[str, Any] = {
    "head_dim": 256,
    "global_head_dim": 512,
    "hidden_size_per_layer_input": 256,
    "vocab_size_per_layer_input": 262_144,
    "sliding_window": 512,
    "max_position_embeddings": 131_072,
}
#: transformers' ``rope_parameters`` when ``config.json`` has none.
DEFAULT_ROPE: dict[str, dict[str, Any]] = {
    SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": 10_000.0},
    FULL_ATTENTION: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0},
}
#: The tensors of a ``gemma4`` checkpoint's towers, which the import skips.
TOWERS = ("model.vision_tower.", "model.embed_vision.", "model.audio_tower.", "model.embed_audio.")


def gemma4(arch: Architecture) -> Gemma4Architecture:
    if not isinstance(arch, Gemma4Architecture):
        raise ConfigError("a Gemma 4 checkpoint needs a Gemma4 model (model/gemma4)")
    return arch


def padded_rows(hf: str, path: tuple[str, ...], rows: int, padded: int, width: int) -> TensorMap:
    """A table ``[rows, width]`` <-> theseus' padded to ``padded`` rows (zeros)."""

    def pad(w: np.ndarray) -> list[np.ndarray]:
        return [np.pad(w, ((0, padded - rows), (0, 0)))]

    return TensorMap(hf, (rows, width), (path,), pad, lambda a: a[0][:rows])


class Gemma4TextFamily(Gemma3TextFamily):
    """``model_type: gemma4_text``."""

    identity: ClassVar[Identity] = Identity("gemma4_text", "Gemma4ForCausalLM", GEMMA4_CLASS)
    rope_scalings: ClassVar[tuple[str, ...]] = ("none", "linear")

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        config = {**DEFAULTS, **config}
        if config.get("use_bidirectional_attention"):
            value = config["use_bidirectional_attention"]
            raise unsupported("use_bidirectional_attention", value, "theseus models are causal")
        if config.get("enable_moe_block"):
            raise unsupported("enable_moe_block", config["enable_moe_block"], "Gemma 4's mixture block is not built")
        if config.get("num_kv_shared_layers"):
            raise unsupported(
                "num_kv_shared_layers",
                config["num_kv_shared_layers"],
                "layers that reuse earlier layers' keys and values are not built",
            )
        keys = super().keys(config)
        per_layer = int(config.get("hidden_size_per_layer_input") or 0)
        ple_vocab = int(config.get("vocab_size_per_layer_input") or 0)
        if per_layer and ple_vocab < keys["architecture/vocab_size"]:
            raise unsupported("vocab_size_per_layer_input", ple_vocab, "fewer rows than vocab_size")
        return {
            **keys,
            **self.heads(config, keys["architecture/layer_types"]),
            "architecture/query_pre_attn_scalar": 1.0,
            "architecture/attn_softcap": 0.0,
            "architecture/block_size": int(config["max_position_embeddings"]),
            "architecture/per_layer_input_dim": per_layer,
            "architecture/per_layer_vocab_size": ple_vocab if per_layer else None,
        }

    def heads(self, config: Mapping[str, Any], types: list[str]) -> dict[str, Any]:
        """The full layers' head width and key/value heads (``global_head_dim``,
        ``num_global_key_value_heads`` with ``attention_k_eq_v``; or ``per_layer_config``) and whether their
        keys are their values."""
        k_eq_v = bool(config.get("attention_k_eq_v", False))
        width, kv = config.get("global_head_dim") or DEFAULTS["global_head_dim"], None
        if k_eq_v and config.get("num_global_key_value_heads") is not None:
            kv = int(config["num_global_key_value_heads"])
        overrides = config.get("per_layer_config")
        if overrides:
            full = [i for i, t in enumerate(types) if t == FULL_ATTENTION]
            entries = {int(k): dict(v) for k, v in dict(overrides).items()}
            found = {tuple(sorted(v.items())) for v in entries.values()}
            if (
                set(entries) != set(full)
                or len(found) != 1
                or not set(entries[full[0]]) <= {"head_dim", "num_key_value_heads"}
            ):
                raise unsupported("per_layer_config", overrides, "only the full layers' head_dim and key/value heads")
            entry = entries[full[0]]
            width = entry.get("head_dim", config["head_dim"])
            kv = entry.get("num_key_value_heads")
        return {
            "architecture/global_head_dim": int(width),
            "architecture/global_kv_heads": None if kv is None else int(kv),
            "architecture/attention_k_eq_v": k_eq_v,
        }

    def layers(self, config: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """Gemma 3's ``layer_types`` (default: every sixth layer full) with the last layer full."""
        types = config.get("layer_types")
        if types is None:
            types = pattern_layer_types(n_layers, int(config.get("sliding_window_pattern") or self.full_every))
        types = list(types)
        if types and types[-1] != FULL_ATTENTION:
            types[-1] = FULL_ATTENTION  # as transformers makes it
        return super().layers({**config, "layer_types": types}, n_layers)

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The full layers' proportional (or default) RoPE and the sliding layers' base."""
        parameters = config.get("rope_parameters") or DEFAULT_ROPE
        full = parameters.get(FULL_ATTENTION) or DEFAULT_ROPE[FULL_ATTENTION]
        local = parameters.get(SLIDING_ATTENTION) or DEFAULT_ROPE[SLIDING_ATTENTION]
        kind = full.get("rope_type", "default")
        if kind not in ("proportional", "default"):
            raise unsupported(f"rope_parameters.{FULL_ATTENTION}.rope_type", kind, "supported: proportional, default")
        local_kind = local.get("rope_type", "default")
        if local_kind != "default":
            raise unsupported(f"rope_parameters.{SLIDING_ATTENTION}.rope_type", local_kind, "supported: default")
        proportional = kind == "proportional"
        factor = float(full.get("factor", 1.0)) if proportional else 1.0
        return {
            "architecture/rope_theta": float(full.get("rope_theta", DEFAULT_ROPE[FULL_ATTENTION]["rope_theta"])),
            "architecture/rope_scaling": "none" if factor == 1.0 else "linear",
            "architecture/rope_factor": factor,
            "architecture/partial_rotary_factor": float(full.get("partial_rotary_factor", 1.0))
            if proportional
            else 1.0,
            "architecture/rope_local_theta": float(
                local.get("rope_theta", DEFAULT_ROPE[SLIDING_ATTENTION]["rope_theta"])
            ),
        }

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        g = gemma4(arch)
        e, p = g.n_embd, g.per_layer_dim
        maps = embedding_maps(arch)
        if p:
            width = g.n_layers * p
            maps += [
                padded_rows(
                    "model.embed_tokens_per_layer.weight",
                    ("per_layer_embedding", "embedding"),
                    g.per_layer_vocab,
                    g.padded_per_layer_vocab,
                    width,
                ),
                transposed("model.per_layer_model_projection.weight", ("per_layer_projection",), width, e),
                same("model.per_layer_projection_norm.weight", ("per_layer_norm", "scale"), (p,)),
            ]
        for i in range(g.n_layers):
            layer = dataclasses.replace(g, attention=g.layer_attention(i))
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            maps += self.layer_norm_maps(layer, i)
            no_values = g.k_eq_v and g.full(i)
            maps += [m for m in projection_maps(layer, i) if not (no_values and ".self_attn.v_proj." in m.hf)]
            if p:
                maps += [
                    transposed(hf + "per_layer_input_gate.weight", (ours, "per_layer_input", "gate"), p, e),
                    transposed(hf + "per_layer_projection.weight", (ours, "per_layer_input", "out"), e, p),
                    same(hf + "post_per_layer_input_norm.weight", (ours, "per_layer_input", "norm", "scale"), (e,)),
                ]
            maps.append(same(hf + "layer_scalar", (ours, "layer_scalar", "scale"), (1,)))
        maps += head_maps(arch)
        return maps

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """Gemma's modules; a full layer whose keys are its values has no ``v_proj``."""
        layout = super().peft_layout(arch, layer)
        g = gemma4(arch)
        if not (g.k_eq_v and g.full(layer)):
            return layout
        return dataclasses.replace(layout, modules={k: v for k, v in layout.modules.items() if k != "value"})

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        g = gemma4(arch)
        if arch.norm.zero_centred:
            raise cannot(self.model_type, "zero-centred norms")
        if arch.attention.query_pre_attn_scalar not in (None, 1.0):
            raise cannot(self.model_type, f"architecture/query_pre_attn_scalar={arch.attention.query_pre_attn_scalar}")
        if g.global_kv_heads not in (None, arch.attention.kv_heads) and not g.k_eq_v:
            raise cannot(self.model_type, "other key/value heads on the full layers without attention_k_eq_v")
        config = super().config(arch, settings)
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping"):
            config.pop(name, None)
        if config["layer_types"][-1] != FULL_ATTENTION:
            raise cannot(self.model_type, "a last layer that is not full_attention")
        return {
            **config,
            "use_bidirectional_attention": None,
            "global_head_dim": g.global_head_dim,
            "num_global_key_value_heads": g.global_kv_heads if g.k_eq_v else None,
            "attention_k_eq_v": g.k_eq_v,
            "hidden_size_per_layer_input": g.per_layer_dim,
            "vocab_size_per_layer_input": g.per_layer_vocab if g.per_layer_dim else arch.vocab_size,
            "num_kv_shared_layers": 0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
        }

    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        g = gemma4(arch)
        full: dict[str, Any] = {
            "rope_type": "proportional",
            "partial_rotary_factor": g.rope_fraction,
            "rope_theta": arch.position.theta,
        }
        if arch.position.scaling.kind == "linear":
            full["factor"] = arch.position.scaling.factor
        return {
            "rope_parameters": {
                SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": arch.position.local},
                FULL_ATTENTION: full,
            }
        }


class Gemma4Family(NestedLanguageModel, Gemma4TextFamily):
    """``model_type: gemma4``: the language model of a Gemma 4 checkpoint (``text_config``,
    ``model.language_model.``); the vision and audio towers (:data:`TOWERS`) are skipped. A run of it exports
    as ``gemma4_text``."""

    identity: ClassVar[Identity] = Identity("gemma4", "Gemma4ForConditionalGeneration")
    towers: ClassVar[tuple[str, ...]] = TOWERS
    text: ClassVar[Identity] = Gemma4TextFamily.identity


__all__ = ["GEMMA4_CLASS", "Gemma4Family", "Gemma4TextFamily", "padded_rows"]
