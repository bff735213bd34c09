"""GPT-2 checkpoints (``GPT2LMHeadModel``) <-> theseus' ``GPT``: the ``hf/gpt2`` family.

GPT-2's ``Conv1D`` weights are already ``[in, out]``; its ``c_attn`` holds query, key and value fused.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.family import HFFamily, Identity, cannot, expect, require, unsupported
from theseus.model.huggingface.names import Path, TensorMap, same, vocab_embedding, vocab_head
from theseus.model.stack.architecture import Architecture

#: config.json's ``activation_function`` <-> ``architecture/activation``.
ACTIVATIONS = {"gelu_new": "gelu", "gelu_pytorch_tanh": "gelu", "gelu": "gelu_exact", "relu": "relu"}
ACTIVATION_NAMES = {"gelu": "gelu_new", "gelu_exact": "gelu", "relu": "relu"}


def fused_qkv_weight(hf: str, ours: Path, e: int, h: int, d: int) -> TensorMap:
    width = h * d
    paths = ((*ours, "query"), (*ours, "key"), (*ours, "value"))
    return TensorMap(
        hf,
        (e, 3 * width),
        paths,
        lambda w: [w[:, i * width : (i + 1) * width].reshape(e, h, d) for i in range(3)],
        lambda a: np.concatenate([x.reshape(e, width) for x in a], axis=1),
    )


def fused_qkv_bias(hf: str, ours: Path, h: int, d: int) -> TensorMap:
    width = h * d
    paths = ((*ours, "query_bias"), (*ours, "key_bias"), (*ours, "value_bias"))
    return TensorMap(
        hf,
        (3 * width,),
        paths,
        lambda b: [b[i * width : (i + 1) * width].reshape(h, d) for i in range(3)],
        lambda a: np.concatenate([x.reshape(-1) for x in a]),
    )


def conv_heads_out(hf: str, path: Path, width: int, heads: int, head_dim: int) -> TensorMap:
    """The ``Conv1D`` output weight ``[heads*head_dim, width]`` <-> ``[heads, head_dim, width]``."""
    return TensorMap(
        hf,
        (heads * head_dim, width),
        (path,),
        lambda w: [w.reshape(heads, head_dim, width)],
        lambda a: a[0].reshape(heads * head_dim, width),
    )


def block_maps(arch: Architecture, layer: int) -> list[TensorMap]:
    """The tensors of one GPT-2 layer (``transformer.h.<layer>.``)."""
    e, h, d, f = arch.n_embd, arch.attention.n_heads, arch.head_dim, arch.feed_forward.d_ff
    hf, ours = f"transformer.h.{layer}.", f"blocks_{layer}"
    maps = []
    for norm, ours_norm in (("ln_1", "attn_norm"), ("ln_2", "mlp_norm")):
        maps.append(same(hf + f"{norm}.weight", (ours, ours_norm, "scale"), (e,)))
        maps.append(same(hf + f"{norm}.bias", (ours, ours_norm, "bias"), (e,)))
    maps.append(fused_qkv_weight(hf + "attn.c_attn.weight", (ours, "attn"), e, h, d))
    maps.append(fused_qkv_bias(hf + "attn.c_attn.bias", (ours, "attn"), h, d))
    maps.append(conv_heads_out(hf + "attn.c_proj.weight", (ours, "attn", "out"), e, h, d))
    maps.append(same(hf + "attn.c_proj.bias", (ours, "attn", "out_bias"), (e,)))
    maps.append(same(hf + "mlp.c_fc.weight", (ours, "mlp", "up", "kernel"), (e, f)))
    maps.append(same(hf + "mlp.c_fc.bias", (ours, "mlp", "up", "bias"), (f,)))
    maps.append(same(hf + "mlp.c_proj.weight", (ours, "mlp", "down", "kernel"), (f, e)))
    maps.append(same(hf + "mlp.c_proj.bias", (ours, "mlp", "down", "bias"), (e,)))
    return maps


class GPT2Family(HFFamily):
    """``model_type: gpt2``."""

    identity: ClassVar[Identity] = Identity("gpt2", "GPT2LMHeadModel", "theseus.model.models.gpt.model:GPT")
    peft_modules: ClassVar[Mapping[str, str]] = {"out": "attn.c_proj", "up": "mlp.c_fc", "down": "mlp.c_proj"}
    peft_fused_qkv: ClassVar[str | None] = "attn.c_attn"
    fan_in_fan_out: ClassVar[bool] = True

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        activation = config.get("activation_function", "gelu_new")
        if activation not in ACTIVATIONS:
            raise unsupported("activation_function", activation, f"supported: {', '.join(ACTIVATIONS)}")
        expect(config, "scale_attn_weights", True)
        expect(config, "scale_attn_by_inverse_layer_idx", False)
        expect(config, "add_cross_attention", False)
        n_embd = int(require(config, "n_embd"))
        inner = config.get("n_inner")
        return {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/block_size": int(require(config, "n_positions")),
            "architecture/n_layers": int(require(config, "n_layer")),
            "architecture/n_heads": int(require(config, "n_head")),
            "architecture/n_kv_heads": int(require(config, "n_head")),
            "architecture/n_embd": n_embd,
            "architecture/d_ff": int(inner) if inner is not None else 4 * n_embd,
            "architecture/activation": ACTIVATIONS[activation],
            "architecture/norm_eps": float(config.get("layer_norm_epsilon", 1e-5)),
            "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", True)),
            "architecture/dropout": 0.0,
        }

    def canonical_name(self, name: str) -> str:
        """GPT-2 base models (``GPT2Model``) omit the ``transformer.`` prefix."""
        return name if name.startswith(("transformer.", "lm_head.")) else "transformer." + name

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        e = arch.n_embd
        maps = [
            vocab_embedding("transformer.wte.weight", ("token_embedding", "embedding"), arch),
            same("transformer.wpe.weight", ("position_embedding", "embedding"), (arch.block_size, e)),
        ]
        for i in range(arch.n_layers):
            maps.extend(block_maps(arch, i))
        maps.append(same("transformer.ln_f.weight", ("final_norm", "scale"), (e,)))
        maps.append(same("transformer.ln_f.bias", ("final_norm", "bias"), (e,)))
        if not arch.tied_embeddings:
            maps.append(vocab_head("lm_head.weight", ("lm_head",), arch))
        return maps

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        if arch.feed_forward.activation not in ACTIVATION_NAMES:
            raise cannot("gpt2", f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.kv_heads != arch.attention.n_heads:
            raise cannot("gpt2", "grouped-query attention (architecture/n_kv_heads)")
        if arch.head_dim * arch.attention.n_heads != arch.n_embd:
            raise cannot("gpt2", "architecture/head_dim different from n_embd / n_heads")
        if not (arch.attention.qkv_bias and arch.attention.has_out_bias and arch.feed_forward.bias and arch.norm.bias):
            raise cannot("gpt2", "projections without biases")
        return {
            "n_positions": arch.block_size,
            "n_embd": arch.n_embd,
            "n_layer": arch.n_layers,
            "n_head": arch.attention.n_heads,
            "n_inner": arch.feed_forward.d_ff,
            "activation_function": ACTIVATION_NAMES[arch.feed_forward.activation],
            "layer_norm_epsilon": arch.norm.eps,
            "resid_pdrop": arch.dropout,
            "embd_pdrop": arch.dropout,
            "attn_pdrop": 0.0,
            "scale_attn_weights": True,
        }

    def peft_layer_prefix(self, layer: int) -> str:
        return f"transformer.h.{layer}."


__all__ = ["GPT2Family", "block_maps", "conv_heads_out", "fused_qkv_bias", "fused_qkv_weight"]
