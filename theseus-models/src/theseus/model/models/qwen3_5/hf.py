"""Qwen3.5 checkpoints <-> theseus' ``Qwen35`` / ``Qwen35MoE``: the ``hf/qwen3_5_text``
(``Qwen3_5ForCausalLM``), ``hf/qwen3_5`` (``Qwen3_5ForConditionalGeneration``), ``hf/qwen3_5_moe_text``
(``Qwen3_5MoeForCausalLM``) and ``hf/qwen3_5_moe`` (``Qwen3_5MoeForConditionalGeneration``) families.

The layout is Qwen3-Next's (:mod:`theseus.model.models.qwen3_next.hf`) with these differences:

- a ``linear_attention`` layer's input projections are split and not grouped per key head:
  ``in_proj_qkv`` (every query head, then every key head, then every value head), ``in_proj_z``,
  ``in_proj_b`` and ``in_proj_a`` (one row per value head each);
- the dense models have a SwiGLU ``mlp`` of ``intermediate_size`` on every layer; the MoE models the
  mixture with the gated shared expert on every layer (no ``mlp_only_layers``, no ``norm_topk_prob``:
  the top-k weights are always renormalised, no ``intermediate_size``);
- the vision-language checkpoints (``qwen3_5``, ``qwen3_5_moe``, what the releases are) nest the language
  model's fields in ``text_config`` and its tensors under ``model.language_model.``; the vision tower
  (``model.visual.*``) is left out of the import (theseus imports the language model only), as are the
  multi-token-prediction layers (``mtp.*``, which transformers does not load either). Such a run exports as
  the text-only checkpoint (``qwen3_5_text`` / ``qwen3_5_moe_text``);
- the rotary embedding is multimodal RoPE (``rope_parameters.mrope_section``, ``mrope_interleaved``): the
  rotated frequencies are split between a temporal, a height and a width position, which for text are all the
  token's position, so a text model rotates exactly as Qwen3-Next's partial RoPE. Both fields are accepted
  and not written back (transformers' default section applies);
- the releases store a layer's experts fused (``experts.gate_up_proj`` ``[E, 2 * F, D]``: each expert's
  gate rows then its up rows; ``experts.down_proj`` ``[E, D, F]``); ``save_pretrained`` writes them one
  tensor each (``experts.<j>.*_proj``). Import reads either; export writes the latter.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.family import Identity, NestedLanguageModel, cannot, expect, require, unsupported
from theseus.model.huggingface.names import TensorMap, heads_in, transposed
from theseus.model.models.mixtral.hf import mixture
from theseus.model.models.qwen3_next.hf import HybridFamily, Qwen3NextFamily
from theseus.model.stack.architecture import Architecture

QWEN3_5_CLASS = "theseus.model.models.qwen3_5.model:Qwen35"
QWEN3_5_MOE_CLASS = "theseus.model.models.qwen3_5.model:Qwen35MoE"
#: The vision-language checkpoints' prefix of the language model's tensors (``model.`` in ``*ForCausalLM``).
LANGUAGE_MODEL = "model.language_model."
#: Tensors of the checkpoint that the import leaves out: the multi-token-prediction layers.
MTP = "mtp."
#: The vision tower of a vision-language checkpoint.
VISUAL = "model.visual."
#: ``rope_parameters`` fields of the multimodal RoPE, which text positions do not use.
MROPE_FIELDS = ("mrope_section", "mrope_interleaved")


def fused_experts(hf: str, path: tuple[str, ...], n_experts: int, hidden: int, n_embd: int) -> list[TensorMap]:
    """A layer's fused experts, ``<hf>gate_up_proj`` ``[E, 2 * F, D]`` (each expert's gate rows then its up
    rows) and ``<hf>down_proj`` ``[E, D, F]`` <-> the stacked kernels ``gate`` / ``up`` ``[E, D, F]`` and
    ``down`` ``[E, F, D]`` at ``path``."""

    def gate_up_in(w: np.ndarray) -> list[np.ndarray]:
        return [w[:, :hidden].transpose(0, 2, 1), w[:, hidden:].transpose(0, 2, 1)]

    def gate_up_out(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([a.transpose(0, 2, 1) for a in arrays], axis=1)

    return [
        TensorMap(
            hf + "gate_up_proj",
            (n_experts, 2 * hidden, n_embd),
            ((*path, "gate"), (*path, "up")),
            gate_up_in,
            gate_up_out,
        ),
        TensorMap(
            hf + "down_proj",
            (n_experts, n_embd, hidden),
            ((*path, "down"),),
            lambda w: [w.transpose(0, 2, 1)],
            lambda arrays: arrays[0].transpose(0, 2, 1),
        ),
    ]


class Qwen35Layout(HybridFamily):
    """What every Qwen3.5 family changes of Qwen3-Next's layout: the split input projections of the linear
    layers (and their PEFT modules), the ``model.language_model.`` prefix, the multi-token-prediction
    tensors set aside, the multimodal RoPE fields read as plain RoPE."""

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "attn_output_gate", True)
        return super().keys(config)

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Qwen3-Next's RoPE keys; the multimodal fields (:data:`MROPE_FIELDS`) change nothing for text."""
        stripped = dict(config)
        for name in ("rope_parameters", "rope_scaling"):
            if isinstance(stripped.get(name), Mapping):
                stripped[name] = {k: v for k, v in stripped[name].items() if k not in MROPE_FIELDS}
        return super().rope(stripped)

    def canonical_name(self, name: str) -> str:
        """The vision-language layout's ``model.language_model.`` is ``*ForCausalLM``'s ``model.``."""
        return "model." + name.removeprefix(LANGUAGE_MODEL) if name.startswith(LANGUAGE_MODEL) else name

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """The multi-token-prediction layers (``mtp.*``), which transformers does not load either."""
        return name.startswith(MTP)

    # -- both ways ---------------------------------------------------------------------------------
    def linear_maps(self, arch: Any, hf: str, ours: tuple[str, ...]) -> list[TensorMap]:
        """Qwen3-Next's Gated DeltaNet tensors with the input projections split: ``in_proj_qkv`` (the
        query, key and value heads in that order), ``in_proj_z``, ``in_proj_b`` and ``in_proj_a``."""
        e = arch.n_embd
        nk, nv, dk, dv = arch.linear_key_heads, arch.linear_value_heads, arch.linear_key_dim, arch.linear_value_dim
        widths, names = [nk * dk, nk * dk, nv * dv], ("query", "key", "value")
        edges = np.cumsum([0, *widths])
        shapes = [(e, nk, dk), (e, nk, dk), (e, nv, dv)]

        def qkv_in(w: np.ndarray) -> list[np.ndarray]:
            return [w[lo:hi].T.reshape(s) for lo, hi, s in zip(edges[:-1], edges[1:], shapes, strict=True)]

        def qkv_out(arrays: list[np.ndarray]) -> np.ndarray:
            return np.concatenate([a.reshape(e, -1).T for a in arrays], axis=0)

        qkv = TensorMap(hf + "in_proj_qkv.weight", (sum(widths), e), tuple((*ours, n) for n in names), qkv_in, qkv_out)
        split = [
            qkv,
            heads_in(hf + "in_proj_z.weight", (*ours, "z"), e, nv, dv),
            transposed(hf + "in_proj_b.weight", (*ours, "b"), nv, e),
            transposed(hf + "in_proj_a.weight", (*ours, "a"), nv, e),
        ]
        grouped_names = (hf + "in_proj_qkvz.weight", hf + "in_proj_ba.weight")
        return split + [m for m in super().linear_maps(arch, hf, ours) if m.hf not in grouped_names]

    def linear_peft_layout(self) -> tuple[dict[str, tuple[str, ...]], dict[str, tuple[str, ...]]]:
        """``linear_attn.in_proj_qkv`` fuses the ``query``, ``key`` and ``value`` adapters (one block of rows
        each); ``linear_attn.in_proj_z`` holds the ``z`` adapter (its rows per value head)."""
        return {"linear_attn.in_proj_qkv": ("query", "key", "value")}, {"linear_attn.in_proj_z": ("z",)}

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        config = super().config(arch, settings)
        config["attn_output_gate"] = True
        return config


