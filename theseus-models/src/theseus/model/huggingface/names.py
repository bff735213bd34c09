"""Which Hugging Face tensor holds which theseus parameter, and how its layout differs.

Each :class:`TensorMap` ties one checkpoint tensor to one or more theseus parameters (GPT-2's
fused ``c_attn`` holds the query, key and value) with the two layout conversions. theseus keeps
attention projections per head (``query`` ``[embed, heads, head_dim]``, ``out``
``[heads, head_dim, embed]``) and dense kernels as ``[in, out]``; transformers' ``nn.Linear``
stores ``[out, in]`` and GPT-2's ``Conv1D`` ``[in, out]``. Both use the same half-split RoPE
layout, so no query/key permutation is needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from theseus.model.models.architecture import Architecture

Path = tuple[str, ...]


@dataclass(frozen=True)
class TensorMap:
    """``hf`` (shape ``hf_shape``) <-> the theseus parameters at ``paths``."""

    hf: str
    hf_shape: tuple[int, ...]
    paths: tuple[Path, ...]
    to_theseus: Callable[[np.ndarray], list[np.ndarray]]
    to_hf: Callable[[list[np.ndarray]], np.ndarray]


def _same(hf: str, path: Path, shape: tuple[int, ...]) -> TensorMap:
    return TensorMap(hf, shape, (path,), lambda w: [w], lambda a: a[0])


def _transposed(hf: str, path: Path, out_features: int, in_features: int) -> TensorMap:
    """An ``nn.Linear`` weight ``[out, in]`` <-> a theseus kernel ``[in, out]``."""
    return TensorMap(hf, (out_features, in_features), (path,), lambda w: [w.T], lambda a: a[0].T)


def _pad_rows(w: np.ndarray, rows: int) -> np.ndarray:
    return w if w.shape[0] == rows else np.pad(w, ((0, rows - w.shape[0]), (0, 0)))


def _vocab_embedding(hf: str, path: Path, arch: Architecture) -> TensorMap:
    """The token embedding ``[vocab, width]`` <-> theseus' table padded to ``padded_vocab_size`` rows
    (zeros; the padded ids never occur)."""
    v, vp = arch.vocab_size, arch.padded_vocab_size
    return TensorMap(hf, (v, arch.n_embd), (path,), lambda w: [_pad_rows(w, vp)], lambda a: a[0][:v])


def _vocab_head(hf: str, path: Path, arch: Architecture) -> TensorMap:
    """An untied ``lm_head`` ``nn.Linear`` ``[vocab, width]`` <-> theseus' kernel ``[width, padded vocab]``
    (zero columns for the padded ids, whose logits the model masks)."""
    v, vp = arch.vocab_size, arch.padded_vocab_size
    return TensorMap(hf, (v, arch.n_embd), (path,), lambda w: [_pad_rows(w, vp).T], lambda a: a[0][:, :v].T)


def _heads_in(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """A query/key/value ``nn.Linear`` weight ``[heads*head_dim, width]`` <-> ``[width, heads, head_dim]``."""
    return TensorMap(
        hf,
        (heads * head_dim, width),
        (path,),
        lambda w: [w.T.reshape(width, heads, head_dim)],
        lambda a: a[0].reshape(width, heads * head_dim).T,
    )


def _heads_bias(hf: str, path: Path, heads: int, head_dim: int) -> TensorMap:
    return TensorMap(
        hf, (heads * head_dim,), (path,), lambda b: [b.reshape(heads, head_dim)], lambda a: a[0].reshape(-1)
    )


def _heads_out(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """The attention output ``nn.Linear`` weight ``[width, heads*head_dim]`` <-> ``[heads, head_dim, width]``."""
    return TensorMap(
        hf,
        (width, heads * head_dim),
        (path,),
        lambda w: [w.T.reshape(heads, head_dim, width)],
        lambda a: a[0].reshape(heads * head_dim, width).T,
    )


def llama_maps(arch: Architecture) -> list[TensorMap]:
    """Llama, Mistral and Qwen2 (``LlamaForCausalLM`` layout)."""
    e, h, kv, d, f = arch.n_embd, arch.n_heads, arch.n_kv_heads, arch.head_dim, arch.d_ff
    maps = [_vocab_embedding("model.embed_tokens.weight", ("token_embedding", "embedding"), arch)]
    for i in range(arch.n_layers):
        hf, ours = f"model.layers.{i}.", f"blocks_{i}"
        maps.append(_same(hf + "input_layernorm.weight", (ours, "attn_norm", "scale"), (e,)))
        for name, ours_name, heads in (("q", "query", h), ("k", "key", kv), ("v", "value", kv)):
            maps.append(_heads_in(hf + f"self_attn.{name}_proj.weight", (ours, "attn", ours_name), e, heads, d))
            if arch.qkv_bias:
                maps.append(
                    _heads_bias(hf + f"self_attn.{name}_proj.bias", (ours, "attn", f"{ours_name}_bias"), heads, d)
                )
        maps.append(_heads_out(hf + "self_attn.o_proj.weight", (ours, "attn", "out"), e, h, d))
        if arch.out_bias:
            maps.append(_same(hf + "self_attn.o_proj.bias", (ours, "attn", "out_bias"), (e,)))
        maps.append(_same(hf + "post_attention_layernorm.weight", (ours, "mlp_norm", "scale"), (e,)))
        for name, ours_name, out_features, in_features in (
            ("gate", "gate", f, e),
            ("up", "up", f, e),
            ("down", "down", e, f),
        ):
            maps.append(
                _transposed(
                    hf + f"mlp.{name}_proj.weight", (ours, "mlp", ours_name, "kernel"), out_features, in_features
                )
            )
            if arch.ffn_bias:
                maps.append(_same(hf + f"mlp.{name}_proj.bias", (ours, "mlp", ours_name, "bias"), (out_features,)))
    maps.append(_same("model.norm.weight", ("final_norm", "scale"), (e,)))
    if not arch.tied_embeddings:
        maps.append(_vocab_head("lm_head.weight", ("lm_head",), arch))
    return maps


def _fused_qkv_weight(hf: str, ours: Path, e: int, h: int, d: int) -> TensorMap:
    width = h * d
    paths = ((*ours, "query"), (*ours, "key"), (*ours, "value"))
    return TensorMap(
        hf,
        (e, 3 * width),
        paths,
        lambda w: [w[:, i * width : (i + 1) * width].reshape(e, h, d) for i in range(3)],
        lambda a: np.concatenate([x.reshape(e, width) for x in a], axis=1),
    )


def _fused_qkv_bias(hf: str, ours: Path, h: int, d: int) -> TensorMap:
    width = h * d
    paths = ((*ours, "query_bias"), (*ours, "key_bias"), (*ours, "value_bias"))
    return TensorMap(
        hf,
        (3 * width,),
        paths,
        lambda b: [b[i * width : (i + 1) * width].reshape(h, d) for i in range(3)],
        lambda a: np.concatenate([x.reshape(-1) for x in a]),
    )


def _conv_heads_out(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """GPT-2's ``Conv1D`` output weight ``[heads*head_dim, width]`` <-> ``[heads, head_dim, width]``."""
    return TensorMap(
        hf,
        (heads * head_dim, width),
        (path,),
        lambda w: [w.reshape(heads, head_dim, width)],
        lambda a: a[0].reshape(heads * head_dim, width),
    )


