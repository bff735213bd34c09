"""Hugging Face ``config.json`` <-> theseus architecture keys, per model family.

Import reads a ``config.json`` into the model class and the ``architecture/*`` keys that rebuild
the same network; export writes the ``config.json`` of a resolved :class:`Architecture`. A field
theseus cannot honour is refused with one line naming the field and its value, never ignored.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from theseus.errors import ConfigError
from theseus.model.models.architecture import Architecture

GPT_CLASS = "theseus.model.models.gpt:GPT"
LLAMA_CLASS = "theseus.model.models.llama:Llama"

#: model_type -> (theseus model class, transformers architecture class)
FAMILIES: dict[str, tuple[str, str]] = {
    "gpt2": (GPT_CLASS, "GPT2LMHeadModel"),
    "llama": (LLAMA_CLASS, "LlamaForCausalLM"),
    "mistral": (LLAMA_CLASS, "MistralForCausalLM"),
    "qwen2": (LLAMA_CLASS, "Qwen2ForCausalLM"),
}

_GPT2_ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu"}
_GPT2_ACTIVATION_NAMES = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu"}


@dataclass(frozen=True)
class Imported:
    """What a ``config.json`` becomes: the family, the theseus model class and its configuration keys."""

    family: str
    model_class: str
    keys: dict[str, Any]


def unsupported(field: str, value: Any, why: str = "") -> ConfigError:
    reason = f" ({why})" if why else ""
    return ConfigError(f"config.json field {field}={value!r} is not supported by theseus{reason}")


def _require(config: Mapping[str, Any], field: str) -> Any:
    if config.get(field) is None:
        raise ConfigError(f"config.json has no {field!r}; the checkpoint's configuration is incomplete")
    return config[field]


def _expect(config: Mapping[str, Any], field: str, allowed: Any) -> None:
    value = config.get(field, allowed)
    if value != allowed:
        raise unsupported(field, value)


def from_config(config: Mapping[str, Any]) -> Imported:
    """The family, model class and ``architecture/*`` keys of a Hugging Face ``config.json``."""
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise ConfigError(f"config.json model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    family = str(model_type)
    keys = _gpt2_keys(config) if family == "gpt2" else _llama_keys(config, family)
    return Imported(family, FAMILIES[family][0], keys)


def _gpt2_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    activation = config.get("activation_function", "gelu_new")
    if activation not in _GPT2_ACTIVATIONS:
        raise unsupported("activation_function", activation, f"supported: {', '.join(_GPT2_ACTIVATIONS)}")
    _expect(config, "scale_attn_weights", True)
    _expect(config, "scale_attn_by_inverse_layer_idx", False)
    _expect(config, "add_cross_attention", False)
    n_embd = int(_require(config, "n_embd"))
    inner = config.get("n_inner")
    return {
        "architecture/vocab_size": int(_require(config, "vocab_size")),
        "architecture/block_size": int(_require(config, "n_positions")),
        "architecture/n_layers": int(_require(config, "n_layer")),
        "architecture/n_heads": int(_require(config, "n_head")),
        "architecture/n_kv_heads": int(_require(config, "n_head")),
        "architecture/n_embd": n_embd,
        "architecture/d_ff": int(inner) if inner is not None else 4 * n_embd,
        "architecture/activation": _GPT2_ACTIVATIONS[activation],
        "architecture/norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
        "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", True)),
        "architecture/dropout": 0.0,
    }


def _rope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    parameters = config.get("rope_parameters") or {}
    legacy = config.get("rope_scaling") or {}
    scaling = {**parameters, **legacy}
    theta = config.get("rope_theta", scaling.get("rope_theta", 10000.0))
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    field = "rope_scaling.rope_type" if "rope_type" in scaling or "type" not in scaling else "rope_scaling.type"
    partial = config.get("partial_rotary_factor", scaling.get("partial_rotary_factor", 1.0))
    if partial != 1.0:
        raise unsupported("partial_rotary_factor", partial)
    keys: dict[str, Any] = {"architecture/rope_theta": float(theta)}
    if kind == "default":
        keys["architecture/rope_scaling"] = "none"
    elif kind == "linear":
        keys.update({"architecture/rope_scaling": "linear", "architecture/rope_factor": float(scaling["factor"])})
    elif kind == "llama3":
        keys.update(
            {
                "architecture/rope_scaling": "llama3",
                "architecture/rope_factor": float(scaling["factor"]),
                "architecture/rope_low_freq_factor": float(scaling.get("low_freq_factor", 1.0)),
                "architecture/rope_high_freq_factor": float(scaling.get("high_freq_factor", 4.0)),
                "architecture/rope_original_max_positions": int(scaling["original_max_position_embeddings"]),
            }
        )
    else:
        raise unsupported(field, kind, "supported: default, linear, llama3")
    return keys


def _llama_keys(config: Mapping[str, Any], family: str) -> dict[str, Any]:
    activation = config.get("hidden_act", "silu")
    if activation != "silu":
        raise unsupported("hidden_act", activation, "supported: silu")
    n_embd = int(_require(config, "hidden_size"))
    n_heads = int(_require(config, "num_attention_heads"))
    n_kv = config.get("num_key_value_heads")
    head_dim = config.get("head_dim")
    block_size = int(config.get("max_position_embeddings", 2048))
    keys: dict[str, Any] = {
        "architecture/vocab_size": int(_require(config, "vocab_size")),
        "architecture/n_layers": int(_require(config, "num_hidden_layers")),
        "architecture/n_heads": n_heads,
        "architecture/n_kv_heads": n_heads if n_kv is None else int(n_kv),
        "architecture/n_embd": n_embd,
        "architecture/d_ff": int(_require(config, "intermediate_size")),
        "architecture/activation": "swiglu",
        "architecture/norm_eps": float(config.get("rms_norm_eps", 1e-6)),
        "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", False)),
        "architecture/head_dim": None if head_dim is None or int(head_dim) * n_heads == n_embd else int(head_dim),
        "architecture/dropout": 0.0,
        **_rope_keys(config),
    }
    window = config.get("sliding_window")
    if family == "qwen2":
        keys.update({"architecture/attention_bias": True, "architecture/attention_out_bias": False})
        keys["architecture/mlp_bias"] = False
        if not config.get("use_sliding_window", False):
            window = None
    else:
        bias = bool(config.get("attention_bias", False))
        keys.update({"architecture/attention_bias": bias, "architecture/attention_out_bias": bias})
        keys["architecture/mlp_bias"] = bool(config.get("mlp_bias", False))
    if family == "mistral" or window is not None:
        keys["architecture/sliding_window"] = None if window is None else int(window)
        if window is not None:
            block_size = min(block_size, int(window))
    keys["architecture/block_size"] = block_size
    return keys


# -- export ---------------------------------------------------------------------------------------
def family_of(model_class: str, arch: Architecture, recorded: str | None = None) -> str:
    """The Hugging Face ``model_type`` a theseus model is exported as (the imported one when recorded)."""
    if recorded in FAMILIES and FAMILIES[recorded][0] == model_class:
        return str(recorded)
    if model_class == GPT_CLASS:
        return "gpt2"
    if model_class != LLAMA_CLASS:
        raise ConfigError(f"cannot export a {model_class} model; supported: theseus GPT and Llama models")
    if arch.qkv_bias and not arch.out_bias and not arch.ffn_bias:
        return "qwen2"
    if arch.sliding_window is not None:
        return "mistral"
    return "llama"


def to_config(family: str, arch: Architecture, *, dtype: str, bos_id: int | None, eos_id: int | None) -> dict[str, Any]:
    """The ``config.json`` of ``arch`` exported as ``family``; ConfigError when it cannot express it."""
    base: dict[str, Any] = {
        "architectures": [FAMILIES[family][1]],
        "model_type": family,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tied_embeddings,
        "dtype": dtype,
        "torch_dtype": dtype,
        "bos_token_id": bos_id,
        "eos_token_id": eos_id,
        "use_cache": True,
    }
    if family == "gpt2":
        return {**base, **_gpt2_config(arch)}
    return {**base, **_llama_config(family, arch)}


def _cannot(family: str, what: str) -> ConfigError:
    return ConfigError(f"a {family} checkpoint cannot express {what}; this model cannot be exported as {family}")


def _gpt2_config(arch: Architecture) -> dict[str, Any]:
    if arch.activation not in _GPT2_ACTIVATION_NAMES:
        raise _cannot("gpt2", f"architecture/activation={arch.activation}")
    if arch.n_kv_heads != arch.n_heads:
        raise _cannot("gpt2", "grouped-query attention (architecture/n_kv_heads)")
    if arch.head_dim * arch.n_heads != arch.n_embd:
        raise _cannot("gpt2", "architecture/head_dim different from n_embd / n_heads")
    if not (arch.qkv_bias and arch.out_bias and arch.ffn_bias and arch.use_bias):
        raise _cannot("gpt2", "projections without biases")
    return {
        "n_positions": arch.block_size,
        "n_embd": arch.n_embd,
        "n_layer": arch.n_layers,
        "n_head": arch.n_heads,
        "n_inner": arch.d_ff,
        "activation_function": _GPT2_ACTIVATION_NAMES[arch.activation],
        "layer_norm_epsilon": arch.norm_eps,
        "resid_pdrop": arch.dropout,
        "embd_pdrop": arch.dropout,
        "attn_pdrop": 0.0,
        "scale_attn_weights": True,
    }


def _llama_config(family: str, arch: Architecture) -> dict[str, Any]:
    if arch.activation != "swiglu":
        raise _cannot(family, f"architecture/activation={arch.activation}")
    if family == "qwen2":
        if not arch.qkv_bias or arch.out_bias or arch.ffn_bias:
            raise _cannot(family, "these biases (it has query/key/value biases only)")
    elif arch.qkv_bias != arch.out_bias:
        raise _cannot(family, "different query/key/value and output biases")
    elif family == "mistral" and arch.qkv_bias:
        raise _cannot(family, "attention biases")
    scaling = arch.rope_scaling
    config: dict[str, Any] = {
        "hidden_size": arch.n_embd,
        "intermediate_size": arch.d_ff,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.n_heads,
        "num_key_value_heads": arch.n_kv_heads,
        "head_dim": arch.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": arch.block_size,
        "rms_norm_eps": arch.norm_eps,
        "rope_theta": arch.rope_theta,
        "attention_dropout": 0.0,
    }
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": arch.rope_theta}
    if scaling.kind == "linear":
        rope = {**rope, "rope_type": "linear", "factor": scaling.factor}
    elif scaling.kind == "llama3":
        rope = {
            **rope,
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_positions,
        }
    config["rope_parameters"] = rope
    config["rope_scaling"] = None if scaling.kind == "none" else rope
    if family == "llama":
        config.update({"attention_bias": arch.qkv_bias, "mlp_bias": arch.ffn_bias})
    elif arch.ffn_bias:
        raise _cannot(family, "MLP biases")
    if family == "mistral":
        config["sliding_window"] = arch.sliding_window
    if family == "qwen2":
        config.update({"use_sliding_window": False, "sliding_window": None})
    return config