class VisionLanguage(NestedLanguageModel, HybridFamily):
    """A vision-language checkpoint of a Qwen3.5 text family (the next class in the MRO): the language
    model's ``config.json`` fields in ``text_config``, its tensors under ``model.language_model.``; the
    vision tower's tensors (``model.visual.*``) are set aside (:class:`NestedLanguageModel`). Export writes
    the text family's checkpoint (``text``): theseus holds no vision tower to write."""

    towers: ClassVar[tuple[str, ...]] = (VISUAL,)


class Qwen35TextFamily(Qwen35Layout):
    """``model_type: qwen3_5_text``: dense Qwen3.5 (a SwiGLU ``mlp`` on every layer)."""

    identity: ClassVar[Identity] = Identity("qwen3_5_text", "Qwen3_5ForCausalLM", QWEN3_5_CLASS)

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        if config.get("num_experts"):
            raise unsupported("num_experts", config["num_experts"], "a mixture is model_type qwen3_5_moe_text")
        return super().keys(config)


class Qwen35Family(VisionLanguage, Qwen35TextFamily):
    """``model_type: qwen3_5``: the language model of a dense Qwen3.5 vision-language checkpoint."""

    identity: ClassVar[Identity] = Identity("qwen3_5", "Qwen3_5ForConditionalGeneration")
    text: ClassVar[Identity] = Qwen35TextFamily.identity


