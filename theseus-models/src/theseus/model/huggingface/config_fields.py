"""``config.json`` fields that several decoder families read and write alike: RoPE (``rope_theta``,
``rope_parameters`` / ``rope_scaling``), attention windows (``sliding_window``, ``layer_types``, Qwen's
``use_sliding_window`` / ``max_window_layers``) and the decoder sizes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from theseus.errors import ConfigError
from theseus.model.huggingface.family import require, unsupported
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.layers.rotary import yarn_mscale
from theseus.model.stack.windows import pattern_layer_types

if TYPE_CHECKING:
    from theseus.model.stack.architecture import Architecture


# ----------------------------------------------------------------- RoPE


def rope_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """``rope_theta`` and ``rope_scaling`` (default, linear, llama3, yarn) as ``architecture/rope_*`` keys."""
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
                "architecture/rope_original_max_positions": original_positions(config, scaling),
            }
        )
    elif kind == "yarn":
        keys.update(yarn_keys(config, scaling))
    else:
        raise unsupported(field, kind, "supported: default, linear, llama3, yarn")
    return keys


def partial_rotary_factor(config: Mapping[str, Any], default: float = 1.0) -> float:
    """The fraction of each head that RoPE rotates, as transformers reads it: the ``rope_parameters`` (or
    ``rope_scaling``) entry's ``partial_rotary_factor`` first, then the top-level field, else ``default``."""
    parameters = config.get("rope_parameters") or config.get("rope_scaling") or {}
    value = parameters.get("partial_rotary_factor", config.get("partial_rotary_factor"))
    return float(default if value is None else value)


