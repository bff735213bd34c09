"""Qwen3-Next checkpoints (``Qwen3NextForCausalLM``, ``model_type: qwen3_next``) <-> theseus' ``Qwen3Next``:
the ``hf/qwen3_next`` family.

Per layer, by ``layer_types``: a ``full_attention`` layer's ``self_attn`` (``q_proj`` holds each head's
query and then its output gate, ``[heads * 2 * head_dim, hidden]``; ``k_proj`` / ``v_proj`` / ``o_proj``;
``q_norm`` / ``k_norm``), or a ``linear_attention`` layer's ``linear_attn``: ``in_proj_qkvz`` grouped by
query/key head (each group: its query, its key, then the values and the z gates of the value heads it
serves), ``in_proj_ba`` likewise (each group: the b then the a of its value heads), ``conv1d`` (the
query, key and value channels in that order), ``dt_bias``, ``A_log``, ``norm`` and ``out_proj``. Every
layer's ``mlp`` is the mixture (router ``gate``, ``experts.<j>.*_proj`` as ``save_pretrained`` writes
them, ``shared_expert`` and ``shared_expert_gate``) or, in ``mlp_only_layers`` (leading layers only), a
dense SwiGLU. The norms are zero-centred in both (stored as the offset from 1) and copied as they are.
:class:`HybridFamily` is this layout with a dense ``mlp`` on every layer, which Qwen3.5's families extend.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import partial_rotary_factor, rope_keys, setting, without_partial_rotary
from theseus.model.huggingface.family import Identity, PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    heads_in,
    heads_out,
    same,
)
from theseus.model.layers.attention import FULL_ATTENTION, LINEAR_ATTENTION
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, MLP_PEFT_MODULES
from theseus.model.models.llama4.hf import swiglu_maps
from theseus.model.models.mixtral.hf import expert_maps, mixture
from theseus.model.models.qwen3.hf import Qwen3Family
from theseus.model.models.qwen3_moe.hf import Qwen3MoEFamily
from theseus.model.stack.architecture import Architecture

QWEN3_NEXT_CLASS = "theseus.model.models.qwen3_next.model:Qwen3Next"
ROTARY_KEY = "architecture/partial_rotary_factor"
#: The Gated DeltaNet projections ``in_proj_qkvz`` holds, in the order of each key head's rows.
LINEAR_QKVZ = ("query", "key", "value", "z")
#: transformers' ``Qwen3NextConfig`` defaults of fields a ``config.json`` may leave out.
DEFAULT_PARTIAL, DEFAULT_INTERVAL = 0.25, 4


def grouped(hf: str, paths: list[tuple[str, ...]], widths: list[int], groups: int, n_embd: int) -> TensorMap:
    """An ``nn.Linear`` weight ``[groups * sum(widths), hidden]`` whose rows are ``groups`` blocks, each
    the pieces of ``widths`` in order <-> one kernel per piece, ``[hidden, groups * width]`` (the
    groups' pieces one after another)."""
    total = sum(widths)
    edges = np.cumsum([0, *widths])

    def to_theseus(w: np.ndarray) -> list[np.ndarray]:
        blocks = w.reshape(groups, total, n_embd)
        return [blocks[:, lo:hi].reshape(-1, n_embd).T for lo, hi in itertools.pairwise(edges)]

    def to_hf(arrays: list[np.ndarray]) -> np.ndarray:
        pieces = [a.reshape(n_embd, groups, -1).transpose(1, 2, 0) for a in arrays]
        return np.concatenate(pieces, axis=1).reshape(groups * total, n_embd)

    return TensorMap(hf, (groups * total, n_embd), tuple(paths), to_theseus, to_hf)


def reshaped(part: TensorMap, shapes: list[tuple[int, ...]]) -> TensorMap:
    """``part`` with its theseus parameters reshaped to ``shapes`` (and flattened back on export)."""
    return TensorMap(
        part.hf,
        part.hf_shape,
        part.paths,
        lambda w: [a.reshape(s) for a, s in zip(part.to_theseus(w), shapes, strict=True)],
        lambda arrays: part.to_hf([a.reshape(a.shape[0], -1) for a in arrays]),
    )


#: The gated attention's PEFT modules: the query shares ``q_proj`` with the output gate (``peft_interleaved``).
GATED_ATTENTION_PEFT_MODULES = {name: module for name, module in ATTENTION_PEFT_MODULES.items() if name != "query"}


class HybridFamily(Qwen3Family):
    """Qwen3-Next's layer layout (``linear_attn`` and gated ``self_attn`` layers, ``layer_types``, partial
    RoPE) with a dense SwiGLU ``mlp`` on every layer (:meth:`mlp_maps`): the base of the ``qwen3_next``
    family and of Qwen3.5's. Not a component itself (no ``model_type``)."""

    peft_interleaved: ClassVar[Mapping[str, tuple[str, ...]]] = {"self_attn.q_proj": ("query", "gate")}
    peft_modules: ClassVar[Mapping[str, str]] = {**GATED_ATTENTION_PEFT_MODULES, **MLP_PEFT_MODULES}

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """A full-attention layer's modules as the class attributes name them; a linear-attention layer's
        MLP modules (``peft_modules``), ``linear_attn.out_proj`` and its input projections
        (:meth:`linear_peft_layout`)."""
        if (arch.layer_types or (LINEAR_ATTENTION,) * arch.n_layers)[layer] != LINEAR_ATTENTION:
            return super().peft_layout(arch, layer)
        mlp = {target: module for target, module in self.peft_modules.items() if module.startswith("mlp.")}
        fused, interleaved = self.linear_peft_layout()
        return PeftLayout({**mlp, "out": "linear_attn.out_proj"}, fused, interleaved)

    def linear_peft_layout(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        """The fused and interleaved PEFT modules of a linear-attention layer's input projections:
        ``linear_attn.in_proj_qkvz`` (the adapters of ``query``, ``key``, ``value`` and ``z``, grouped per
        key head as the weight's rows are)."""
        return {}, {"linear_attn.in_proj_qkvz": LINEAR_QKVZ}

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        n_layers = int(require(config, "num_hidden_layers"))
        types = config.get("layer_types")
        if not types:
            every = int(config.get("full_attention_interval", DEFAULT_INTERVAL))
            types = [FULL_ATTENTION if (i + 1) % every == 0 else LINEAR_ATTENTION for i in range(n_layers)]
        if len(types) != n_layers or not set(types) <= {FULL_ATTENTION, LINEAR_ATTENTION}:
            raise unsupported("layer_types", types, f"expected {n_layers} of linear_attention / full_attention")
        keys.update(
            {
                "architecture/layer_types": list(types),
                "architecture/linear_num_key_heads": int(require(config, "linear_num_key_heads")),
                "architecture/linear_num_value_heads": int(require(config, "linear_num_value_heads")),
                "architecture/linear_key_head_dim": int(require(config, "linear_key_head_dim")),
                "architecture/linear_value_head_dim": int(require(config, "linear_value_head_dim")),
                "architecture/linear_conv_kernel_dim": int(config.get("linear_conv_kernel_dim", 4)),
                ROTARY_KEY: self.partial_rotary_factor(config),
            }
        )
        return keys

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No sliding window: ``layer_types`` name the linear and full layers, read in :meth:`keys`."""
        return None

    def partial_rotary_factor(self, config: Mapping[str, Any]) -> float:
        return partial_rotary_factor(config, DEFAULT_PARTIAL)

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """RoPE as Qwen3's, the partial rotation read apart (``architecture/partial_rotary_factor``)."""
        return rope_keys(without_partial_rotary(config))

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        from theseus.model.models.qwen3_next.model import Qwen3NextArchitecture

        if not isinstance(arch, Qwen3NextArchitecture):
            raise cannot(self.model_type, "a model without Qwen3-Next's layers")
        e, h, kv, d = arch.n_embd, arch.attention.n_heads, arch.attention.kv_heads, arch.head_dim
        types = arch.layer_types or (LINEAR_ATTENTION,) * arch.n_layers
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            hf, attn = f"model.layers.{i}.", (f"blocks_{i}", "attn")
            maps += self.layer_norm_maps(arch, i)
            if types[i] == FULL_ATTENTION:
                query = grouped(hf + "self_attn.q_proj.weight", [(*attn, "query"), (*attn, "gate")], [d, d], h, e)
                maps += [
                    reshaped(query, [(e, h, d), (e, h, d)]),
                    heads_in(hf + "self_attn.k_proj.weight", (*attn, "key"), e, kv, d),
                    heads_in(hf + "self_attn.v_proj.weight", (*attn, "value"), e, kv, d),
                    heads_out(hf + "self_attn.o_proj.weight", (*attn, "out"), e, h, d),
                    same(hf + "self_attn.q_norm.weight", (*attn, "query_norm", "scale"), (d,)),
                    same(hf + "self_attn.k_norm.weight", (*attn, "key_norm", "scale"), (d,)),
                ]
            else:
                maps += self.linear_maps(arch, hf + "linear_attn.", attn)
            maps += self.mlp_maps(arch, i)
        maps += head_maps(arch)
        return maps

    def mlp_maps(self, arch: Any, layer: int) -> list[TensorMap]:
        """Layer ``layer``'s feed-forward tensors: the dense SwiGLU ``mlp`` (``arch`` a ``Qwen3NextArchitecture``)."""
        ours = (f"blocks_{layer}", "mlp")
        return swiglu_maps(f"model.layers.{layer}.mlp.", ours, arch.feed_forward.d_ff, arch.n_embd)

    def linear_maps(self, arch: Any, hf: str, ours: tuple[str, ...]) -> list[TensorMap]:
        """One Gated DeltaNet layer's tensors (``arch`` a ``Qwen3NextArchitecture``)."""
        e = arch.n_embd
        nk, nv, dk, dv = arch.linear_key_heads, arch.linear_value_heads, arch.linear_key_dim, arch.linear_value_dim
        r, taps = nv // nk, arch.conv_kernel
        qkvz = grouped(hf + "in_proj_qkvz.weight", [(*ours, n) for n in LINEAR_QKVZ], [dk, dk, r * dv, r * dv], nk, e)
        ba = grouped(hf + "in_proj_ba.weight", [(*ours, "b"), (*ours, "a")], [r, r], nk, e)
        channels = [nk * dk, nk * dk, nv * dv]
        edges = np.cumsum([0, *channels])
        conv_shapes = [(taps, nk, dk), (taps, nk, dk), (taps, nv, dv)]

        def conv_in(w: np.ndarray) -> list[np.ndarray]:
            taps_major = w[:, 0, :].T  # [K, C]
            pieces = [taps_major[:, lo:hi] for lo, hi in itertools.pairwise(edges)]
            return [p.reshape(s) for p, s in zip(pieces, conv_shapes, strict=True)]

        def conv_out(arrays: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([a.reshape(taps, -1) for a in arrays], axis=1).T[:, None, :]

        conv_paths = tuple((*ours, f"conv_{n}") for n in ("query", "key", "value"))
        return [
            reshaped(qkvz, [(e, nk, dk), (e, nk, dk), (e, nv, dv), (e, nv, dv)]),
            ba,
            TensorMap(hf + "conv1d.weight", (sum(channels), 1, taps), conv_paths, conv_in, conv_out),
            same(hf + "dt_bias", (*ours, "dt_bias"), (nv,)),
            same(hf + "A_log", (*ours, "A_log"), (nv,)),
            same(hf + "norm.weight", (*ours, "norm", "scale"), (dv,)),
            heads_out(hf + "out_proj.weight", (*ours, "out"), e, nv, dv),
        ]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.qwen3_next.model import Qwen3NextArchitecture

        if not isinstance(arch, Qwen3NextArchitecture):
            raise cannot(self.model_type, "a model without Qwen3-Next's layers")
        config = super().config(arch, settings)
        partial = setting(settings, ROTARY_KEY, DEFAULT_PARTIAL)
        rope = dict(config.get("rope_parameters") or {"rope_type": "default", "rope_theta": arch.position.theta})
        config.pop("sliding_window", None)
        config.pop("use_sliding_window", None)
        config.pop("max_window_layers", None)
        config.update(
            {
                "rope_parameters": {**rope, "partial_rotary_factor": partial},
                "partial_rotary_factor": partial,
                "layer_types": list(arch.layer_types or ()),
                "linear_num_key_heads": arch.linear_key_heads,
                "linear_num_value_heads": arch.linear_value_heads,
                "linear_key_head_dim": arch.linear_key_dim,
                "linear_value_head_dim": arch.linear_value_dim,
                "linear_conv_kernel_dim": arch.conv_kernel,
                "attention_bias": False,
            }
        )
        return config


class Qwen3NextFamily(HybridFamily, Qwen3MoEFamily):
    """``model_type: qwen3_next``: :class:`HybridFamily`'s layers whose ``mlp`` is the mixture with the gated
    shared expert (dense in ``mlp_only_layers``)."""

    identity: ClassVar[Identity] = Identity("qwen3_next", "Qwen3NextForCausalLM", QWEN3_NEXT_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = GATED_ATTENTION_PEFT_MODULES

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        if int(config.get("num_experts") or 0) < 1:
            raise unsupported("num_experts", config.get("num_experts"), f"a {self.model_type} model has a mixture")
        keys.update(
            {
                "architecture/moe/shared_expert_hidden": int(config.get("shared_expert_intermediate_size") or 0),
                "architecture/moe/n_shared": 0,
                "architecture/moe/aux_loss": float(config.get("router_aux_loss_coef", 0.001)),
            }
        )
        return keys

    def mlp_maps(self, arch: Any, layer: int) -> list[TensorMap]:
        """The dense MLP on the leading ``first_k_dense`` layers, else the router ``gate``, the experts
        (:meth:`expert_maps`), ``shared_expert`` and ``shared_expert_gate``."""
        if layer < mixture(arch).first_k_dense:
            return super().mlp_maps(arch, layer)
        hf, mlp, e = f"model.layers.{layer}.mlp.", (f"blocks_{layer}", "mlp"), arch.n_embd
        maps = self.expert_maps(arch, layer)
        if arch.shared_expert_hidden:
            maps += swiglu_maps(hf + "shared_expert.", (*mlp, "shared"), arch.shared_expert_hidden, e)
            maps.append(
                TensorMap(
                    hf + "shared_expert_gate.weight",
                    (1, e),
                    ((*mlp, "shared_gate"),),
                    lambda w: [w.reshape(-1)],
                    lambda a: a[0].reshape(1, -1),
                )
            )
        return maps

    def expert_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """The router ``gate`` and the experts one tensor each (``experts.<j>.*_proj``), as ``save_pretrained``
        writes them."""
        projections = {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"}
        return expert_maps(arch, layer, f"model.layers.{layer}.mlp.", "gate", projections)

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        if mixture(arch).n_shared:
            raise cannot(self.model_type, "architecture/moe/n_shared > 0 (its shared expert is the gated one)")
        config = super().config(arch, settings)
        config["shared_expert_intermediate_size"] = arch.shared_expert_hidden  # type: ignore[attr-defined]
        return config


__all__ = ["QWEN3_NEXT_CLASS", "HybridFamily", "Qwen3NextFamily", "grouped", "reshaped"]
