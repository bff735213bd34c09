"""An independent float64 numpy implementation of the GPT and Llama forward passes and loss.

Written from the architecture's definition, it reads the Flax parameter tree by name only (a
scanned model's stacked layers are read through their per-layer view).
Rotary embeddings are done with complex numbers (pairs ``(x[i], x[i + H/2])``), attention
with explicit masks and key/value heads repeated per group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from theseus.checkpoint.layers import per_layer

Params = dict[str, Any]


def layer_norm(x: np.ndarray, p: Params, eps: float) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps) * p["scale"]
    return y + p["bias"] if "bias" in p else y


def rms_norm(x: np.ndarray, p: Params, eps: float) -> np.ndarray:
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * p["scale"]


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def positions_of(mask: np.ndarray) -> np.ndarray:
    """Each token's position = real tokens before it in the row."""
    return np.maximum(np.cumsum(mask.astype(np.int64), axis=1) - 1, 0)


def rope(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x [B, T, N, H]; rotate the complex pairs (x[i], x[i + H/2]) by position * theta^(-2i/H)."""
    half = x.shape[-1] // 2
    z = x[..., :half] + 1j * x[..., half:]
    freq = theta ** (-2.0 * np.arange(half) / x.shape[-1])
    z = z * np.exp(1j * positions[:, :, None, None] * freq)
    return np.concatenate([z.real, z.imag], axis=-1)


def attention(
    x: np.ndarray, p: Params, n_heads: int, n_kv: int, mask: np.ndarray, rope_theta: float | None
) -> np.ndarray:
    steps, width = x.shape[1:]
    head = width // n_heads
    q = np.einsum("bte,enh->btnh", x, p["query"]) + p.get("query_bias", 0.0)
    k = np.einsum("bte,enh->btnh", x, p["key"]) + p.get("key_bias", 0.0)
    v = np.einsum("bte,enh->btnh", x, p["value"]) + p.get("value_bias", 0.0)
    if rope_theta is not None:
        pos = positions_of(mask)
        q, k = rope(q, pos, rope_theta), rope(k, pos, rope_theta)
    group = n_heads // n_kv
    k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(head)
    allowed = np.tril(np.ones((steps, steps), bool))[None, None] & mask[:, None, None, :]
    scores = np.where(allowed, scores, -np.inf)
    row_max = scores.max(-1, keepdims=True)
    probs = np.exp(scores - np.where(np.isfinite(row_max), row_max, 0.0))
    total = probs.sum(-1, keepdims=True)
    probs = probs / np.where(total > 0, total, 1.0)  # a padded query with no real key: output 0
    y = np.einsum("bnts,bsnh->btnh", probs, v)
    return np.einsum("btnh,nhe->bte", y, p["out"]) + p.get("out_bias", 0.0)


def gpt_logits(params: Params, x: np.ndarray, mask: np.ndarray, *, n_heads: int, eps: float = 1e-5) -> np.ndarray:
    """GPT-2: learned positions, pre-LayerNorm blocks, tanh-GELU MLP, tied head."""
    params = per_layer(params, ["blocks"])
    wte = params["token_embedding"]["embedding"]
    wpe = params["position_embedding"]["embedding"]
    h = wte[x] + wpe[positions_of(mask)]
    n_layers = sum(1 for name in params if name.startswith("blocks_"))
    for i in range(n_layers):
        blk = params[f"blocks_{i}"]
        h = h + attention(layer_norm(h, blk["attn_norm"], eps), blk["attn"], n_heads, n_heads, mask, None)
        mlp = blk["mlp"]
        a = gelu_tanh(layer_norm(h, blk["mlp_norm"], eps) @ mlp["up"]["kernel"] + mlp["up"]["bias"])
        h = h + a @ mlp["down"]["kernel"] + mlp["down"]["bias"]
    return layer_norm(h, params["final_norm"], eps) @ wte.T


def llama_logits(
    params: Params,
    x: np.ndarray,
    mask: np.ndarray,
    *,
    n_heads: int,
    n_kv: int,
    theta: float = 10000.0,
    eps: float = 1e-5,
) -> np.ndarray:
    """Llama: RoPE, pre-RMSNorm blocks, SwiGLU MLP, grouped-query attention, untied head."""
    params = per_layer(params, ["blocks"])
    h = params["token_embedding"]["embedding"][x]
    n_layers = sum(1 for name in params if name.startswith("blocks_"))
    for i in range(n_layers):
        blk = params[f"blocks_{i}"]
        h = h + attention(rms_norm(h, blk["attn_norm"], eps), blk["attn"], n_heads, n_kv, mask, theta)
        mlp = blk["mlp"]
        z = rms_norm(h, blk["mlp_norm"], eps)
        h = h + (silu(z @ mlp["gate"]["kernel"]) * (z @ mlp["up"]["kernel"])) @ mlp["down"]["kernel"]
    return rms_norm(h, params["final_norm"], eps) @ params["lm_head"]


def masked_cross_entropy(logits: np.ndarray, y: np.ndarray, mask: np.ndarray) -> float:
    """Mean of -log softmax(logits)[y] over positions with y != -1 and mask True."""
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    total, count = 0.0, 0
    for b in range(y.shape[0]):
        for t in range(y.shape[1]):
            if y[b, t] != -1 and mask[b, t]:
                total -= logp[b, t, y[b, t]]
                count += 1
    return total / count