def without_partial_rotary(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` less ``partial_rotary_factor`` (top level and RoPE entries), for :func:`rope_keys` in a
    family that reads the partial rotation apart (:func:`partial_rotary_factor`)."""
    stripped = {k: v for k, v in config.items() if k != "partial_rotary_factor"}
    for name in ("rope_parameters", "rope_scaling"):
        if isinstance(stripped.get(name), Mapping):
            stripped[name] = {k: v for k, v in stripped[name].items() if k != "partial_rotary_factor"}
    return stripped


def original_positions(config: Mapping[str, Any], scaling: Mapping[str, Any]) -> int:
    """The pre-scaling context length, as transformers reads it: a top-level
    ``original_max_position_embeddings`` first (Phi-3 style), then the rope entry's, else
    ``max_position_embeddings``."""
    value = config.get("original_max_position_embeddings") or scaling.get("original_max_position_embeddings")
    return int(value or require(config, "max_position_embeddings"))


def yarn_keys(config: Mapping[str, Any], scaling: Mapping[str, Any]) -> dict[str, Any]:
    """A ``yarn`` entry as ``architecture/rope_*`` keys, its defaults and attention factor resolved as
    transformers resolves them (``mscale`` over ``mscale_all_dim`` where both are set)."""
    original = original_positions(config, scaling)
    factor = scaling.get("factor") or int(require(config, "max_position_embeddings")) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")
        if mscale and mscale_all_dim:
            attention = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention = yarn_mscale(factor)
    return {
        "architecture/rope_scaling": "yarn",
        "architecture/rope_factor": float(factor),
        "architecture/rope_original_max_positions": original,
        "architecture/rope_beta_fast": float(scaling.get("beta_fast") or 32.0),
        "architecture/rope_beta_slow": float(scaling.get("beta_slow") or 1.0),
        "architecture/rope_truncate": bool(scaling.get("truncate", True)),
        "architecture/rope_attention_factor": float(attention),
    }


def plain_rope_theta(
    parameters: Mapping[str, Any], field: str, default: float, kinds: tuple[str, ...] = ("default",)
) -> float:
    """The base of one ``rope_parameters`` entry; a rope type outside ``kinds`` is refused."""
    kind = parameters.get("rope_type", parameters.get("type", "default"))
    if kind not in kinds:
        raise unsupported(f"{field}.rope_type", kind, f"supported: {', '.join(kinds)}")
    return float(parameters.get("rope_theta", default))


#: The fields each RoPE scaling writes into ``rope_parameters``: ``config.json``'s name, then the
#: :class:`~theseus.model.layers.rotary.RopeScaling` attribute it holds.
ROPE_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "linear": (("factor", "factor"),),
    "llama3": (
        ("factor", "factor"),
        ("low_freq_factor", "low_freq_factor"),
        ("high_freq_factor", "high_freq_factor"),
        ("original_max_position_embeddings", "original_max_positions"),
    ),
    "longrope": (
        ("short_factor", "short_factor"),
        ("long_factor", "long_factor"),
        ("original_max_position_embeddings", "original_max_positions"),
        ("attention_factor", "magnitude"),
    ),
    "yarn": (
        ("factor", "factor"),
        ("original_max_position_embeddings", "original_max_positions"),
        ("beta_fast", "beta_fast"),
        ("beta_slow", "beta_slow"),
        ("attention_factor", "magnitude"),
    ),
}


def rope_config(arch: Architecture) -> dict[str, Any]:
    """``rope_parameters`` / ``rope_scaling`` of ``arch`` as transformers writes them (:data:`ROPE_FIELDS`;
    a yarn scaling that does not truncate says so)."""
    scaling = arch.position.scaling
    rope: dict[str, Any] = {"rope_type": "default", "rope_theta": arch.position.theta}
    if scaling.kind in ROPE_FIELDS:
        rope["rope_type"] = scaling.kind
        for name, attribute in ROPE_FIELDS[scaling.kind]:
            value = getattr(scaling, attribute)
            rope[name] = list(value) if isinstance(value, tuple) else value
    if scaling.kind == "yarn" and not scaling.truncate:
        rope["truncate"] = False
    return {"rope_parameters": rope, "rope_scaling": None if scaling.kind == "none" else rope}


# ----------------------------------------------------------------- attention windows


def interleaved_layer_types(config: Mapping[str, Any], every: int) -> list[str]:
    """``config.json``'s ``layer_types``, or transformers' default pattern (sliding layers with every
    ``every``-th one full); one line unless it holds one sliding or full entry per layer."""

    n_layers = int(require(config, "num_hidden_layers"))
    types = config.get("layer_types")
    types = list(pattern_layer_types(n_layers, every) if types is None else types)
    if len(types) != n_layers or not set(types) <= {SLIDING_ATTENTION, FULL_ATTENTION}:
        raise unsupported("layer_types", types, f"expected {n_layers} of {SLIDING_ATTENTION!r} / {FULL_ATTENTION!r}")
    return types


def sliding_window_of(config: Mapping[str, Any], layer_types: list[str], default: int) -> int | None:
    """The sliding layers' window: ``config.json``'s ``sliding_window`` (``default`` when absent), None
    when no layer slides; ConfigError for sliding layers whose window is null."""
    if SLIDING_ATTENTION not in layer_types:
        return None
    window = config.get("sliding_window", default)
    if window is None:
        raise ConfigError(
            "config.json has sliding_attention layers but no sliding_window; the checkpoint is incomplete"
        )
    return int(window)


def layer_window(config: Mapping[str, Any], window: int | None, windowed_from: int | None = None) -> int | None:
    """The one attention window of every layer: ``window`` where ``config.json``'s ``layer_types`` (or,
    without them, layers ``windowed_from`` on) say ``sliding_attention``, None where all are full.

    A mix of windowed and full layers is refused in one line (for families whose model gives every
    layer one window)."""
    n_layers = int(require(config, "num_hidden_layers"))
    types = config.get("layer_types")
    if types is None:
        start = 0 if windowed_from is None else windowed_from
        types = [SLIDING_ATTENTION if window is not None and i >= start else FULL_ATTENTION for i in range(n_layers)]
    types = list(types)
    if len(types) != n_layers or not set(types) <= {SLIDING_ATTENTION, FULL_ATTENTION}:
        raise unsupported("layer_types", types, f"expected {n_layers} of {SLIDING_ATTENTION!r} / {FULL_ATTENTION!r}")
    if set(types) == {SLIDING_ATTENTION, FULL_ATTENTION}:
        raise unsupported("layer_types", types, "windowed and full layers in one model; every layer must be alike")
    if types[0] == FULL_ATTENTION:
        return None
    if window is None:
        raise ConfigError(
            "config.json has sliding_attention layers but no sliding_window; the checkpoint is incomplete"
        )
    return window


def qwen_window(config: Mapping[str, Any], window: int | None) -> int | None:
    """Qwen's window: ``sliding_window`` where ``use_sliding_window``, on the layers from
    ``max_window_layers`` on (or as ``layer_types`` say)."""
    used = window if config.get("use_sliding_window", False) else None
    return layer_window(config, used, config.get("max_window_layers"))


def window_config(arch: Architecture) -> dict[str, Any]:
    """Qwen's ``use_sliding_window`` / ``sliding_window`` / ``max_window_layers`` / ``layer_types``."""
    window = arch.attention.sliding_window
    return {
        "use_sliding_window": window is not None,
        "sliding_window": window,
        "max_window_layers": 0 if window is not None else arch.n_layers,
        "layer_types": [SLIDING_ATTENTION if window is not None else FULL_ATTENTION] * arch.n_layers,
    }


# ----------------------------------------------------------------- sizes


def decoder_shape(arch: Architecture) -> dict[str, Any]:
    """The ``config.json`` sizes every decoder family of Llama's layout writes alike."""
    return {
        "hidden_size": arch.n_embd,
        "intermediate_size": arch.feed_forward.d_ff,
        "num_hidden_layers": arch.n_layers,
        "num_attention_heads": arch.attention.n_heads,
        "num_key_value_heads": arch.attention.kv_heads,
        "head_dim": arch.head_dim,
        "max_position_embeddings": arch.block_size,
        "rms_norm_eps": arch.norm.eps,
    }


# ----------------------------------------------------------------- a run's settings


def run_setting(settings: Mapping[str, Any], key: str, default: Any) -> Any:
    """The value of ``key`` in a run's configuration, flat (``a/b/c``) or nested; ``default`` when it
    has none."""
    if key in settings:
        return settings[key]
    node: Any = settings
    for part in key.split("/"):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def setting(settings: Mapping[str, Any], key: str, default: float) -> float:
    """A number of the run's configuration, flat (``a/b/c``) or nested (``default`` when absent or null)."""
    value = run_setting(settings, key, None)
    return default if value is None else float(value)


def setting_or_none(settings: Mapping[str, Any], key: str, default: int | None) -> int | None:
    """A key of the run's configuration that may be null (flat or nested; ``default`` when absent)."""
    value = run_setting(settings, key, default)
    return None if value is None else int(value)


__all__ = [
    "decoder_shape",
    "interleaved_layer_types",
    "layer_window",
    "original_positions",
    "partial_rotary_factor",
    "plain_rope_theta",
    "qwen_window",
    "rope_config",
    "rope_keys",
    "run_setting",
    "setting",
    "setting_or_none",
    "sliding_window_of",
    "window_config",
    "without_partial_rotary",
    "yarn_keys",
]
