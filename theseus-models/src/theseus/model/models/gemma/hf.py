"""Gemma 2 and Gemma 3 text checkpoints (``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``) <-> theseus'
``Gemma2`` / ``Gemma3``: the ``hf/gemma2`` and ``hf/gemma3_text`` families.

Llama's tensor layout with four norms per layer: ``input_layernorm`` / ``post_attention_layernorm``
around the attention and ``pre_feedforward_layernorm`` / ``post_feedforward_layernorm`` around the
MLP; Gemma 3 adds ``self_attn.q_norm`` / ``k_norm`` per head. The norm weights are stored as they
are (``w``; both sides multiply by ``1 + w``). ``layer_types`` and the window are read as written;
Gemma 3's ``rope_parameters`` give the full and the sliding layers a base each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.errors import ConfigError
from theseus.model.huggingface.config_fields import decoder_shape, plain_rope_theta
from theseus.model.huggingface.family import Identity, cannot, require, unsupported
from theseus.model.huggingface.names import TensorMap, same
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.models.llama.hf import AttentionBiasFamily
from theseus.model.stack.architecture import Architecture
from theseus.model.stack.windows import pattern_layer_types

GEMMA2_CLASS = "theseus.model.models.gemma.model:Gemma2"
GEMMA3_CLASS = "theseus.model.models.gemma.model:Gemma3"

#: transformers' names of the tanh-approximate GELU.
TANH_GELU = ("gelu_pytorch_tanh",)

#: theseus' norm of each checkpoint norm of a layer.
LAYER_NORMS = {
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "attn_out_norm",
    "pre_feedforward_layernorm": "mlp_norm",
    "post_feedforward_layernorm": "mlp_out_norm",
}


def whole(value: float) -> int | float:
    """``value`` as an int when it is one (transformers types ``query_pre_attn_scalar`` as int)."""
    return int(value) if float(value).is_integer() else value


class Gemma2Family(AttentionBiasFamily):
    """``model_type: gemma2``."""

    identity: ClassVar[Identity] = Identity("gemma2", "Gemma2ForCausalLM", GEMMA2_CLASS)
    #: transformers' layer_types when config.json has none: every this many layers one is full.
    full_every: ClassVar[int] = 2
    #: Whether the family has per-head query/key norms (Gemma 3).
    qk_norm: ClassVar[bool] = False
    #: Whether transformers applies ``attn_logit_softcapping`` (Gemma 2 only).
    caps_attention: ClassVar[bool] = True
    #: The ``architecture/rope_scaling`` kinds the family's checkpoints express.
    rope_scalings: ClassVar[tuple[str, ...]] = ("none",)

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        activation = config.get("hidden_activation", config.get("hidden_act", "gelu_pytorch_tanh"))
        if activation not in TANH_GELU:
            raise unsupported("hidden_activation", activation, "supported: gelu_pytorch_tanh")
        if config.get("use_bidirectional_attention"):
            raise unsupported("use_bidirectional_attention", True, "theseus models are causal")
        n_layers = int(require(config, "num_hidden_layers"))
        n_embd = int(require(config, "hidden_size"))
        n_heads = int(require(config, "num_attention_heads"))
        head_dim = config.get("head_dim") or n_embd // n_heads
        keys: dict[str, Any] = {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/n_layers": n_layers,
            "architecture/n_heads": n_heads,
            "architecture/n_kv_heads": int(config.get("num_key_value_heads") or n_heads),
            "architecture/n_embd": n_embd,
            "architecture/d_ff": int(require(config, "intermediate_size")),
            "architecture/head_dim": int(head_dim),
            "architecture/activation": "geglu",
            "architecture/norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", True)),
            "architecture/dropout": 0.0,
            "architecture/rope_scaling": "none",
            "architecture/query_pre_attn_scalar": float(config.get("query_pre_attn_scalar") or head_dim),
            "architecture/final_softcap": float(config.get("final_logit_softcapping") or 0.0),
            "architecture/attn_softcap": float(
                (config.get("attn_logit_softcapping") or 0.0) if self.caps_attention else 0.0
            ),
            "architecture/block_size": int(config.get("max_position_embeddings", 8192)),
            **self.bias_keys(config),
            **self.rope(config),
            **self.layers(config, n_layers),
        }
        return keys

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """One base for every layer (Gemma 2)."""
        parameters = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
        theta = plain_rope_theta(parameters, "rope_parameters", float(config.get("rope_theta", 10000.0)))
        return {"architecture/rope_theta": theta, "architecture/rope_local_theta": None}

    def layers(self, config: Mapping[str, Any], n_layers: int) -> dict[str, Any]:
        """``layer_types`` (or transformers' default pattern) and the window of the sliding layers."""
        types = config.get("layer_types")
        if types is None:
            every = int(config.get("sliding_window_pattern") or self.full_every)
            types = pattern_layer_types(n_layers, every)
        types = list(types)
        if len(types) != n_layers or not set(types) <= {SLIDING_ATTENTION, FULL_ATTENTION}:
            raise unsupported(
                "layer_types", types, f"expected {n_layers} of {SLIDING_ATTENTION!r} / {FULL_ATTENTION!r}"
            )
        window = config.get("sliding_window")
        if SLIDING_ATTENTION in types and window is None:
            raise ConfigError(
                "config.json has sliding_attention layers but no sliding_window; the checkpoint is incomplete"
            )
        return {
            "architecture/layer_types": types,
            "architecture/sliding_window": None if window is None else int(window),
        }

    # -- both ways ---------------------------------------------------------------------------------
    def layer_norm_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """The four norms around the branches, and Gemma 3's per-head query/key norms."""
        hf, ours = f"model.layers.{layer}.", f"blocks_{layer}"
        maps = [
            same(hf + f"{name}.weight", (ours, norm, "scale"), (arch.n_embd,)) for name, norm in LAYER_NORMS.items()
        ]
        if self.qk_norm:
            for name, norm in (("q_norm", "query_norm"), ("k_norm", "key_norm")):
                maps.append(same(hf + f"self_attn.{name}.weight", (ours, "attn", norm, "scale"), (arch.head_dim,)))
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        if arch.feed_forward.activation != "geglu":
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.position.scaling.kind not in self.rope_scalings:
            raise cannot(self.model_type, f"architecture/rope_scaling={arch.position.scaling.kind}")
        if arch.attention.softcap is not None and not self.caps_attention:
            raise cannot(self.model_type, f"architecture/attn_softcap={arch.attention.softcap}")
        if arch.attention.qk_norm != self.qk_norm:
            raise cannot(self.model_type, f"qk_norm={arch.attention.qk_norm}")
        self.check_biases(arch)
        types = list(
            arch.layer_types or [SLIDING_ATTENTION if arch.attention.sliding_window else FULL_ATTENTION] * arch.n_layers
        )
        return {
            **decoder_shape(arch),
            "hidden_activation": "gelu_pytorch_tanh",
            "attention_bias": arch.attention.qkv_bias,
            "attention_dropout": 0.0,
            "query_pre_attn_scalar": whole(arch.attention.query_pre_attn_scalar or arch.head_dim),
            "sliding_window": arch.attention.sliding_window or arch.block_size,
            "layer_types": types,
            "final_logit_softcapping": arch.final_softcap,
            "attn_logit_softcapping": arch.attention.softcap,
            "use_bidirectional_attention": False,
            **self.rope_config(arch),
        }

    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        if arch.position.local_theta not in (None, arch.position.theta):
            raise cannot(self.model_type, "a separate rotary base for the sliding layers")
        return {"rope_parameters": {"rope_type": "default", "rope_theta": arch.position.theta}}


class Gemma3TextFamily(Gemma2Family):
    """``model_type: gemma3_text`` (the text-only Gemma 3 models, e.g. gemma-3-1b)."""

    identity: ClassVar[Identity] = Identity("gemma3_text", "Gemma3ForCausalLM", GEMMA3_CLASS)
    full_every: ClassVar[int] = 6
    qk_norm: ClassVar[bool] = True
    caps_attention: ClassVar[bool] = False
    rope_scalings: ClassVar[tuple[str, ...]] = ("none", "linear")

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The full layers' and the sliding layers' bases (``rope_parameters`` per layer type, or the
        older ``rope_theta`` / ``rope_local_base_freq`` / ``rope_scaling``), and the full layers'
        ``linear`` scaling (the 4B and larger releases)."""
        parameters = config.get("rope_parameters") or {}
        if parameters and FULL_ATTENTION not in parameters and SLIDING_ATTENTION not in parameters:
            parameters = {FULL_ATTENTION: parameters}  # one entry for the full layers
        full = {**(parameters.get(FULL_ATTENTION) or {}), **(config.get("rope_scaling") or {})}
        local = parameters.get(SLIDING_ATTENTION) or {}
        field = f"rope_parameters.{FULL_ATTENTION}"
        theta = plain_rope_theta(full, field, float(config.get("rope_theta", 1e6)), ("default", "linear"))
        linear = full.get("rope_type", full.get("type")) == "linear"
        return {
            "architecture/rope_theta": theta,
            "architecture/rope_scaling": "linear" if linear else "none",
            "architecture/rope_factor": float(full["factor"]) if linear else 1.0,
            "architecture/rope_local_theta": plain_rope_theta(
                local, f"rope_parameters.{SLIDING_ATTENTION}", float(config.get("rope_local_base_freq", 1e4))
            ),
        }

    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        local = arch.position.theta if arch.position.local_theta is None else arch.position.local_theta
        return {
            "rope_parameters": {
                SLIDING_ATTENTION: {"rope_type": "default", "rope_theta": local},
                FULL_ATTENTION: {"rope_type": "default", "rope_theta": arch.position.theta}
                if arch.position.scaling.kind == "none"
                else {"rope_type": "linear", "rope_theta": arch.position.theta, "factor": arch.position.scaling.factor},
            }
        }


__all__ = ["GEMMA2_CLASS", "GEMMA3_CLASS", "Gemma2Family", "Gemma3TextFamily"]
