"""Quantized frozen projection kernels (``model/quantize``): NF4 and int8, dequantized inside the matmul.

``nf4`` follows the QLoRA paper (Dettmers et al. 2023): the tensor, flattened, is cut into blocks of
64 values; each block is divided by its absolute maximum and every value is replaced by the nearest
of the 16 NormalFloat4 levels (:func:`nf4_codebook`), two 4-bit codes per byte (the first value in
the high nibble). The per-block absolute maxima are double-quantized: their mean is subtracted and
the rest is stored as symmetric 8-bit integers with one float32 scale per block of 256, which brings
the constants from 32 to about 8.1 bits per block (4.13 bits per weight in all).
``int8`` is symmetric per output channel: ``round(w / s)`` with ``s = absmax / 127`` over the input
dimensions.

A quantized kernel is a parameter ``<name>_<method>`` holding a small dict of arrays in place of the
float parameter ``<name>`` (:func:`kernel`); it is meant for the frozen base of a LoRA run, whose
adapters stay in floating point (every trainer holds such kernels out of the update by their integer
arrays: :mod:`theseus.training.frozen`). Its arrays carry logical axes, so they shard as the kernel does
(NF4 codes keep the kernel's shape when whole blocks tile its last dimension, else they are flat and
replicated). :func:`quantize_like` / :func:`dequantize_like` convert between the
two layouts for whole kernels, layers stacked on a leading axis (a scanned model) included.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import cache, partial
from statistics import NormalDist
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import field
from theseus.errors import ConfigError
from theseus.model.layers._common import param

METHODS = ("none", "nf4", "int8")
#: Values per NF4 block, and absolute maxima per block of the double quantization.
NF4_BLOCK, ABSMAX_BLOCK = 64, 256

Quantized = dict[str, jax.Array]


def quantize_field() -> Any:
    return field(
        "model/quantize",
        default="none",
        choices=METHODS,
        help="store the frozen base's projection kernels as nf4 (4-bit NormalFloat, QLoRA) or int8; needs LoRA",
    )


def check(method: str, lora_rank: int) -> str:
    """``method``, or a ConfigError when it is unknown or used without LoRA adapters."""
    if method not in METHODS:
        raise ConfigError(f"model/quantize={method!r} is not a method; choose one of {', '.join(METHODS)}")
    if method != "none" and lora_rank <= 0:
        raise ConfigError(
            f"model/quantize={method} quantizes a frozen base and needs LoRA adapters to train; "
            "set model/lora/rank>0 or model/quantize=none"
        )
    return method


@cache
def nf4_codebook() -> np.ndarray:
    """The 16 NormalFloat4 levels: quantiles of N(0, 1) with asymmetric halves (8 positive, 7 negative
    and an exact 0) taken between ``1 - delta`` and 1/2, ``delta = (1/32 + 1/30) / 2``, scaled to [-1, 1]."""
    normal = NormalDist()
    edge = 1.0 - 0.5 * (1.0 / 32 + 1.0 / 30)
    positive = [normal.inv_cdf(p) for p in np.linspace(edge, 0.5, 9)[:-1]]
    negative = [-normal.inv_cdf(p) for p in np.linspace(edge, 0.5, 8)[:-1]]
    levels = np.array(sorted([*negative, 0.0, *positive]), np.float64)
    return (levels / levels.max()).astype(np.float32)


def _blocks(flat: jax.Array, size: int) -> jax.Array:
    """``flat`` zero-padded to whole blocks of ``size``, as ``[blocks, size]``."""
    pad = -flat.shape[0] % size
    return jnp.pad(flat, (0, pad)).reshape(-1, size)


def _nonzero(scale: jax.Array) -> jax.Array:
    return jnp.where(scale > 0, scale, 1.0)


def _shaped(shape: Sequence[int]) -> bool:
    """Whether whole NF4 blocks tile the last dimension of ``shape``: the codes then keep the tensor's
    shape (the last dimension packed), so that they shard as the kernel does; else they are flat."""
    return len(shape) >= 1 and shape[-1] % NF4_BLOCK == 0


def nf4_quantize(x: jax.Array) -> Quantized:
    """``x`` (any shape) as NF4 codes with double-quantized block maxima. The blocks run over ``x``
    flattened; when they tile its last dimension, ``codes`` (``[..., last / 2]``) and ``absmax_codes``
    (``[..., last / 64]``) keep the other dimensions (the same values, laid out to shard like ``x``)."""
    blocks = _blocks(jnp.ravel(x).astype(jnp.float32), NF4_BLOCK)
    absmax = jnp.max(jnp.abs(blocks), axis=1)
    normalised = blocks / _nonzero(absmax)[:, None]
    levels = jnp.asarray(nf4_codebook())
    codes = jnp.searchsorted((levels[1:] + levels[:-1]) / 2, normalised).astype(jnp.uint8)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]
    mean = jnp.mean(absmax)
    centred = _blocks(absmax - mean, ABSMAX_BLOCK)
    scales = jnp.max(jnp.abs(centred), axis=1) / 127.0
    absmax_codes = jnp.round(centred / _nonzero(scales)[:, None]).astype(jnp.int8)
    layout = (*x.shape[:-1], -1) if _shaped(x.shape) else (-1,)
    return {
        "codes": packed.reshape(layout),
        "absmax_codes": absmax_codes.reshape(-1)[: absmax.shape[0]].reshape(layout),
        "absmax_scales": scales,
        "absmax_mean": mean,
    }


def nf4_dequantize(q: Mapping[str, jax.Array], shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """The tensor of ``shape`` that NF4 codes ``q`` stand for."""
    n = math.prod(shape)
    absmax_codes = q["absmax_codes"].reshape(-1)
    scales = jnp.repeat(q["absmax_scales"], ABSMAX_BLOCK)[: absmax_codes.shape[0]]
    absmax = absmax_codes.astype(jnp.float32) * scales + q["absmax_mean"]
    packed = q["codes"].reshape(-1, NF4_BLOCK // 2)
    codes = jnp.stack([packed >> 4, packed & 0xF], axis=-1).reshape(-1, NF4_BLOCK)
    values = jnp.asarray(nf4_codebook())[codes] * absmax[:, None]
    return values.reshape(-1)[:n].reshape(tuple(shape)).astype(dtype)


def int8_quantize(x: jax.Array, n_in: int) -> Quantized:
    """``x`` ``[*in, *out]`` as int8 codes with one scale per output channel (``[1] * n_in + out``)."""
    x = x.astype(jnp.float32)
    scales = jnp.max(jnp.abs(x), axis=tuple(range(n_in)), keepdims=True) / 127.0
    codes = jnp.clip(jnp.round(x / _nonzero(scales)), -127, 127).astype(jnp.int8)
    return {"codes": codes, "scales": scales}


def int8_dequantize(q: Mapping[str, jax.Array], dtype: Any = jnp.float32) -> jax.Array:
    return (q["codes"].astype(jnp.float32) * q["scales"]).astype(dtype)


def quantize(x: jax.Array, method: str, n_in: int = 1) -> Quantized:
    """``x`` (a kernel ``[*in, *out]``, ``n_in`` input dimensions) quantized with ``method``."""
    if method == "nf4":
        return nf4_quantize(x)
    if method == "int8":
        return int8_quantize(x, n_in)
    raise ValueError(f"no quantization method {method!r}")


def dequantize(q: Mapping[str, jax.Array], method: str, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """The kernel of ``shape`` that ``q`` stands for, in ``dtype``."""
    if method == "nf4":
        return nf4_dequantize(q, shape, dtype)
    if method == "int8":
        return int8_dequantize(q, dtype)
    raise ValueError(f"no quantization method {method!r}")


def nbytes(tree: Any) -> int:
    """Bytes of the arrays (or shapes) in ``tree``."""
    return sum(int(np.prod(leaf.shape)) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(tree))


def bytes_per_parameter(method: str, shape: Sequence[int], n_in: int = 1) -> float:
    """Storage per weight of a kernel of ``shape`` quantized with ``method`` (scales included)."""
    abstract = jax.eval_shape(lambda: quantize(jnp.zeros(tuple(shape), jnp.float32), method, n_in))
    return nbytes(abstract) / math.prod(shape)


def _axes(
    method: str, shape: Sequence[int], axes: Sequence[str | None], n_in: int
) -> dict[str, tuple[str | None, ...]]:
    """Logical axes of each array of a quantized kernel: int8 codes and scales shard like the kernel;
    NF4 codes kept in the kernel's shape shard like it, their block maxima like all but its last axis
    (a few blocks per row need not divide a mesh axis); flat NF4 arrays are replicated."""
    if method == "int8":
        return {"codes": tuple(axes), "scales": (*([None] * n_in), *axes[n_in:])}
    if not _shaped(shape):
        return {"codes": (None,), "absmax_codes": (None,), "absmax_scales": (None,), "absmax_mean": ()}
    return {"codes": tuple(axes), "absmax_codes": (*axes[:-1], None), "absmax_scales": (None,), "absmax_mean": ()}


def kernel(
    module: nn.Module,
    name: str,
    init: Callable[..., jax.Array],
    shape: Sequence[int],
    axes: Sequence[str | None],
    method: str,
    n_in: int = 1,
) -> jax.Array:
    """The projection kernel ``name`` of ``module`` (compact context): the float parameter ``name``, or,
    with a ``method``, the parameter ``<name>_<method>`` (the initial kernel quantized) dequantized to
    the activation dtype."""
    if method == "none":
        return param(module, name, init, shape, axes)  # type: ignore[arg-type]
    names = _axes(method, shape, axes, n_in)

    def quantized_init(key: jax.Array) -> Any:
        q = quantize(init(key, tuple(shape), jnp.float32), method, n_in)
        return {k: nn.LogicallyPartitioned(v, names[k]) for k, v in q.items()}

    q: Quantized = module.param(f"{name}_{method}", quantized_init)  # unboxed: plain arrays
    return dequantize(q, method, shape, module._activation_dtype)  # type: ignore[attr-defined]


# -- whole parameter trees -----------------------------------------------------------------------


def method_of(key: Any) -> str | None:
    """The method of a parameter named ``<name>_<method>`` (``None`` for any other name)."""
    name = str(getattr(key, "key", key))
    for method in METHODS[1:]:
        if name.endswith(f"_{method}"):
            return method
    return None


def _nf4_stacked(q: Mapping[str, Any]) -> bool:
    """Whether NF4 arrays ``q`` carry a leading layer axis (a scanned model): one mean per layer."""
    return len(q["absmax_mean"].shape) == 1


def _layout(shape: Sequence[int], target: Mapping[str, Any], method: str) -> tuple[bool, int]:
    """``(stacked, n_in)`` of a float kernel of ``shape`` quantized into ``target``'s layout: whether it
    carries a leading layer axis, and its input dimensions (int8 scales are 1 along them)."""
    if method == "nf4":
        return _nf4_stacked(target), 1
    reduce = [i for i, (s, d) in enumerate(zip(target["scales"].shape, shape, strict=True)) if s == 1 and d > 1]
    stacked = bool(reduce) and reduce[0] == 1
    n_in = max(reduce) + 1 if reduce else 1
    return stacked, n_in - 1 if stacked else n_in


@partial(jax.jit, static_argnames=("method", "stacked", "n_in"))
def _quantize(x: jax.Array, method: str, stacked: bool, n_in: int) -> Quantized:
    one = partial(quantize, method=method, n_in=n_in)
    return jax.vmap(one)(x) if stacked else one(x)


def quantize_like(x: jax.Array, target: Mapping[str, Any], method: str) -> Quantized:
    """The float kernel ``x`` quantized into the layout of ``target`` (shapes of a quantized kernel;
    a leading layer axis is quantized layer by layer). Compiled once per shape."""
    stacked, n_in = _layout(x.shape, target, method)
    return dict(_quantize(x, method=method, stacked=stacked, n_in=n_in))


def dequantize_like(q: Mapping[str, Any], method: str, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """The float kernel of ``shape`` (a leading layer axis included when ``q`` has one)."""
    if method == "nf4" and _nf4_stacked(q):
        return jax.vmap(lambda one: nf4_dequantize(one, shape[1:], dtype))(q)
    return dequantize(q, method, shape, dtype)


def quantize_params(plain: Any, abstract: Any, shardings: Any = None) -> Any:
    """``plain`` (float parameters) with every kernel that ``abstract`` (the quantized model's parameter
    shapes) holds as ``<name>_<method>`` quantized; each float kernel is released once quantized."""
    if not isinstance(abstract, Mapping):
        return plain
    out: dict[str, Any] = {}
    for key, value in plain.items():
        sub_shardings = shardings.get(key) if isinstance(shardings, Mapping) else None
        out[key] = quantize_params(value, abstract[key], sub_shardings) if key in abstract else value
    for key, target in abstract.items():
        method = method_of(key)
        if method is None or not isinstance(target, Mapping):
            continue
        name = str(key)[: -len(method) - 1]
        where = shardings.get(key) if isinstance(shardings, Mapping) else None
        quantized = quantize_like(out.pop(name), target, method)
        out[key] = jax.device_put(quantized, where) if where is not None else quantized
    return out


def dequantize_params(params: Any, plain: Any, dtype: Any = None) -> Any:
    """``params`` with every quantized kernel replaced by the float kernel it stands for; ``plain`` gives
    the float shapes and dtypes (the parameter shapes of the model without quantization)."""
    if not isinstance(params, Mapping):
        return params
    out: dict[str, Any] = {}
    for key, value in params.items():
        method = method_of(key)
        if method is not None and isinstance(value, Mapping):
            name = str(key)[: -len(method) - 1]
            target = plain[name]
            out[name] = dequantize_like(value, method, target.shape, dtype or target.dtype)
        else:
            out[key] = dequantize_params(value, plain.get(key, {}) if isinstance(plain, Mapping) else {}, dtype)
    return out


__all__ = [
    "ABSMAX_BLOCK",
    "METHODS",
    "NF4_BLOCK",
    "bytes_per_parameter",
    "check",
    "dequantize",
    "dequantize_like",
    "dequantize_params",
    "int8_dequantize",
    "int8_quantize",
    "kernel",
    "method_of",
    "nbytes",
    "nf4_codebook",
    "nf4_dequantize",
    "nf4_quantize",
    "quantize",
    "quantize_field",
    "quantize_like",
    "quantize_params",
]
