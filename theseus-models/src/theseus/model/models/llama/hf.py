"""Llama, Mistral and Qwen2 checkpoints (the ``LlamaForCausalLM`` layout) <-> theseus' ``Llama``:
the ``hf/llama``, ``hf/mistral`` and ``hf/qwen2`` families.

The three share the tensor layout and most of ``config.json``; they differ in biases and the
sliding window. transformers and theseus use the same half-split RoPE layout, so no query/key
permutation is needed. Qwen3, OLMo 2/3, Gemma, Phi-3 and Mixtral build on these families;
the ``config.json`` fields several families share are in :mod:`theseus.model.huggingface.config_fields`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.config_fields import (
    decoder_shape,
    layer_window,
    qwen_window,
    rope_config,
    rope_keys,
    window_config,
)
from theseus.model.huggingface.family import HFFamily, Identity, cannot, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    heads_bias,
    heads_in,
    heads_out,
    same,
    transposed,
)
from theseus.model.stack.architecture import Architecture

LLAMA_CLASS = "theseus.model.models.llama.model:Llama"


def attention_peft_modules(prefix: str = "self_attn.", out: str = "o_proj") -> dict[str, str]:
    """The PEFT modules of the query, key, value and output (``out``) projections under ``prefix``."""
    return {"query": prefix + "q_proj", "key": prefix + "k_proj", "value": prefix + "v_proj", "out": prefix + out}


def mlp_peft_modules(prefix: str = "mlp.", targets: tuple[str, ...] = ("up", "gate", "down")) -> dict[str, str]:
    """The PEFT modules ``<target>_proj`` of the MLP's ``targets`` under ``prefix``."""
    return {target: f"{prefix}{target}_proj" for target in targets}


#: The attention projections' PEFT modules (alone: a mixture's families, as LoRA on its experts is refused).
ATTENTION_PEFT_MODULES = attention_peft_modules()
#: The dense SwiGLU MLP's PEFT modules.
MLP_PEFT_MODULES = mlp_peft_modules()


def attention_maps(arch: Architecture, layer: int, out: str = "o_proj") -> list[TensorMap]:
    """The query, key, value and output (``out``) projections of one layer (``model.layers.<layer>.self_attn.``),
    with the biases ``arch`` has."""
    e, h, kv, d = arch.n_embd, arch.attention.n_heads, arch.attention.kv_heads, arch.head_dim
    hf, ours = f"model.layers.{layer}.self_attn.", (f"blocks_{layer}", "attn")
    maps = []
    for name, ours_name, heads in (("q", "query", h), ("k", "key", kv), ("v", "value", kv)):
        maps.append(heads_in(hf + f"{name}_proj.weight", (*ours, ours_name), e, heads, d))
        if arch.attention.qkv_bias:
            maps.append(heads_bias(hf + f"{name}_proj.bias", (*ours, f"{ours_name}_bias"), heads, d))
    maps.append(heads_out(hf + f"{out}.weight", (*ours, "out"), e, h, d))
    if arch.attention.has_out_bias:
        maps.append(same(hf + f"{out}.bias", (*ours, "out_bias"), (e,)))
    return maps


def mlp_maps(
    arch: Architecture, hf: str, ours: tuple[str, ...], names: tuple[str, ...] = ("gate", "up", "down")
) -> list[TensorMap]:
    """The MLP's ``<name>_proj`` projections under ``hf`` (and their biases with ``mlp_bias``): ``gate``, ``up``
    and ``down`` of a gated MLP, ``up`` and ``down`` of one without a gate."""
    e, f = arch.n_embd, arch.feed_forward.d_ff
    maps = []
    for name in names:
        out_features, in_features = (e, f) if name == "down" else (f, e)
        maps.append(transposed(hf + f"{name}_proj.weight", (*ours, name, "kernel"), out_features, in_features))
        if arch.feed_forward.bias:
            maps.append(same(hf + f"{name}_proj.bias", (*ours, name, "bias"), (out_features,)))
    return maps


def projection_maps(arch: Architecture, layer: int) -> list[TensorMap]:
    """The attention and MLP projections of one layer (``model.layers.<layer>.``), without its norms."""
    return attention_maps(arch, layer) + mlp_maps(arch, f"model.layers.{layer}.mlp.", (f"blocks_{layer}", "mlp"))


