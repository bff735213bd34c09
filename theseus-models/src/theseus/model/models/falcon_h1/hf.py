"""Falcon-H1 checkpoints (``FalconH1ForCausalLM``, ``model_type: falcon_h1``) <-> theseus' ``FalconH1``: the
``hf/falcon_h1`` family.

Layer ``i`` is ``model.layers.<i>.``: ``input_layernorm``, then ``self_attn`` (``q_proj``, ``k_proj``,
``v_proj``, ``o_proj``) and ``mamba`` (``in_proj``, the depthwise ``conv1d`` ``[conv_dim, 1, conv_kernel]``,
``dt_bias``, ``A_log``, ``D``, the gated group ``norm`` with ``mamba_rms_norm``, ``out_proj``) in parallel on its
output, then ``pre_ff_layernorm`` and ``feed_forward`` (``gate_proj``, ``up_proj``, ``down_proj``);
``model.embed_tokens``, ``model.final_layernorm`` and ``lm_head``. The multipliers of ``config.json``
(``embedding``, ``lm_head``, ``attention_in`` / ``_out``, ``key``, ``ssm_in`` / ``_out``, ``ssm_multipliers``,
``mlp_multipliers``) become the model's ``architecture/*_multiplier(s)`` keys. Refused in one line: another
activation, ``mamba_norm_before_gate`` with ``mamba_rms_norm`` (the norm after the gate is what the releases
use), ``mamba_use_mlp: false`` and a sliding window.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import Identity, PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import TensorMap, embedding_maps, head_maps, same
from theseus.model.models.llama.hf import (
    ATTENTION_PEFT_MODULES,
    LlamaFamily,
    attention_maps,
    mlp_maps,
    mlp_peft_modules,
)
from theseus.model.models.nemotron_h.hf import mamba_config, mamba_keys, mamba_maps, time_step_keys
from theseus.model.stack.architecture import Architecture

FALCON_H1_CLASS = "theseus.model.models.falcon_h1.model:FalconH1"
#: transformers' ``FalconH1Config`` defaults of the Mamba-2 fields a ``config.json`` may leave out.
DEFAULTS: dict[str, Any] = {
    "mamba_d_ssm": 1024,
    "mamba_n_heads": 128,
    "mamba_d_head": "auto",
    "mamba_n_groups": 1,
    "mamba_d_state": 256,
    "mamba_d_conv": 4,
    "mamba_expand": 2,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "mamba_norm_before_gate": True,
    "mamba_rms_norm": False,
    "projectors_bias": False,
}
#: The scalar multipliers: ``config.json`` name -> theseus key.
MULTIPLIERS = {
    f"{name}_multiplier": f"architecture/{name}_multiplier"
    for name in ("embedding", "lm_head", "attention_in", "attention_out", "key", "ssm_in", "ssm_out")
}


#: theseus' ``architecture/mamba_*`` keys -> Falcon-H1's ``config.json`` fields (the heads and their width
#: are read by :func:`mamba_shape`).
MAMBA_FIELDS = {
    "mamba_state_size": "mamba_d_state",
    "mamba_groups": "mamba_n_groups",
    "mamba_conv_kernel": "mamba_d_conv",
    "mamba_chunk_size": "mamba_chunk_size",
    "mamba_conv_bias": "mamba_conv_bias",
    "mamba_bias": "mamba_proj_bias",
}


def read(config: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of ``config``, else transformers' default (a ``null`` reads as the default too)."""
    value = config.get(name)
    return DEFAULTS.get(name) if value is None else value


def mamba_shape(config: Mapping[str, Any]) -> tuple[int, int]:
    """``(heads, head width)`` of the Mamba-2 mixers: ``mamba_d_ssm`` (None: ``mamba_expand * hidden_size``)
    over ``mamba_n_heads``, unless ``mamba_d_head`` is given."""
    heads = int(read(config, "mamba_n_heads"))
    inner = config.get("mamba_d_ssm", DEFAULTS["mamba_d_ssm"])
    if inner is None:
        inner = int(read(config, "mamba_expand")) * int(require(config, "hidden_size"))
    head_dim = read(config, "mamba_d_head")
    head_dim = int(inner) // heads if head_dim == "auto" else int(head_dim)
    if head_dim * heads != int(inner):
        raise unsupported("mamba_d_head", head_dim, f"mamba_n_heads={heads} heads of it must make mamba_d_ssm={inner}")
    return heads, head_dim


def multiplier(config: Mapping[str, Any], name: str) -> float:
    """A scalar multiplier (default 1)."""
    value = config.get(name)
    if value is None:
        return 1.0
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise unsupported(name, value, "expected a number")
    return float(value)


def numbers(config: Mapping[str, Any], name: str, count: int) -> list[float]:
    """A list of ``count`` multipliers (default ones)."""
    values = config.get(name)
    if values is None:
        return [1.0] * count
    if not isinstance(values, (list, tuple)) or len(values) != count:
        raise unsupported(name, values, f"expected {count} numbers")
    return [float(v) for v in values]