class Qwen35MoETextFamily(Qwen35Layout, Qwen3NextFamily):
    """``model_type: qwen3_5_moe_text``: Qwen3.5 MoE (the mixture with the gated shared expert on every
    layer). A checkpoint whose experts are fused (the releases) is read as such: :meth:`checkpoint_keys`
    notes it, for :meth:`expert_maps`."""

    identity: ClassVar[Identity] = Identity("qwen3_5_moe_text", "Qwen3_5MoeForCausalLM", QWEN3_5_MOE_CLASS)

    #: Whether the checkpoint being imported stores each layer's experts fused (set by ``checkpoint_keys``).
    fused: bool = False

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expert_width = int(require(config, "moe_intermediate_size"))
        # no dense layer: d_ff (transformers' config has no intermediate_size) is the experts' width
        keys = super().keys({"intermediate_size": expert_width, **config})
        if keys["architecture/moe/first_k_dense"]:
            raise unsupported("mlp_only_layers", config.get("mlp_only_layers"), "Qwen3.5 MoE has no dense layer")
        keys["architecture/moe/norm_topk_prob"] = True
        return keys

    def checkpoint_keys(self, keys: dict[str, Any], names: Collection[str]) -> dict[str, Any]:
        """Notes whether the experts are fused (``mlp.experts.gate_up_proj``); ``keys`` as they are."""
        self.fused = any(name.endswith(".mlp.experts.gate_up_proj") for name in names)
        return super().checkpoint_keys(keys, names)

    def expert_maps(self, arch: Architecture, layer: int) -> list[TensorMap]:
        """The router ``gate`` and the experts: one tensor each, or fused (:func:`fused_experts`) when the
        checkpoint being imported holds them so."""
        if not self.fused:
            return super().expert_maps(arch, layer)
        moe, hf = mixture(arch), f"model.layers.{layer}.mlp."
        path = (f"blocks_{layer}", "mlp")
        router = transposed(hf + "gate.weight", (*path, "router"), moe.n_experts, arch.n_embd)
        return [router, *fused_experts(hf + "experts.", path, moe.n_experts, moe.expert_hidden, arch.n_embd)]

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = mixture(arch)
        if moe.first_k_dense:
            raise cannot(self.model_type, f"architecture/moe/first_k_dense={moe.first_k_dense} (dense layers)")
        if not moe.norm_topk_prob:
            raise cannot(self.model_type, "architecture/moe/norm_topk_prob=false (it always renormalises)")
        config = super().config(arch, settings)
        for name in ("intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"):
            config.pop(name, None)  # fields transformers' Qwen3.5 MoE configuration does not have
        return config


class Qwen35MoEFamily(VisionLanguage, Qwen35MoETextFamily):
    """``model_type: qwen3_5_moe``: the language model of a Qwen3.5 MoE vision-language checkpoint."""

    identity: ClassVar[Identity] = Identity("qwen3_5_moe", "Qwen3_5MoeForConditionalGeneration")
    text: ClassVar[Identity] = Qwen35MoETextFamily.identity


__all__ = [
    "QWEN3_5_CLASS",
    "QWEN3_5_MOE_CLASS",
    "Qwen35Family",
    "Qwen35Layout",
    "Qwen35MoEFamily",
    "Qwen35MoETextFamily",
    "Qwen35TextFamily",
    "VisionLanguage",
    "fused_experts",
]
