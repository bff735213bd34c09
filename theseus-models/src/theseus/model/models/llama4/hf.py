"""Llama 4 text checkpoints (``Llama4ForCausalLM``, ``model_type: llama4_text``) <-> theseus' ``Llama4``:
the ``hf/llama4_text`` family.

Llama's attention projections and norms; each layer's ``feed_forward`` is a dense SwiGLU
(``gate_proj`` / ``up_proj`` / ``down_proj`` of ``intermediate_size_mlp``) or, at ``moe_layers``
(default: every ``interleave_moe_layer_step``-th layer), the mixture: ``router`` ``[E, D]``, the experts
fused as theseus stacks them (``experts.gate_up_proj`` ``[E, D, 2F]``: the gate's columns, then the up
projection's; ``experts.down_proj`` ``[E, F, D]``) and ``shared_expert`` (a SwiGLU of
``intermediate_size``). ``no_rope_layers`` (default every 4th layer 0) gives theseus' ``layer_types``
(``chunked_attention`` / ``full_attention``); ``attention_chunk_size``, ``use_qk_norm``,
``attn_temperature_tuning``, ``floor_scale`` and ``attn_scale`` are the attention's keys. Only the text
model: a multimodal ``llama4`` checkpoint's ``text_config`` is not read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np

from theseus.model.huggingface.config_fields import rope_keys, setting, setting_or_none
from theseus.model.huggingface.family import Identity, cannot, expect, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    same,
    transposed,
)
from theseus.model.layers.attention import CHUNKED_ATTENTION, FULL_ATTENTION
from theseus.model.models.llama.hf import ATTENTION_PEFT_MODULES, AttentionBiasFamily, attention_maps
from theseus.model.models.llama4.model import NOPE_EVERY, mixture_layers
from theseus.model.models.mixtral.hf import mixture
from theseus.model.stack.architecture import Architecture

LLAMA4_CLASS = "theseus.model.models.llama4.model:Llama4"

#: transformers' ``Llama4TextConfig`` defaults of the fields a ``config.json`` may leave out.
DEFAULT_THETA, DEFAULT_CHUNK, DEFAULT_FLOOR_SCALE, DEFAULT_ATTN_SCALE = 500000.0, 8192, 8192, 0.1
CHUNK_KEY, QK_NORM_KEY = "architecture/attention_chunk_size", "architecture/qk_l2_norm"
TUNING_KEY, FLOOR_KEY = "architecture/attn_temperature_tuning", "architecture/attn_floor_scale"
SCALE_KEY = "architecture/attn_scale"


def halves(hf: str, paths: tuple[tuple[str, ...], tuple[str, ...]], shape: tuple[int, ...]) -> TensorMap:
    """A tensor whose last axis holds two theseus parameters one after the other (``[..., 2F]``: the
    first in columns ``:F``, the second in ``F:``) <-> the two ``[..., F]``."""
    f = shape[-1] // 2
    return TensorMap(hf, shape, paths, lambda w: [w[..., :f], w[..., f:]], lambda a: np.concatenate(a, axis=-1))


def swiglu_maps(prefix: str, path: tuple[str, ...], width: int, n_embd: int) -> list[TensorMap]:
    """``<prefix>{gate,up,down}_proj.weight`` <-> the kernels of the SwiGLU MLP at ``path``."""
    shapes = {"gate": (width, n_embd), "up": (width, n_embd), "down": (n_embd, width)}
    return [transposed(f"{prefix}{n}_proj.weight", (*path, n, "kernel"), *s) for n, s in shapes.items()]


def whole(value: float) -> int | float:
    """``value`` as an int when it is one (transformers types ``floor_scale`` as an int)."""
    return int(value) if float(value).is_integer() else value


class Llama4TextFamily(AttentionBiasFamily):
    """``model_type: llama4_text``."""

    identity: ClassVar[Identity] = Identity("llama4_text", "Llama4ForCausalLM", LLAMA4_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = ATTENTION_PEFT_MODULES

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        expect(config, "router_jitter_noise", 0.0)
        n_layers = int(require(config, "num_hidden_layers"))
        keys = super().keys({**config, "intermediate_size": require(config, "intermediate_size_mlp")})
        keys.update(
            {
                "architecture/no_rope_layers": self.no_rope_layers(config),
                "architecture/moe/moe_layers": self.moe_layers(config),
                "architecture/moe/n_experts": int(require(config, "num_local_experts")),
                "architecture/moe/top_k": int(require(config, "num_experts_per_tok")),
                "architecture/moe/expert_hidden": int(require(config, "intermediate_size")),
                "architecture/moe/n_shared": 1,
                "architecture/moe/router": "sigmoid",
                "architecture/moe/norm_topk_prob": False,
                "architecture/moe/first_k_dense": 0,
                "architecture/moe/aux_loss": float(config.get("router_aux_loss_coef", 0.001)),
                CHUNK_KEY: config.get("attention_chunk_size", DEFAULT_CHUNK),
                QK_NORM_KEY: bool(config.get("use_qk_norm", True)),
                TUNING_KEY: bool(config.get("attn_temperature_tuning", True)),
                FLOOR_KEY: float(config.get("floor_scale", DEFAULT_FLOOR_SCALE)),
                SCALE_KEY: float(config.get("attn_scale", DEFAULT_ATTN_SCALE)),
            }
        )
        if keys[CHUNK_KEY] is not None:
            keys[CHUNK_KEY] = int(keys[CHUNK_KEY])
        if len(keys["architecture/no_rope_layers"]) != n_layers:
            raise unsupported("no_rope_layers", config.get("no_rope_layers"), f"expected {n_layers} entries of 0 / 1")
        return keys

    def window(self, config: Mapping[str, Any]) -> int | None:
        """No sliding window: ``layer_types`` (``chunked_attention`` / ``full_attention``) follow
        ``no_rope_layers``, read there."""
        return None

    def rope(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """One RoPE for the local layers; the base defaults to Llama 4's 500000."""
        parameters = {"rope_theta": DEFAULT_THETA, **(config.get("rope_parameters") or {})}
        return rope_keys({**config, "rope_parameters": parameters})

    def no_rope_layers(self, config: Mapping[str, Any]) -> list[int]:
        """``no_rope_layers`` (1 = RoPE), or transformers' default: every ``no_rope_layer_interval``-th NoPE."""
        n_layers = int(require(config, "num_hidden_layers"))
        flags = config.get("no_rope_layers")
        if not flags:
            interval = int(config.get("no_rope_layer_interval", NOPE_EVERY))
            return [int((i + 1) % interval != 0) for i in range(n_layers)]
        return [int(flag) for flag in flags][:n_layers]

    def moe_layers(self, config: Mapping[str, Any]) -> list[int]:
        """``moe_layers``, or every ``interleave_moe_layer_step``-th layer (the last of each step)."""
        n_layers = int(require(config, "num_hidden_layers"))
        layers = config.get("moe_layers")
        if layers is None:
            step = int(config.get("interleave_moe_layer_step", 1))
            return list(range(step - 1, n_layers, step))
        return sorted(int(layer) for layer in layers)

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        moe = mixture(arch)
        e = arch.n_embd
        mixtures = set(mixture_layers(arch))
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            hf, mlp = f"model.layers.{i}.", (f"blocks_{i}", "mlp")
            maps += self.layer_norm_maps(arch, i)
            maps += attention_maps(arch, i)
            if i not in mixtures:
                maps += swiglu_maps(hf + "feed_forward.", mlp, arch.feed_forward.d_ff, e)
                continue
            n, f = moe.n_experts, moe.expert_hidden
            maps += [
                transposed(hf + "feed_forward.router.weight", (*mlp, "router"), n, e),
                halves(hf + "feed_forward.experts.gate_up_proj", ((*mlp, "gate"), (*mlp, "up")), (n, e, 2 * f)),
                same(hf + "feed_forward.experts.down_proj", (*mlp, "down"), (n, f, e)),
                *swiglu_maps(hf + "feed_forward.shared_expert.", (*mlp, "shared"), moe.n_shared * f, e),
            ]
        maps += head_maps(arch)
        return maps

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        moe = mixture(arch)
        if moe.router != "sigmoid" or moe.n_shared != 1 or moe.n_group > 1 or moe.routed_scaling_factor != 1.0:
            raise cannot(self.model_type, "a mixture other than Llama 4's (the sigmoid router, one shared expert)")
        if arch.position.scaling.kind not in ("none", "linear", "llama3", "yarn"):
            raise cannot(self.model_type, f"architecture/rope_scaling={arch.position.scaling.kind}")
        types = arch.layer_types or (CHUNKED_ATTENTION,) * arch.n_layers
        if not set(types) <= {CHUNKED_ATTENTION, FULL_ATTENTION}:
            raise cannot(self.model_type, f"architecture/layer_types={list(types)}")
        config = super().config(arch, settings)
        chunk = setting_or_none(settings, CHUNK_KEY, DEFAULT_CHUNK)
        config.update(
            {
                "intermediate_size": moe.expert_hidden,
                "intermediate_size_mlp": arch.feed_forward.d_ff,
                "num_local_experts": moe.n_experts,
                "num_experts_per_tok": moe.top_k,
                "moe_layers": list(mixture_layers(arch)),
                "no_rope_layers": [int(t == CHUNKED_ATTENTION) for t in types],
                "attention_chunk_size": chunk,
                "use_qk_norm": bool(setting(settings, QK_NORM_KEY, 1.0)),
                "attn_temperature_tuning": bool(setting(settings, TUNING_KEY, 1.0)),
                "floor_scale": whole(setting(settings, FLOOR_KEY, DEFAULT_FLOOR_SCALE)),
                "attn_scale": setting(settings, SCALE_KEY, DEFAULT_ATTN_SCALE),
                "router_jitter_noise": 0.0,
                "output_router_logits": False,
                "router_aux_loss_coef": moe.aux_loss,
            }
        )
        return config


__all__ = ["LLAMA4_CLASS", "Llama4TextFamily", "halves"]