def check(config: Mapping[str, Any]) -> None:
    """What the model does not compute, refused in one line each."""
    if config.get("hidden_act", "silu") != "silu":
        raise unsupported("hidden_act", config["hidden_act"], "supported: silu")
    if read(config, "mamba_rms_norm") and read(config, "mamba_norm_before_gate"):
        raise unsupported(
            "mamba_norm_before_gate", True, "with mamba_rms_norm only the norm after the gate (false) is supported"
        )
    if config.get("mamba_use_mlp", True) is False:
        raise unsupported("mamba_use_mlp", False, "every Falcon-H1 layer here has its MLP")
    if config.get("sliding_window") is not None:
        raise unsupported("sliding_window", config["sliding_window"], "Falcon-H1's attention has no window")


class FalconH1Family(LlamaFamily):
    """``model_type: falcon_h1``."""

    identity: ClassVar[Identity] = Identity("falcon_h1", "FalconH1ForCausalLM", FALCON_H1_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = {**ATTENTION_PEFT_MODULES, **mlp_peft_modules("feed_forward.")}

    #: The Mamba-2 mixer's adapted projections -> their PEFT modules. PEFT refuses LoRA on a Mamba model's
    #: ``out_proj``, so an ``out_proj`` adapter (target ``out``) has no module and the export refuses it: merge it
    #: with ``hf/export`` instead.
    mamba_peft_modules: ClassVar[Mapping[str, str]] = {"in_proj": "mamba.in_proj"}

    def peft_mixer_layout(self, arch: Architecture, layer: int, mixer: str) -> PeftLayout:
        """The parallel Mamba-2 mixer's ``in_proj``."""
        return PeftLayout(dict(self.mamba_peft_modules) if mixer == "mamba" else {}, {}, {})

    # -- import ------------------------------------------------------------------------------------
    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        check(config)
        keys = super().keys(config)
        keys.pop("architecture/sliding_window", None)
        keys["architecture/norm_eps"] = float(config.get("rms_norm_eps", 1e-5))
        heads, head_dim = mamba_shape(config)
        keys.update(
            {
                "architecture/mamba_heads": heads,
                "architecture/mamba_head_dim": head_dim,
                **mamba_keys(MAMBA_FIELDS, lambda name: read(config, name)),
                "architecture/mamba_out_bias": bool(read(config, "projectors_bias")),
                "architecture/mamba_rms_norm": bool(read(config, "mamba_rms_norm")),
                **time_step_keys(config),
                **{ours: multiplier(config, name) for name, ours in MULTIPLIERS.items()},
                "architecture/ssm_multipliers": numbers(config, "ssm_multipliers", 5),
                "architecture/mlp_multipliers": numbers(config, "mlp_multipliers", 2),
            }
        )
        return keys

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        maps = embedding_maps(arch)
        for i in range(arch.n_layers):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            maps.append(same(hf + "input_layernorm.weight", (ours, "attn_norm", "scale"), (arch.n_embd,)))
            maps.append(same(hf + "pre_ff_layernorm.weight", (ours, "mlp_norm", "scale"), (arch.n_embd,)))
            maps += attention_maps(arch, i)
            maps += self.mamba_maps(arch, hf + "mamba.", (ours, "mamba"))
            maps += mlp_maps(arch, hf + "feed_forward.", (ours, "mlp"))
        return maps + head_maps(arch, "model.final_layernorm.weight")

    def mamba_maps(self, arch: Architecture, hf: str, ours: tuple[str, ...]) -> list[TensorMap]:
        """One Mamba-2 mixer's tensors."""
        from theseus.model.models.falcon_h1.model import falcon_arch

        falcon = falcon_arch(arch)
        return mamba_maps(
            falcon.mamba, arch.n_embd, hf, ours, norm=falcon.mamba_rms_norm, out_bias=falcon.mamba_out_bias
        )

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.falcon_h1.model import FalconH1Architecture

        if not isinstance(arch, FalconH1Architecture):
            raise cannot(self.model_type, "a model without Falcon-H1's parallel Mamba-2 mixers")
        if arch.attention.qk_norm:
            raise cannot(self.model_type, "query/key norms")
        config = super().config(arch, settings)
        config.pop("sliding_window", None)
        spec, scales = arch.mamba, arch.multipliers
        return {
            **config,
            "mamba_d_ssm": spec.n_heads * spec.head_dim,
            **mamba_config(spec, {**MAMBA_FIELDS, "mamba_heads": "mamba_n_heads", "mamba_head_dim": "mamba_d_head"}),
            "projectors_bias": arch.mamba_out_bias,
            "mamba_rms_norm": arch.mamba_rms_norm,
            "mamba_norm_before_gate": False,
            "embedding_multiplier": scales.embedding,
            "lm_head_multiplier": scales.lm_head,
            "attention_in_multiplier": scales.attention_in,
            "attention_out_multiplier": scales.attention_out,
            "key_multiplier": scales.key,
            "ssm_in_multiplier": scales.ssm_in,
            "ssm_out_multiplier": scales.ssm_out,
            "ssm_multipliers": list(scales.ssm),
            "mlp_multipliers": list(scales.mlp),
        }


__all__ = ["FALCON_H1_CLASS", "FalconH1Family"]
