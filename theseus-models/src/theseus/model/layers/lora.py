"""LoRA: low-rank adapters beside the projections of the standard layers.

A projection ``W`` (kernel ``[*in, *out]``) gains ``A`` ``[*in, rank]`` and ``B`` ``[rank, *out]``
and computes ``x W + (alpha / rank) * dropout(x) A B``. ``B`` starts at zero, so a model with fresh
adapters computes exactly what its base does. Adapters are parameters named ``<name>_lora_a`` /
``<name>_lora_b`` (``lora_a`` / ``lora_b`` inside a ``Dense``), so they are told apart from the base
by name alone (:func:`theseus.training.adapters.is_adapter`), and :func:`merge` folds them into the kernels.

The standard layers read ``model/lora/rank`` (0: no adapters), ``model/lora/alpha``,
``model/lora/dropout`` and ``model/lora/targets`` (``query``, ``key``, ``value``, ``out`` of the
attention; ``up``, ``gate``, ``down`` of the MLP), so GPT, Llama and plugin models built from
them all take adapters; the Gated DeltaNet of Qwen3-Next and OLMo Hybrid reads them too
(:class:`theseus.model.layers.deltanet.GatedDeltaNet`), and so does multi-head latent
attention (:class:`theseus.model.layers.latent_attention.LatentAttention`), whose key and value
up-projections take their adapters folded into the kernels (:func:`layer_delta`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import cast, normal, param
from theseus.model.module import Module
from theseus.training.adapters import SUFFIX_A, SUFFIX_B, adapter_labels, is_adapter

#: Projections that can carry adapters: attention ``query``/``key``/``value``/``out``, MLP ``up``/``gate``/``down``.
TARGETS = ("query", "key", "value", "out", "up", "gate", "down")
DEFAULT_TARGETS = ("query", "key", "value", "out")


def rank_field() -> Any:
    return field("model/lora/rank", default=0, min=0, help="LoRA adapter rank (0: no adapters, the whole model trains)")


def alpha_field() -> Any:
    return field(
        "model/lora/alpha", default=16.0, above=0, help="LoRA scale numerator: adapters add (alpha / rank) * x A B"
    )


def dropout_field() -> Any:
    return field(
        "model/lora/dropout",
        default=0.0,
        min=0,
        below=1,
        help="dropout on the input of the LoRA adapters (training only)",
    )


def targets_field() -> Any:
    return field(
        "model/lora/targets",
        default=DEFAULT_TARGETS,
        help="projections with adapters: query, key, value, out (attention), up, gate, down (MLP)",
    )


class LoRAKeys(Module):
    """The ``model/lora/*`` keys of a layer whose projections take adapters (its base class)."""

    lora_rank: int = rank_field()
    lora_alpha: float = alpha_field()
    lora_dropout: float = dropout_field()
    lora_targets: tuple[str, ...] = targets_field()


def check_targets(targets: Iterable[str]) -> tuple[str, ...]:
    """``targets`` as a tuple, or a ConfigError naming an unknown projection."""
    if isinstance(targets, str):
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    chosen = tuple(targets)
    unknown = [t for t in chosen if t not in TARGETS]
    if unknown:
        raise ConfigError(
            f"model/lora/targets names {', '.join(repr(t) for t in unknown)}, which is no projection; "
            f"choose from {', '.join(TARGETS)}"
        )
    if not chosen:
        raise ConfigError(f"model/lora/targets is empty; choose from {', '.join(TARGETS)}")
    return chosen


def adapter(
    module: nn.Module,
    name: str,
    x: jax.Array,
    in_dims: Sequence[int],
    out_dims: Sequence[int],
    axes: tuple[Sequence[str | None], Sequence[str | None]],
    *,
    rank: int,
    alpha: float,
    dropout: float,
    deterministic: bool,
    prefix: str = "",
) -> jax.Array:
    """``(alpha / rank) * dropout(x) A B`` for the projection ``name`` of ``module`` (compact context).

    ``x`` ends with ``in_dims``; the result ends with ``out_dims``. ``axes`` are the logical axes of
    the input and output dimensions (the rank dimension is replicated). A rank above the smaller of
    the projection's input and output widths is a ConfigError.
    """
    dtype = module._activation_dtype  # type: ignore[attr-defined]
    a, b = _factors(module, name, in_dims, out_dims, axes, rank, prefix)
    if dropout > 0.0 and not deterministic:
        x = nn.Dropout(rate=dropout, name=f"{prefix}lora_dropout")(x, deterministic=False)
    low = jnp.tensordot(cast(x, dtype), cast(a, dtype), axes=len(in_dims))
    return jnp.tensordot(low, cast(b, dtype), axes=1) * jnp.asarray(alpha / rank, dtype)


def _factors(
    module: nn.Module,
    name: str,
    in_dims: Sequence[int],
    out_dims: Sequence[int],
    axes: tuple[Sequence[str | None], Sequence[str | None]],
    rank: int,
    prefix: str,
) -> tuple[jax.Array, jax.Array]:
    """The parameters ``A`` ``[*in_dims, rank]`` and ``B`` ``[rank, *out_dims]`` of the projection
    ``name`` (a ConfigError when ``rank`` exceeds the smaller of its widths)."""
    fan_in, fan_out = math.prod(in_dims), math.prod(out_dims)
    if rank > min(fan_in, fan_out):
        raise ConfigError(
            f"model/lora/rank={rank} is larger than the {name!r} projection allows ({fan_in} -> {fan_out}); "
            f"use a rank of at most {min(fan_in, fan_out)}"
        )
    a = param(module, f"{prefix}{SUFFIX_A}", normal(1.0 / math.sqrt(fan_in)), (*in_dims, rank), (*axes[0], None))  # type: ignore[arg-type]
    b = param(module, f"{prefix}{SUFFIX_B}", nn.initializers.zeros_init(), (rank, *out_dims), (None, *axes[1]))  # type: ignore[arg-type]
    return a, b


def layer_delta(
    module: nn.Module,
    name: str,
    in_dims: Sequence[int],
    out_dims: Sequence[int],
    axes: tuple[Sequence[str | None], Sequence[str | None]],
) -> jax.Array:
    """``(alpha / rank) * A B`` ``[*in_dims, *out_dims]`` of the projection ``name`` of a layer that
    declares the ``model/lora/*`` fields: the same parameters as :func:`layer_adapter` (``<name>_lora_a``
    / ``<name>_lora_b``), for a layer that needs the adapted kernel itself (``kernel + delta``) rather than
    its product with an input, as multi-head latent attention's compressed-cache decoding does. No
    dropout can reach a folded adapter: a layer that folds one refuses ``model/lora/dropout`` > 0."""
    rank, alpha = module.lora_rank, module.lora_alpha  # type: ignore[attr-defined]
    dtype = module._activation_dtype  # type: ignore[attr-defined]
    a, b = _factors(module, name, in_dims, out_dims, axes, rank, f"{name}_")
    return jnp.tensordot(cast(a, dtype), cast(b, dtype), axes=1) * jnp.asarray(alpha / rank, dtype)


def layer_adapter(
    module: nn.Module,
    name: str,
    x: jax.Array,
    in_dims: Sequence[int],
    out_dims: Sequence[int],
    axes: tuple[Sequence[str | None], Sequence[str | None]],
    deterministic: bool,
    prefix: str | None = None,
) -> jax.Array:
    """:func:`adapter` of the projection ``name`` of a layer that declares the ``model/lora/*`` fields
    (``lora_rank``, ``lora_alpha``, ``lora_dropout``): its parameters ``<name>_lora_a`` /
    ``<name>_lora_b`` (``prefix`` instead of ``<name>_`` when given)."""
    return adapter(
        module,
        name,
        x,
        in_dims,
        out_dims,
        axes,
        rank=module.lora_rank,  # type: ignore[attr-defined]
        alpha=module.lora_alpha,  # type: ignore[attr-defined]
        dropout=module.lora_dropout,  # type: ignore[attr-defined]
        deterministic=deterministic,
        prefix=f"{name}_" if prefix is None else prefix,
    )


def adapter_names(params: Any) -> set[str]:
    """The projections (``query``, ``up``, ...) that carry adapters in ``params``."""
    found: set[str] = set()
    for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]:
        if is_adapter(path):
            keys = [str(getattr(k, "key", k)) for k in path]
            own = keys[-1][: -len(SUFFIX_A)].rstrip("_")
            found.add(own or keys[-2])
    return found


def check_coverage(params: Any, targets: Iterable[str], model: str) -> None:
    """ConfigError when a LoRA target matches no layer of the model's parameters."""
    found = adapter_names(params)
    missing = [t for t in check_targets(targets) if t not in found]
    if missing:
        have = ", ".join(sorted(found)) or "none: the model does not use the standard layers"
        raise ConfigError(
            f"model/lora/targets {', '.join(repr(t) for t in missing)} match no layer of {model} "
            f"(projections with adapters: {have}); remove them from model/lora/targets"
        )


def _product(a: jax.Array, b: jax.Array, kernel_ndim: int) -> jax.Array:
    """``A B`` over the rank axis; layers stacked on a leading axis (a scanned model) are multiplied
    layer by layer."""
    if a.ndim + b.ndim - 2 == kernel_ndim + 1:
        return jax.vmap(lambda x, y: jnp.tensordot(x, y, axes=1))(a, b)
    return jnp.tensordot(a, b, axes=1)


def merge(params: Any, alpha: float, rank: int) -> Any:
    """``params`` with every adapter folded into its kernel (``W + (alpha / rank) A B``) and removed;
    stacked (scanned) and per-layer layouts alike."""
    scale = alpha / rank if rank else 0.0

    def fold(tree: Any) -> Any:
        if not isinstance(tree, Mapping):
            return tree
        out: dict[str, Any] = {}
        for key, value in tree.items():
            if str(key).endswith(SUFFIX_A) or str(key).endswith(SUFFIX_B):
                continue
            out[key] = fold(value)
        for key in tree:
            name = str(key)
            if not name.endswith(SUFFIX_A):
                continue
            base = name[: -len(SUFFIX_A)].rstrip("_") or "kernel"
            a, b = tree[key], tree[name[: -len(SUFFIX_A)] + SUFFIX_B]
            kernel = out[base]
            delta = _product(jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32), jnp.ndim(kernel)) * scale
            out[base] = (kernel.astype(jnp.float32) + delta).astype(kernel.dtype)
        return out

    return fold(params)


def split(params: Any) -> tuple[Any, Any]:
    """``(adapters, base)``: two trees like ``params`` with the other part's leaves set to None."""
    labels = adapter_labels(params)
    adapters = jax.tree.map(lambda p, label: p if label == "adapter" else None, params, labels)
    base = jax.tree.map(lambda p, label: p if label == "frozen" else None, params, labels)
    return adapters, base


__all__ = [
    "DEFAULT_TARGETS",
    "TARGETS",
    "adapter",
    "adapter_names",
    "check_coverage",
    "check_targets",
    "layer_adapter",
    "layer_delta",
    "merge",
    "split",
]