class LlamaFamily(HFFamily):
    """``model_type: llama`` (Llama 2 and 3); the base of the Mistral and Qwen2 families."""

    identity: ClassVar[Identity] = Identity("llama", "LlamaForCausalLM", LLAMA_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = {**ATTENTION_PEFT_MODULES, **MLP_PEFT_MODULES}

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        activation = config.get("hidden_act", "silu")
        if activation != "silu":
            raise unsupported("hidden_act", activation, "supported: silu")
        n_embd = int(require(config, "hidden_size"))
        n_heads = int(require(config, "num_attention_heads"))
        n_kv = config.get("num_key_value_heads")
        head_dim = config.get("head_dim")
        if head_dim is None and n_embd % n_heads == 0:  # explicit, so that no preset's head width applies (Qwen3)
            head_dim = n_embd // n_heads
        keys: dict[str, Any] = {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/n_layers": int(require(config, "num_hidden_layers")),
            "architecture/n_heads": n_heads,
            "architecture/n_kv_heads": n_heads if n_kv is None else int(n_kv),
            "architecture/n_embd": n_embd,
            "architecture/d_ff": int(require(config, "intermediate_size")),
            "architecture/activation": "swiglu",
            "architecture/norm_eps": float(config.get("rms_norm_eps", 1e-6)),
            "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            "architecture/head_dim": None if head_dim is None else int(head_dim),
            "architecture/dropout": 0.0,
            **self.rope(config),
            **self.bias_keys(config),
        }
        block = int(config.get("max_position_embeddings", 2048))
        window = self.window(config)
        if window is not None and window > block:
            window = None  # longer than any sequence the model reads: full attention (Phi-3-mini-128k's 262144)
        if self.windowed or window is not None:
            keys["architecture/sliding_window"] = window
        keys["architecture/block_size"] = block
        return keys

    #: Whether the family always has the ``sliding_window`` field (Mistral).
    windowed: ClassVar[bool] = False
    #: Whether the family's checkpoints can hold an attention window.
    holds_window: ClassVar[bool] = False

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        bias = bool(config.get("attention_bias", False))
        return {
            "architecture/attention_bias": bias,
            "architecture/attention_out_bias": bias,
            "architecture/mlp_bias": bool(config.get("mlp_bias", False)),
        }

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """The ``architecture/rope_*`` keys (:func:`rope_keys`)."""
        return rope_keys(config)

    def window(self, config: Mapping[str, Any]) -> int | None:
        """Every layer's attention window (:func:`layer_window`)."""
        return layer_window(config, self.sliding_window(config))

    def sliding_window(self, config: Mapping[str, Any]) -> int | None:
        window = config.get("sliding_window")
        return None if window is None else int(window)

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            maps.extend(self.layer_norm_maps(arch, i))
            maps.extend(projection_maps(arch, i))
        maps += head_maps(arch)
        return maps

    def layer_norm_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """The norms of one layer (query/key norms included): Llama's ``input_layernorm`` before the
        attention and ``post_attention_layernorm`` before the MLP. Families with other norms override it."""
        hf, ours = f"model.layers.{layer}.", f"blocks_{layer}"
        return [
            same(hf + "input_layernorm.weight", (ours, "attn_norm", "scale"), (arch.n_embd,)),
            same(hf + "post_attention_layernorm.weight", (ours, "mlp_norm", "scale"), (arch.n_embd,)),
        ]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        if arch.feed_forward.activation != "swiglu":
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.sliding_window is not None and not self.holds_window:
            raise cannot(self.model_type, f"architecture/sliding_window={arch.attention.sliding_window}")
        self.check_biases(arch)
        return {
            **decoder_shape(arch),
            "hidden_act": "silu",
            "rope_theta": arch.position.theta,
            "attention_dropout": 0.0,
            **self.rope_config(arch),
            **self.family_config(arch),
        }

    def rope_config(self, arch: Architecture) -> dict[str, Any]:
        """``rope_parameters`` / ``rope_scaling`` (:func:`rope_config`)."""
        return rope_config(arch)

    def check_biases(self, arch: Architecture) -> None:
        if arch.attention.qkv_bias != arch.attention.has_out_bias:
            raise cannot(self.model_type, "different query/key/value and output biases")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"attention_bias": arch.attention.qkv_bias, "mlp_bias": arch.feed_forward.bias}

    def peft_layer_prefix(self, layer: int) -> str:
        return f"model.layers.{layer}."


class AttentionBiasFamily(LlamaFamily):
    """A Llama-layout family whose one ``attention_bias`` covers query, key, value and output
    projections and whose MLP has no biases (the base of Qwen3's and OLMo 2's families)."""

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        bias = bool(config.get("attention_bias", False))
        return {
            "architecture/attention_bias": bias,
            "architecture/attention_out_bias": bias,
            "architecture/mlp_bias": False,
        }

    def check_biases(self, arch: Architecture) -> None:
        super().check_biases(arch)
        if arch.feed_forward.bias:
            raise cannot(self.model_type, "MLP biases")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"attention_bias": arch.attention.qkv_bias}


class MistralFamily(LlamaFamily):
    """``model_type: mistral``: Llama's layout with a sliding window and no biases."""

    identity: ClassVar[Identity] = Identity("mistral", "MistralForCausalLM")
    windowed: ClassVar[bool] = True
    holds_window: ClassVar[bool] = True

    def describes(self, arch: Architecture) -> bool:
        return arch.attention.sliding_window is not None and not arch.attention.qkv_bias

    def check_biases(self, arch: Architecture) -> None:
        super().check_biases(arch)
        if arch.attention.qkv_bias:
            raise cannot(self.model_type, "attention biases")
        if arch.feed_forward.bias:
            raise cannot(self.model_type, "MLP biases")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return {"sliding_window": arch.attention.sliding_window}


class Qwen2Family(LlamaFamily):
    """``model_type: qwen2``: Llama's layout with query/key/value biases only."""

    identity: ClassVar[Identity] = Identity("qwen2", "Qwen2ForCausalLM")
    holds_window: ClassVar[bool] = True

    def describes(self, arch: Architecture) -> bool:
        return arch.attention.qkv_bias and not arch.attention.has_out_bias and not arch.feed_forward.bias

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "architecture/attention_bias": True,
            "architecture/attention_out_bias": False,
            "architecture/mlp_bias": False,
        }

    def window(self, config: Mapping[str, Any]) -> int | None:
        return qwen_window(config, self.sliding_window(config))

    def check_biases(self, arch: Architecture) -> None:
        if not arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "these biases (it has query/key/value biases only)")

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        return window_config(arch)


__all__ = [
    "ATTENTION_PEFT_MODULES",
    "LLAMA_CLASS",
    "MLP_PEFT_MODULES",
    "AttentionBiasFamily",
    "LlamaFamily",
    "MistralFamily",
    "Qwen2Family",
    "attention_maps",
    "projection_maps",
]
