"""The types of the ``config.json`` fields that families read, checked once before any family reads them.

A damaged or hand-edited ``config.json`` (``"hidden_size": "32"``, ``"rope_scaling": []``, ``"rms_norm_eps":
NaN``) is refused in one line naming the field, whatever the family; ``checked_keys`` turns anything a
family still trips over into the same kind of line.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
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
            "num_local_experts",
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


def checked_keys(family: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """``family.keys(config)`` after :func:`check_fields`; a value a family still cannot read (a field outside
    ``FIELDS``) is one ConfigError naming the family, not a traceback."""
    check_fields(config)
    try:
        keys: dict[str, Any] = family.keys(config)
    except (TypeError, ValueError, LookupError, AttributeError, ArithmeticError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"config.json of this {family.model_type} checkpoint cannot be read ({type(exc).__name__}: {first}); "
            "a field holds a value of the wrong type or shape: use the config.json that came with the weights"
        ) from exc
    return keys
