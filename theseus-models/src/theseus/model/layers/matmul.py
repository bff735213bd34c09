"""Projections: ``x`` times a kernel, in the activation dtype or, under ``training/precision=fp8``, in FP8.

FP8 uses *current* per-tensor scaling: each operand is divided by its own absolute maximum over the
format's largest value (e4m3: 448, e5m2: 57344) right before it is cast, and the product is scaled
back. Delayed scaling (an amax history carried in the train state) saves the reduction over each
operand but needs state that every checkpoint, resume and layout change must carry, and lags a
sudden change of range by its history; current scaling costs one more read of each operand (the
maximum must be known before the cast) and, where the operand is sharded, a small all-reduce. The
forward pass multiplies e4m3 operands; the backward pass multiplies the e5m2-cast gradient with the
saved e4m3 operands. The saved operands are the FP8 copies, so the residuals of a projection take a
quarter of their float32 bytes.

What is projected this way: attention query/key/value/output, MLP and expert kernels (``project``);
the embedding, the head, norms, routers and attention scores keep their precision.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from theseus.base.numerics import matmul_precision

E4M3 = jnp.float8_e4m3fn
E5M2 = jnp.float8_e5m2


def project(equation: str, x: jax.Array, kernel: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """``einsum(equation, x, kernel)`` in ``dtype``, in FP8 while a trainer traces with
    ``training/precision=fp8``. ``equation`` names each index of the two operands; every index
    occurs in two of the three terms (a projection, not a trace or a diagonal)."""
    x, kernel = x.astype(dtype), kernel.astype(dtype)
    if matmul_precision() == "fp8":
        return fp8_einsum(equation, x, kernel)
    return jnp.einsum(equation, x, kernel)


def _scale(a: jax.Array, fmt: jnp.dtype) -> jax.Array:
    """The float32 scale that maps ``a``'s absolute maximum onto ``fmt``'s largest value (1 for zeros)."""
    amax = jnp.max(jnp.abs(a)).astype(jnp.float32)
    largest = jnp.float32(jnp.finfo(fmt).max)
    return jnp.where(amax > 0, amax / largest, jnp.float32(1.0))


def quantize(a: jax.Array, fmt: jnp.dtype) -> tuple[jax.Array, jax.Array]:
    """``(a / scale)`` cast to ``fmt``, and the scale (per tensor, current)."""
    scale = _scale(a, fmt)
    largest = jnp.float32(jnp.finfo(fmt).max)
    return jnp.clip(a.astype(jnp.float32) / scale, -largest, largest).astype(fmt), scale


def _terms(equation: str) -> tuple[str, str, str]:
    inputs, output = equation.replace(" ", "").split("->")
    left, right = inputs.split(",")
    return left, right, output


def _product(equation: str, a: jax.Array, b: jax.Array, scale: jax.Array, dtype: jnp.dtype) -> jax.Array:
    """The FP8 product, scaled back in float32, in ``dtype``. The GEMM's result is bfloat16 when ``dtype``
    is (a float32 result would make XLA reduce a data-parallel weight gradient in float32: twice the
    bytes), else float32: float16 would overflow on products of operands scaled up to 448 and 57344."""
    result = jnp.bfloat16 if jnp.dtype(dtype) == jnp.bfloat16 else jnp.float32
    out = jnp.einsum(equation, a, b, preferred_element_type=result)
    return (out.astype(jnp.float32) * scale).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def fp8_einsum(equation: str, x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``einsum(equation, x, kernel)`` with both operands in e4m3 (scaled per tensor), in ``x``'s dtype;
    its gradient multiplies the e5m2 cotangent with the saved e4m3 operands."""
    return _forward(equation, x, kernel)[0]


Saved = tuple[jax.Array, jax.Array, jax.Array, jax.Array]


def _forward(equation: str, x: jax.Array, kernel: jax.Array) -> tuple[jax.Array, Saved]:
    xq, x_scale = quantize(x, E4M3)
    kq, k_scale = quantize(kernel, E4M3)
    return _product(equation, xq, kq, x_scale * k_scale, x.dtype), (xq, x_scale, kq, k_scale)


def _backward(equation: str, saved: Saved, g: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Gradients in the cotangent's dtype (``project`` gives both operands the output's dtype)."""
    xq, x_scale, kq, k_scale = saved
    left, right, output = _terms(equation)
    gq, g_scale = quantize(g, E5M2)
    dx = _product(f"{output},{right}->{left}", gq, kq, g_scale * k_scale, g.dtype)
    dk = _product(f"{left},{output}->{right}", xq, gq, x_scale * g_scale, g.dtype)
    return dx, dk


fp8_einsum.defvjp(_forward, _backward)

__all__ = ["E4M3", "E5M2", "fp8_einsum", "project", "quantize"]
