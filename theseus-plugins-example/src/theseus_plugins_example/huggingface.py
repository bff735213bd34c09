"""``ScaledGPT`` checkpoints in Hugging Face's layout: the ``hf/example_scaled_gpt`` family.

GPT-2's ``config.json`` and tensors, plus the model's own: ``scale`` (``architecture/scale``) and each
layer's extra feed-forward branch as ``transformer.h.<i>.extra.c_fc`` / ``extra.c_proj``. With it,
``hf/export`` writes a ``ScaledGPT`` run as a checkpoint folder and ``hf/import`` (or
``training/init_from=hf:``) reads it back, as for the built-in families.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import require
from theseus.model.huggingface.names import TensorMap, same
from theseus.model.models.gpt.hf import GPT2Family
from theseus.model.stack.architecture import Architecture


class ScaledGPTFamily(GPT2Family):
    """``model_type: example_scaled_gpt``."""

    model_type: ClassVar[str] = "example_scaled_gpt"
    hf_class: ClassVar[str] = "ExampleScaledGPTLMHeadModel"
    model_class: ClassVar[str] = "theseus_plugins_example.models:ScaledGPT"

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().keys(config), "architecture/scale": float(require(config, "scale"))}

    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        return {**super().config(arch, settings), "scale": float(settings.get("architecture/scale", 1.0))}

    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        e, f = arch.n_embd, arch.feed_forward.d_ff
        maps = super().tensor_maps(arch)
        for i in range(arch.n_layers):
            hf, extra = f"transformer.h.{i}.extra.", (f"blocks_{i}", "extra", "mlp")
            maps.append(same(hf + "c_fc.weight", (*extra, "up", "kernel"), (e, f)))
            maps.append(same(hf + "c_fc.bias", (*extra, "up", "bias"), (f,)))
            maps.append(same(hf + "c_proj.weight", (*extra, "down", "kernel"), (f, e)))
            maps.append(same(hf + "c_proj.bias", (*extra, "down", "bias"), (e,)))
        return maps
