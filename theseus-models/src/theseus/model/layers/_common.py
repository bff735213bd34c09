"""Helpers shared by the layers: child construction, parameters with logical axes, constraints."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.config import configure, field
from theseus.errors import ConfigError
from theseus.model.module import Module

T = TypeVar("T")

#: The standard deviation of GPT-2 style normal initialisation.
INIT_STD = 0.02

#: Logical axes of a [batch, sequence, embed] activation.
ACTIVATION_AXES = (Axis.BATCH, Axis.SEQUENCE, Axis.EMBED)


def layer_width(layer: Any, read: Callable[[Any], Any]) -> int:
    """The model width ``layer`` counts its FLOPs at: its ``n_embd``, else ``read(params)`` of a bound
    layer (a parameter's width, or None); one line naming the key when neither is there."""
    if layer.n_embd is not None:
        return int(layer.n_embd)
    if layer.scope is not None:
        width = read(layer.variables.get("params", {}))
        if width is not None:
            return int(width)
    raise ConfigError(f"{type(layer).__name__}.flops needs architecture/n_embd; set it or call flops on a bound module")


def child(parent: Module, cls: type[T], **overrides: Any) -> T:
    """``configure(cls)`` with the parent's dtypes, plus ``overrides``."""
    return configure(
        cls,
        param_dtype=parent.param_dtype,
        activation_dtype=parent.activation_dtype,
        **overrides,
    )


def normal(std: float) -> Callable[..., jax.Array]:
    return nn.initializers.normal(stddev=std)


def param(
    module: Module,
    name: str,
    init: Callable[..., jax.Array],
    shape: Sequence[int],
    axes: Sequence[str | None],
) -> jax.Array:
    """A parameter of ``module._param_dtype`` carrying logical axis names ``axes``."""
    if len(axes) != len(shape):
        raise ValueError(f"parameter {name!r}: {len(axes)} axis names for shape {tuple(shape)}")
    boxed_init: Any = nn.with_logical_partitioning(init, tuple(axes))
    value: jax.Array = module.param(name, boxed_init, tuple(shape), module._param_dtype)
    return value


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """Constrain an activation's sharding by logical axis names (a no-op without rules/mesh)."""
    return nn.with_logical_constraint(x, tuple(axes))


def cast(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return x if x.dtype == dtype else x.astype(dtype)


def require(value: int | None, key: str, layer: str) -> int:
    """``value`` or a ConfigError naming the configuration key that must be set."""
    if value is None:
        raise ConfigError(f"{layer} needs {key}; pass {key}=<value> (or use the layer inside a model)")
    return value


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=True),
    "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),  # squared ReLU (Nemotron-H's MLP)
    "silu": jax.nn.silu,
    "swiglu": jax.nn.silu,
    "geglu": lambda x: jax.nn.gelu(x, approximate=True),
}
#: Activations whose MLP has a gate projection (``act(x W_gate) * (x W_up)``).
GATED = frozenset({"swiglu", "geglu"})


#: The ``architecture/`` keys that both layers and the models built from them read, each with its one
#: default, bounds and help (:func:`architecture_field` declares them).
ARCHITECTURE_KEYS: dict[str, dict[str, Any]] = {
    "vocab_size": {"default": 257, "help": "vocabulary size (257 = bytes + end-of-text)"},
    "block_size": {"default": 256, "help": "maximum sequence length"},
    "n_embd": {"default": None, "help": "model width (None: from the preset)"},
    "n_heads": {"default": None, "help": "attention heads (None: from the preset)"},
    "n_kv_heads": {"default": None, "help": "key/value heads for grouped-query attention (None: preset)"},
    "d_ff": {"default": None, "help": "MLP hidden width (None: mlp_ratio * n_embd, or the preset's)"},
    "mlp_ratio": {"default": None, "help": "MLP hidden width / n_embd when d_ff is None (None: preset)"},
    "activation": {
        "default": None,
        "choices": tuple(ACTIVATIONS),
        "help": f"{' | '.join(ACTIVATIONS)} (None: the model family's own)",
    },
    "dropout": {"default": 0.0, "min": 0.0, "below": 1.0, "help": "dropout rate of residual branches"},
    "norm_eps": {"default": 1e-5, "above": 0.0, "help": "epsilon of the normalisation layers"},
    "attention_impl": {
        "default": "auto",
        "help": "auto | xla | cudnn | splash (auto: splash on TPU, cuDNN on GPU in bf16/f16)",
    },
}


def architecture_field(name: str) -> Any:
    """The field of ``architecture/<name>`` (one of :data:`ARCHITECTURE_KEYS`), as every class that reads it
    declares it: a layer used alone checks the same bounds as the model around it."""
    return field(f"architecture/{name}", **ARCHITECTURE_KEYS[name])


def optional_key(key: str, what: str, none: str = "the preset's") -> Any:
    """The field of ``key`` that defaults to None, whose help says ``what`` it sets and what None means
    (``none``: mostly the preset's value)."""
    return field(key, default=None, help=f"{what} (None: {none})")


def check_activation(name: str) -> str:
    if name not in ACTIVATIONS:
        raise ConfigError(f"unknown architecture/activation {name!r}; choose one of {', '.join(sorted(ACTIVATIONS))}")
    return name
