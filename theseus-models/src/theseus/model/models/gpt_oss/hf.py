"""GPT-OSS checkpoints (``GptOssForCausalLM``) <-> theseus' ``GptOss``: the ``hf/gpt_oss`` family.

Llama's attention (with ``attention_bias`` on all four projections) and norms, plus per layer the
attention ``sinks`` ``[heads]``, the router ``mlp.router`` (weight ``[E, D]`` and bias ``[E]``) and the
experts stacked as theseus stacks them: ``mlp.experts.gate_up_proj`` ``[E, D, 2F]`` (gate and up
columns interleaved: gate at the even ones) with its bias ``[E, 2F]``, ``down_proj`` ``[E, F, D]`` with
its bias ``[E, D]``. ``layer_types`` (default: sliding and full alternating) gives the sliding layers
``sliding_window``; the one ``rope_parameters`` entry (the releases: YaRN with ``truncate: false``)
rotates every layer. The released checkpoints store the experts in MXFP4 (``quantization_config``),
which import refuses in one line: a dequantized (bfloat16) copy imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import interleaved_layer_types, rope_keys, setting, sliding_window_of
from theseus.model.huggingface.family import Identity, cannot
from theseus.model.huggingface.names import TensorMap, same, transposed
from theseus.model.layers.attention import FULL_ATTENTION, SLIDING_ATTENTION
from theseus.model.models.gpt_oss.model import DEFAULT_ALPHA, DEFAULT_LIMIT
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, LlamaFamily
from theseus.model.models.mixtral.hf import (
    mixture,
    softmax_mixture,
    softmax_mixture_keys,
    without_dense_mlp,
)
from theseus.model.stack.architecture import Architecture

GPT_OSS_CLASS = "theseus.model.models.gpt_oss.model:GptOss"

#: transformers' ``rope_theta`` and ``sliding_window`` when ``config.json`` has none.
DEFAULT_THETA, DEFAULT_WINDOW = 150000.0, 128
ALPHA_KEY, LIMIT_KEY = "architecture/moe/swiglu_alpha", "architecture/moe/swiglu_limit"


def interleaved(hf: str, paths: tuple[tuple[str, ...], tuple[str, ...]], shape: tuple[int, ...]) -> TensorMap:
    """A tensor whose last axis interleaves two theseus parameters (``[..., 2F]``: the first at the even
    columns, the second at the odd ones) <-> the two ``[..., F]``."""

    def to_hf(leaves: list[np.ndarray]) -> np.ndarray:
        first, second = leaves
        return np.stack([first, second], axis=-1).reshape(*first.shape[:-1], -1)

    return TensorMap(hf, shape, paths, lambda w: [w[..., ::2], w[..., 1::2]], to_hf)


class GptOssFamily(LlamaFamily):
    """``model_type: gpt_oss``."""

    identity: ClassVar[Identity] = Identity("gpt_oss", "GptOssForCausalLM", GPT_OSS_CLASS)
    holds_window: ClassVar[bool] = True
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        keys = super().keys(config)
        types = self.layer_types(config)
        if SLIDING_ATTENTION in types and keys.get("architecture/sliding_window") is None:
            keys["architecture/sliding_window"] = keys["architecture/block_size"]  # longer than any sequence
        keys.update(
            {
                "architecture/layer_types": types,
                **softmax_mixture_keys(config),
                "architecture/moe/aux_loss": float(config.get("router_aux_loss_coef", 0.001)),
                ALPHA_KEY: float(config.get("swiglu_alpha", DEFAULT_ALPHA)),
                LIMIT_KEY: float(config.get("swiglu_limit", DEFAULT_LIMIT)),
            }
        )
        return keys

    def bias_keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        bias = bool(config.get("attention_bias", True))
        return {"architecture/attention_bias": bias, "architecture/attention_out_bias": bias}

    def layer_types(self, config: Mapping[str, Any]) -> list[str]:
        """``layer_types``, or transformers' default (sliding and full alternating, the first sliding)."""
        return interleaved_layer_types(config, 2)

    def window(self, config: Mapping[str, Any]) -> int | None:
        """The sliding layers' window; None when no layer slides."""
        return sliding_window_of(config, self.layer_types(config), DEFAULT_WINDOW)

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """One RoPE for every layer; the base defaults to GPT-OSS's 150000."""
        parameters = {"rope_theta": DEFAULT_THETA, **(config.get("rope_parameters") or {})}
        return rope_keys({**config, "rope_parameters": parameters})

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = without_dense_mlp(super().tensor_maps(arch), arch)
        moe = mixture(arch)
        e, f, d = moe.n_experts, moe.expert_hidden, arch.n_embd
        for i in range(arch.n_layers):
            hf, attn, mlp = f"model.layers.{i}.", (f"blocks_{i}", "attn"), (f"blocks_{i}", "mlp")
            maps += [
                same(hf + "self_attn.sinks", (*attn, "sinks"), (arch.attention.n_heads,)),
                transposed(hf + "mlp.router.weight", (*mlp, "router"), e, d),
                same(hf + "mlp.router.bias", (*mlp, "router_logit_bias"), (e,)),
                interleaved(hf + "mlp.experts.gate_up_proj", ((*mlp, "gate"), (*mlp, "up")), (e, d, 2 * f)),
                interleaved(hf + "mlp.experts.gate_up_proj_bias", ((*mlp, "gate_bias"), (*mlp, "up_bias")), (e, 2 * f)),
                same(hf + "mlp.experts.down_proj", (*mlp, "down"), (e, f, d)),
                same(hf + "mlp.experts.down_proj_bias", (*mlp, "down_bias"), (e, d)),
            ]
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = softmax_mixture(self.model_type, arch)
        if arch.position.scaling.kind == "longrope":
            raise cannot(self.model_type, "architecture/rope_scaling=longrope")
        config = super().config(arch, settings)
        config.update(
            {
                "intermediate_size": moe.expert_hidden,
                "num_local_experts": moe.n_experts,
                "num_experts_per_tok": moe.top_k,
                "output_router_logits": False,
                "router_aux_loss_coef": moe.aux_loss,
                "swiglu_alpha": setting(settings, ALPHA_KEY, DEFAULT_ALPHA),
                "swiglu_limit": setting(settings, LIMIT_KEY, DEFAULT_LIMIT),
            }
        )
        return config

    def family_config(self, arch: Architecture) -> dict[str, Any]:
        types = list(
            arch.layer_types or [SLIDING_ATTENTION if arch.attention.sliding_window else FULL_ATTENTION] * arch.n_layers
        )
        return {
            "attention_bias": arch.attention.qkv_bias,
            "layer_types": types,
            "sliding_window": arch.attention.sliding_window,
        }


__all__ = ["GPT_OSS_CLASS", "GptOssFamily", "interleaved"]
