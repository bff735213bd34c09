"""LFM2 checkpoints (``Lfm2ForCausalLM``, ``model_type: lfm2``) <-> theseus' ``Lfm2``: the ``hf/lfm2`` family.

Per layer, by ``layer_types`` (or the older ``full_attn_idxs``): a ``full_attention`` layer's ``self_attn``
(``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``, per-head ``q_layernorm`` / ``k_layernorm``) or a ``conv``
layer's ``conv``: ``in_proj`` (the rows of ``B``, ``C`` and ``x``, in that order), ``conv`` (a depthwise
``Conv1d``, ``[hidden, 1, conv_L_cache]``) and ``out_proj``, with biases when ``conv_bias``. Every layer has
``operator_norm`` before its mixer, ``ffn_norm`` before its ``feed_forward`` (``w1`` gate, ``w3`` up, ``w2``
down); ``model.embedding_norm`` is the final norm. The feed-forward's width is ``intermediate_size`` (or the
older ``block_ff_dim``), adjusted as transformers does when ``block_auto_adjust_ff_dim``: two thirds, times
``block_ffn_dim_multiplier``, rounded up to ``block_multiple_of``. The export writes the width itself and
``block_auto_adjust_ff_dim: false``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.family import Identity, PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    heads_in,
    same,
    transposed,
)
from theseus.model.layers.attention import FULL_ATTENTION
from theseus.model.layers.short_conv import GATES, SHORT_CONV
from theseus.model.models.llama.hf import LlamaFamily, attention_maps, attention_peft_modules
from theseus.model.stack.architecture import Architecture

LFM2_CLASS = "theseus.model.models.lfm2.model:Lfm2"
#: transformers' ``Lfm2Config`` defaults of fields a ``config.json`` may leave out.
DEFAULT_THETA, DEFAULT_NORM_EPS, DEFAULT_KERNEL, DEFAULT_MULTIPLE = 1e6, 1e-5, 3, 256


def feed_forward_width(config: Mapping[str, Any]) -> int:
    """The SwiGLU width transformers builds from ``intermediate_size`` (``block_ff_dim``) and the
    ``block_*`` fields."""
    width = int(config.get("intermediate_size") or require(config, "block_ff_dim"))
    if not config.get("block_auto_adjust_ff_dim", True):
        return width
    width = int(2 * width / 3)
    multiplier = config.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is not None:
        multiple = int(config.get("block_multiple_of", DEFAULT_MULTIPLE))
        width = int(multiplier * width)
        width = multiple * ((width + multiple - 1) // multiple)
    return width


def layer_types(config: Mapping[str, Any]) -> list[str]:
    """``layer_types``, or the older ``full_attn_idxs`` (None: every layer attention), as transformers reads them."""
    n_layers = int(require(config, "num_hidden_layers"))
    types = config.get("layer_types")
    if not types:
        full = config.get("full_attn_idxs")
        full = range(n_layers) if full is None else full
        types = [FULL_ATTENTION if i in full else SHORT_CONV for i in range(n_layers)]
    if len(types) != n_layers or not set(types) <= {FULL_ATTENTION, SHORT_CONV}:
        raise unsupported("layer_types", list(types), f"expected {n_layers} of {SHORT_CONV} / {FULL_ATTENTION}")
    return list(types)


def in_proj_map(hf: str, path: tuple[str, ...], width: int) -> TensorMap:
    """``in_proj.weight`` ``[3 * hidden, hidden]`` (the rows of B, C, x) <-> ``in_proj`` ``[hidden, 3, hidden]``:
    a query projection's layout (:func:`heads_in`) with the three gates as its heads."""
    return heads_in(hf, path, width, len(GATES), width)


def conv_map(hf: str, path: tuple[str, ...], width: int, taps: int) -> TensorMap:
    """The depthwise ``Conv1d`` weight ``[hidden, 1, taps]`` <-> ``conv`` ``[taps, hidden]``."""
    return TensorMap(
        hf, (width, 1, taps), (path,), lambda w: [w[:, 0, :].T], lambda a: np.ascontiguousarray(a[0].T)[:, None, :]
    )


