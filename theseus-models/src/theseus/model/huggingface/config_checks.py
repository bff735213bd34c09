"""The types of the ``config.json`` fields that families read, checked once before any family reads them,
and the sizes they claim, checked against the weights present.

A damaged or hand-edited ``config.json`` (``"hidden_size": "32"``, ``"rope_scaling": []``, ``"rms_norm_eps":
NaN``) is refused in one line naming the field, whatever the family; so is a layer count, width, head
count or vocabulary larger than the checkpoint's tensors could hold (``"n_layer": 10**12`` would otherwise
plan a trillion layers before the first missing tensor is noticed). ``checked_keys`` turns anything a
family still trips over into the same kind of line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from theseus.config.types import shown
from theseus.errors import ConfigError


def _count(value: Any, least: int) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return (isinstance(value, int) or (math.isfinite(value) and value.is_integer())) and value >= least


def _positive(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return value > 0 and (isinstance(value, int) or math.isfinite(value))


#: What a field must hold (null always passes: families say which fields they require).
Check = tuple[str, Callable[[Any], bool]]
POSITIVE_INTEGER: Check = ("a positive integer", lambda v: _count(v, 1))
COUNT: Check = ("an integer >= 0", lambda v: _count(v, 0))
POSITIVE_NUMBER: Check = ("a finite number > 0", _positive)
FRACTION: Check = ("a number in (0, 1]", lambda v: _positive(v) and v <= 1)
BOOLEAN: Check = ("true or false", lambda v: isinstance(v, bool))
TEXT: Check = ("a string", lambda v: isinstance(v, str))
MAPPING: Check = ("a JSON object", lambda v: isinstance(v, Mapping))
TEXT_LIST: Check = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))

FIELDS: dict[str, Check] = {
    **dict.fromkeys(
        (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "moe_intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "original_max_position_embeddings",
            "sliding_window",
            "num_experts",
            "num_experts_per_tok",
            "n_embd",
            "n_layer",
            "n_head",
            "n_positions",
            "n_ctx",
            "n_inner",
        ),
        POSITIVE_INTEGER,
    ),
    "max_window_layers": COUNT,
    "num_local_experts": COUNT,  # 0: Granite's dense releases (the mixture families refuse it themselves)
    **dict.fromkeys(("rope_theta", "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"), POSITIVE_NUMBER),
    "partial_rotary_factor": FRACTION,
    **dict.fromkeys(("tie_word_embeddings", "attention_bias", "mlp_bias", "use_sliding_window"), BOOLEAN),
    **dict.fromkeys(("model_type", "hidden_act", "activation_function"), TEXT),
    **dict.fromkeys(("rope_scaling", "rope_parameters", "text_config"), MAPPING),
    "layer_types": TEXT_LIST,
}
#: The fields of a ``rope_scaling`` / ``rope_parameters`` entry.
ROPE_FIELDS: dict[str, Check] = {
    **dict.fromkeys(("rope_type", "type"), TEXT),
    **dict.fromkeys(
        ("factor", "low_freq_factor", "high_freq_factor", "beta_fast", "beta_slow", "rope_theta"), POSITIVE_NUMBER
    ),
    "original_max_position_embeddings": POSITIVE_INTEGER,
    "partial_rotary_factor": FRACTION,
}


#: Fields that count layers: each layer holds tensors of its own, so a checkpoint holds more tensors than layers.
LAYER_COUNTS = ("num_hidden_layers", "n_layer", "num_nextn_predict_layers", "first_k_dense_replace")
#: Widths, head and expert counts and vocabularies: each is a dimension of some tensor (or a factor of one),
#: or counts tensors (experts stored one tensor each), so it is at most the larger of the two.
SIZES = (
    "vocab_size",
    "vocab_size_per_layer_input",
    "hidden_size",
    "hidden_size_per_layer_input",
    "n_embd",
    "intermediate_size",
    "intermediate_size_mlp",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "n_inner",
    "num_attention_heads",
    "n_head",
    "num_key_value_heads",
    "head_dim",
    "global_head_dim",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "n_shared_experts",
    "num_experts_per_tok",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "qk_rope_head_dim",
    "v_head_dim",
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "index_n_heads",
    "index_head_dim",
)


@dataclass(frozen=True)
class WeightSizes:
    """What a checkpoint's weights can hold: how many tensors, and the largest dimension among them (the
    safetensors reader bounds each dimension by its file's size)."""

    tensors: int
    largest: int

    @classmethod
    def of(cls, shapes: Iterable[tuple[int, ...]]) -> WeightSizes:
        listed = list(shapes)
        return cls(len(listed), max((d for shape in listed for d in shape), default=0))


def check_claims(config: Mapping[str, Any], weights: WeightSizes, prefix: str = "") -> None:
    """ConfigError (one line naming the field) for a layer count above the number of tensors, or a size
    (:data:`SIZES`) above both the largest dimension and the number of tensors, in ``config`` or its
    ``text_config``: refused before any plan is built for it."""
    bounds = {
        **dict.fromkeys(LAYER_COUNTS, weights.tensors),
        **dict.fromkeys(SIZES, max(weights.tensors, weights.largest)),
    }
    for name, bound in bounds.items():
        value = config.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not value <= bound:
            raise ConfigError(
                f"config.json field {prefix}{name}={shown(value)} is more than the checkpoint's weights hold "
                f"({weights.tensors} tensors, none with a dimension over {weights.largest}); the configuration "
                "does not belong to these weights: use the config.json that came with them"
            )
    text = config.get("text_config")
    if isinstance(text, Mapping) and not prefix:
        check_claims(text, weights, "text_config.")


def check_fields(config: Mapping[str, Any], prefix: str = "") -> None:
    """ConfigError (one line) for the first field of ``config`` (or of its RoPE entries, or of its
    ``text_config``) that does not hold what ``FIELDS`` says."""
    _check(config, FIELDS, prefix)
    for name in ("rope_scaling", "rope_parameters"):
        entry = config.get(name)
        if isinstance(entry, Mapping):
            _check(entry, ROPE_FIELDS, f"{prefix}{name}.")
    text = config.get("text_config")
    if isinstance(text, Mapping) and not prefix:
        check_fields(text, "text_config.")


def _check(config: Mapping[str, Any], fields: Mapping[str, Check], prefix: str) -> None:
    for name, (what, holds) in fields.items():
        value = config.get(name)
        if value is not None and not holds(value):
            raise ConfigError(
                f"config.json field {prefix}{name}={shown(value)} is not {what}; the checkpoint's configuration "
                "is damaged: use the config.json that came with the weights"
            )


def checked_keys(family: Any, config: Mapping[str, Any], weights: WeightSizes) -> dict[str, Any]:
    """``family.keys(config)`` after :func:`check_fields` and :func:`check_claims` against the checkpoint's
    ``weights``; a value a family still cannot read (a field outside ``FIELDS``) is one ConfigError naming
    the family, not a traceback."""
    check_fields(config)
    check_claims(config, weights)
    try:
        keys: dict[str, Any] = family.keys(config)
    except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"config.json of this {family.model_type} checkpoint cannot be read ({type(exc).__name__}: {first}); "
            "a field holds a value of the wrong type or shape: use the config.json that came with the weights"
        ) from exc
    return keys