def gpt2_maps(arch: Architecture) -> list[TensorMap]:
    """GPT-2 (``GPT2LMHeadModel`` layout; ``Conv1D`` weights are already ``[in, out]``)."""
    e, h, d, f = arch.n_embd, arch.n_heads, arch.head_dim, arch.d_ff
    maps = [
        _vocab_embedding("transformer.wte.weight", ("token_embedding", "embedding"), arch),
        _same("transformer.wpe.weight", ("position_embedding", "embedding"), (arch.block_size, e)),
    ]
    for i in range(arch.n_layers):
        hf, ours = f"transformer.h.{i}.", f"blocks_{i}"
        for norm, ours_norm in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
            maps.append(_same(hf + f"{norm}.weight", (ours, ours_norm, "scale"), (e,)))
            maps.append(_same(hf + f"{norm}.bias", (ours, ours_norm, "bias"), (e,)))
        maps.append(_fused_qkv_weight(hf + "attn.c_attn.weight", (ours, "attn"), e, h, d))
        maps.append(_fused_qkv_bias(hf + "attn.c_attn.bias", (ours, "attn"), h, d))
        maps.append(_conv_heads_out(hf + "attn.c_proj.weight", (ours, "attn", "out"), e, h, d))
        maps.append(_same(hf + "attn.c_proj.bias", (ours, "attn", "out_bias"), (e,)))
        maps.append(_same(hf + "mlp.c_fc.weight", (ours, "mlp", "up", "kernel"), (e, f)))
        maps.append(_same(hf + "mlp.c_fc.bias", (ours, "mlp", "up", "bias"), (f,)))
        maps.append(_same(hf + "mlp.c_proj.weight", (ours, "mlp", "down", "kernel"), (f, e)))
        maps.append(_same(hf + "mlp.c_proj.bias", (ours, "mlp", "down", "bias"), (e,)))
    maps.append(_same("transformer.ln_f.weight", ("final_norm", "scale"), (e,)))
    maps.append(_same("transformer.ln_f.bias", ("final_norm", "bias"), (e,)))
    if not arch.tied_embeddings:
        maps.append(_vocab_head("lm_head.weight", ("lm_head",), arch))
    return maps


def tensor_maps(family: str, arch: Architecture) -> list[TensorMap]:
    return gpt2_maps(arch) if family == "gpt2" else llama_maps(arch)


#: Checkpoint tensors that are buffers, not weights (recomputed by theseus): safe to skip on import.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", ".rotary_emb.inv_freq")


def canonical_name(family: str, name: str) -> str:
    """A checkpoint tensor name in the ``*ForCausalLM`` layout (GPT-2 base models omit ``transformer.``)."""
    if family == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
        return "transformer." + name
    return name