class Lfm2Family(LlamaFamily):
    """``model_type: lfm2``."""

    identity: ClassVar[Identity] = Identity("lfm2", "Lfm2ForCausalLM", LFM2_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = {
        **attention_peft_modules(out="out_proj"),
        "gate": "feed_forward.w1",
        "up": "feed_forward.w3",
        "down": "feed_forward.w2",
    }

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """An attention layer's modules as :attr:`peft_modules` names them; a ``conv`` layer's feed-forward only."""
        if (arch.layer_types or (FULL_ATTENTION,) * arch.n_layers)[layer] != SHORT_CONV:
            return super().peft_layout(arch, layer)
        mlp = {target: module for target, module in self.peft_modules.items() if module.startswith("feed_forward.")}
        return PeftLayout(mlp, {}, {})

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        if config.get("rope_theta") is None and "rope_theta" not in (config.get("rope_parameters") or {}):
            config = {**config, "rope_theta": DEFAULT_THETA}
        tied = config.get("tie_word_embeddings", config.get("tie_embedding", True))
        llama_view = {
            **config,
            "intermediate_size": feed_forward_width(config),
            "rms_norm_eps": float(config.get("norm_eps", DEFAULT_NORM_EPS)),
            "tie_word_embeddings": bool(tied),
            "attention_bias": False,
            "mlp_bias": False,
        }
        keys = super().keys(llama_view)
        keys.update(
            {
                "architecture/layer_types": layer_types(config),
                "architecture/short_conv_kernel": int(config.get("conv_L_cache", DEFAULT_KERNEL)),
                "architecture/short_conv_bias": bool(config.get("conv_bias", False)),
            }
        )
        return keys

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No attention window: ``layer_types`` name the convolution and attention layers, read in :meth:`keys`."""
        return None

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        from theseus.model.models.lfm2.model import Lfm2Architecture

        if not isinstance(arch, Lfm2Architecture):
            raise cannot(self.model_type, "a model without LFM2's short-convolution layers")
        e, d, f = arch.n_embd, arch.head_dim, arch.feed_forward.d_ff
        types = arch.layer_types or (FULL_ATTENTION,) * arch.n_layers
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            attn = (ours, "attn")
            maps += [
                same(hf + "operator_norm.weight", (ours, "attn_norm", "scale"), (e,)),
                same(hf + "ffn_norm.weight", (ours, "mlp_norm", "scale"), (e,)),
            ]
            if types[i] == SHORT_CONV:
                conv = hf + "conv."
                maps += [
                    in_proj_map(conv + "in_proj.weight", (*attn, "in_proj"), e),
                    conv_map(conv + "conv.weight", (*attn, "conv"), e, arch.conv_kernel),
                    transposed(conv + "out_proj.weight", (*attn, "out_proj"), e, e),
                ]
                if arch.conv_bias:
                    maps += [
                        TensorMap(
                            conv + "in_proj.bias",
                            (len(GATES) * e,),
                            ((*attn, "in_proj_bias"),),
                            lambda w: [w.reshape(len(GATES), -1)],
                            lambda a: a[0].reshape(-1),
                        ),
                        same(conv + "conv.bias", (*attn, "conv_bias"), (e,)),
                        same(conv + "out_proj.bias", (*attn, "out_proj_bias"), (e,)),
                    ]
            else:
                sa = hf + "self_attn."
                maps += [
                    *attention_maps(arch, i, out="out_proj"),
                    same(sa + "q_layernorm.weight", (*attn, "query_norm", "scale"), (d,)),
                    same(sa + "k_layernorm.weight", (*attn, "key_norm", "scale"), (d,)),
                ]
            for name, ours_name, shape in (("w1", "gate", (f, e)), ("w3", "up", (f, e)), ("w2", "down", (e, f))):
                maps.append(transposed(f"{hf}feed_forward.{name}.weight", (ours, "mlp", ours_name, "kernel"), *shape))
        maps += head_maps(arch, "model.embedding_norm.weight")
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.lfm2.model import Lfm2Architecture

        if not isinstance(arch, Lfm2Architecture):
            raise cannot(self.model_type, "a model without LFM2's short-convolution layers")
        if arch.feed_forward.activation != "swiglu":
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.sliding_window is not None:
            raise cannot(self.model_type, f"architecture/sliding_window={arch.attention.sliding_window}")
        if arch.attention.qkv_bias or arch.attention.has_out_bias or arch.feed_forward.bias:
            raise cannot(self.model_type, "attention or MLP biases")
        if not arch.attention.qk_norm or arch.attention.qk_norm_span != "head":
            raise cannot(self.model_type, "attention without per-head query/key norms")
        if arch.head_dim * arch.attention.n_heads != arch.n_embd:
            raise cannot(self.model_type, f"architecture/head_dim={arch.head_dim} (it is hidden_size / heads)")
        types = list(arch.layer_types or (FULL_ATTENTION,) * arch.n_layers)
        return {
            "hidden_size": arch.n_embd,
            "intermediate_size": arch.feed_forward.d_ff,
            "block_auto_adjust_ff_dim": False,
            "num_hidden_layers": arch.n_layers,
            "num_attention_heads": arch.attention.n_heads,
            "num_key_value_heads": arch.attention.kv_heads,
            "max_position_embeddings": arch.block_size,
            "norm_eps": arch.norm.eps,
            "conv_L_cache": arch.conv_kernel,
            "conv_bias": arch.conv_bias,
            "layer_types": types,
            "full_attn_idxs": [i for i, t in enumerate(types) if t == FULL_ATTENTION],
            "rope_theta": arch.position.theta,
            **self.rope_config(arch),
        }


__all__ = ["LFM2_CLASS", "Lfm2Family", "conv_map", "feed_forward_width", "in_proj_map", "layer_types"]
