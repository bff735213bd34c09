"""Nemotron-H checkpoints (``NemotronHForCausalLM``, ``model_type: nemotron_h``) <-> theseus' ``NemotronH``: the
``hf/nemotron_h`` family.

Layer ``i`` is ``model.layers.<i>.`` with its ``norm`` and one ``mixer`` of the kind ``layers_block_type`` gives
(or the older ``hybrid_override_pattern``: ``M``, ``*``, ``-``): ``linear_attention`` (older: ``mamba``) a Mamba-2
mixer (``in_proj``, the depthwise ``conv1d`` ``[conv_dim, 1, conv_kernel]``, ``dt_bias``, ``A_log``, ``D``, the
gated group ``norm``, ``out_proj``), ``full_attention`` (older: ``attention``) attention without position
embeddings (``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``), ``mlp`` a squared-ReLU MLP (``up_proj``,
``down_proj``). ``model.embeddings`` and ``model.norm_f`` (``backbone.`` in older checkpoints) and ``lm_head``.
Mixture-of-experts layers (``moe``, Nemotron 3's) are refused; multi-token-prediction tensors (``mtp.*``) are set
aside, as transformers does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from theseus.model.huggingface.family import HFFamily, Identity, PeftLayout, cannot, require, unsupported
from theseus.model.huggingface.names import (
    TensorMap,
    embedding_maps,
    head_maps,
    heads_in,
    heads_out,
    same,
    transposed,
)
from theseus.model.layers.attention import FULL_ATTENTION
from theseus.model.layers.mamba2 import MAMBA, MAMBA_KEYS, MambaSpec
from theseus.model.layers.mlp import MLP_LAYER
from theseus.model.models.lfm2.hf import conv_map
from theseus.model.models.llama.hf import attention_peft_modules, mlp_maps, mlp_peft_modules
from theseus.model.stack.architecture import Architecture

NEMOTRON_H_CLASS = "theseus.model.models.nemotron_h.model:NemotronH"
#: ``layers_block_type`` entries (transformers 5's names, then the older ones) -> theseus' layer kinds.
HF_KINDS = {
    "linear_attention": MAMBA,
    "mamba": MAMBA,
    "full_attention": FULL_ATTENTION,
    "attention": FULL_ATTENTION,
    "mlp": MLP_LAYER,
}
#: theseus' layer kinds -> the ``layers_block_type`` entries and pattern letters the export writes.
EXPORT_KINDS = {MAMBA: ("linear_attention", "M"), FULL_ATTENTION: ("full_attention", "*"), MLP_LAYER: ("mlp", "-")}
PATTERN = {"M": "linear_attention", "*": "full_attention", "-": "mlp", "E": "moe"}
#: transformers' ``NemotronHConfig`` defaults of the fields a ``config.json`` may leave out.
DEFAULTS: dict[str, Any] = {
    "ssm_state_size": 128,
    "mamba_num_heads": 128,
    "mamba_head_dim": 64,
    "n_groups": 8,
    "conv_kernel": 4,
    "chunk_size": 128,
    "use_conv_bias": True,
    "layer_norm_epsilon": 1e-5,
}
#: Older ``config.json`` names of the Mamba fields, as transformers still reads them.
ALIASES = {
    "n_groups": "mamba_n_groups",
    "conv_kernel": "mamba_d_conv",
    "use_conv_bias": "mamba_conv_bias",
    "chunk_size": "mamba_chunk_size",
    "time_step_limit": "mamba_dt_limit",
}


#: theseus' ``architecture/mamba_*`` keys -> Nemotron-H's ``config.json`` fields.
MAMBA_FIELDS = {
    "mamba_heads": "mamba_num_heads",
    "mamba_head_dim": "mamba_head_dim",
    "mamba_state_size": "ssm_state_size",
    "mamba_groups": "n_groups",
    "mamba_conv_kernel": "conv_kernel",
    "mamba_chunk_size": "chunk_size",
    "mamba_conv_bias": "use_conv_bias",
    "mamba_bias": "use_bias",
}


def mamba_keys(fields: Mapping[str, str], read: Callable[[str], Any]) -> dict[str, Any]:
    """The ``architecture/mamba_*`` keys of the ``config.json`` fields ``fields`` names (key -> field), each
    ``read(field)``: a boolean where the key's default is one, else an integer."""
    return {
        f"architecture/{key}": (bool if isinstance(MAMBA_KEYS[key][0], bool) else int)(read(field))
        for key, field in fields.items()
    }


def mamba_config(spec: MambaSpec, fields: Mapping[str, str]) -> dict[str, Any]:
    """The ``config.json`` fields ``fields`` names (key -> field) of ``spec``, and its ``time_step_limit``."""
    values = spec.keys()
    limit = [spec.dt_min, INFINITY if spec.dt_max is None else spec.dt_max]
    return {**{field: values[key] for key, field in fields.items()}, "time_step_limit": limit}


def read(config: Mapping[str, Any], name: str) -> Any:
    """Field ``name`` of ``config``, under its older name if only that is there, else transformers' default."""
    if name in config:
        return config[name]
    if ALIASES.get(name, "") in config:
        return config[ALIASES[name]]
    return DEFAULTS.get(name)


def block_types(config: Mapping[str, Any]) -> list[str]:
    """theseus' layer kinds of ``layers_block_type`` (or ``hybrid_override_pattern``)."""
    types = config.get("layers_block_type") or config.get("layer_types")
    if not types:
        pattern = str(require(config, "hybrid_override_pattern"))
        if set(pattern) - set(PATTERN):
            raise unsupported("hybrid_override_pattern", pattern, "expected the letters M, * and - (E: refused)")
        types = [PATTERN[letter] for letter in pattern]
    if "moe" in types:
        raise unsupported(
            "layers_block_type",
            "moe",
            "Nemotron-H's mixture-of-experts layers are not supported; mamba, attention and mlp layers are",
        )
    unknown = sorted(set(types) - set(HF_KINDS))
    if unknown:
        raise unsupported("layers_block_type", unknown, f"expected {', '.join(HF_KINDS)}")
    return [HF_KINDS[t] for t in types]


#: How transformers 5 writes an infinite float in ``config.json`` (and reads it back).
INFINITY = {"__float__": "Infinity"}


def number(value: Any) -> float:
    """A ``config.json`` float, transformers' ``{"__float__": "Infinity"}`` form included."""
    if isinstance(value, Mapping) and "__float__" in value:
        return float(value["__float__"])
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise unsupported("time_step_limit", value, "expected two numbers")
    return float(value)


def time_step_keys(config: Mapping[str, Any]) -> dict[str, Any]:
    """``architecture/mamba_dt_min`` / ``mamba_dt_max`` of ``time_step_limit`` (default no clip)."""
    limit = read(config, "time_step_limit") or (0.0, math.inf)
    if not isinstance(limit, (list, tuple)) or len(limit) != 2:
        raise unsupported("time_step_limit", limit, "expected [low, high]")
    low, high = (number(v) for v in limit)
    return {"architecture/mamba_dt_min": low, "architecture/mamba_dt_max": None if math.isinf(high) else high}


def check_activations(config: Mapping[str, Any]) -> None:
    """The MLP's squared ReLU and the mixer's SiLU, the only activations the model computes."""
    for name, allowed in (("mlp_hidden_act", "relu2"), ("mamba_hidden_act", "silu")):
        value = config.get(name, allowed)
        if value != allowed:
            raise unsupported(name, value, f"supported: {allowed}")


def mamba_maps(
    spec: MambaSpec, e: int, hf: str, ours: tuple[str, ...], *, norm: bool = True, out_bias: bool | None = None
) -> list[TensorMap]:
    """One Mamba-2 mixer's tensors under ``hf``: the gated group ``norm`` with ``norm``, ``out_proj``'s bias with
    ``out_bias`` (None: with ``in_proj``'s, ``spec.bias``)."""
    inner = spec.n_heads * spec.head_dim
    conv_dim = inner + 2 * spec.n_groups * spec.state_size
    projected = inner + conv_dim + spec.n_heads
    maps = [
        transposed(hf + "in_proj.weight", (*ours, "in_proj"), projected, e),
        conv_map(hf + "conv1d.weight", (*ours, "conv1d"), conv_dim, spec.conv_kernel),
        same(hf + "dt_bias", (*ours, "dt_bias"), (spec.n_heads,)),
        same(hf + "A_log", (*ours, "A_log"), (spec.n_heads,)),
        same(hf + "D", (*ours, "D"), (spec.n_heads,)),
        transposed(hf + "out_proj.weight", (*ours, "out_proj"), e, inner),
    ]
    optional = (
        (norm, "norm.weight", "norm", inner),
        (spec.conv_bias, "conv1d.bias", "conv1d_bias", conv_dim),
        (spec.bias, "in_proj.bias", "in_proj_bias", projected),
        (spec.bias if out_bias is None else out_bias, "out_proj.bias", "out_proj_bias", e),
    )
    maps += [same(hf + name, (*ours, path), (width,)) for present, name, path, width in optional if present]
    return maps


class NemotronHFamily(HFFamily):
    """``model_type: nemotron_h``."""

    identity: ClassVar[Identity] = Identity("nemotron_h", "NemotronHForCausalLM", NEMOTRON_H_CLASS)
    peft_modules: ClassVar[Mapping[str, str]] = {
        **attention_peft_modules("mixer."),
        **mlp_peft_modules("mixer.", ("up", "down")),
    }
    #: A Mamba-2 layer's adapted projections (``Mamba2``'s adapter names) -> their PEFT modules. PEFT refuses LoRA
    #: on a Mamba model's ``out_proj`` (its fused kernels read the weight directly), so an ``out_proj`` adapter
    #: (target ``out``) has no module and the export refuses it: merge it with ``hf/export`` instead.
    mamba_peft_modules: ClassVar[Mapping[str, str]] = {"in_proj": "mixer.in_proj"}

    def peft_layer_prefix(self, layer: int) -> str:
        return f"model.layers.{layer}."

    def peft_layout(self, arch: Architecture, layer: int) -> PeftLayout:
        """Each layer's own mixer or MLP: the Mamba-2 layers' ``in_proj``, the attention layers' four
        projections, the MLP layers' ``up_proj`` and ``down_proj``."""
        kind = (arch.layer_types or (FULL_ATTENTION,) * arch.n_layers)[layer]
        if kind == MAMBA:
            return PeftLayout(dict(self.mamba_peft_modules), {}, {})
        mlp = kind == MLP_LAYER
        modules = {t: m for t, m in self.peft_modules.items() if (t in ("up", "down")) == mlp}
        return PeftLayout(modules, {}, {})

    # -- import ------------------------------------------------------------------------------------
    def canonical_name(self, name: str) -> str:
        """Older checkpoints name the base model ``backbone.``."""
        return "model." + name.removeprefix("backbone.") if name.startswith("backbone.") else name

    def set_aside(self, name: str, config: Mapping[str, Any]) -> bool:
        """The multi-token-prediction layers (``mtp.*``), which transformers does not load either."""
        return name.startswith("mtp.")

    def keys(self, config: Mapping[str, Any]) -> dict[str, Any]:
        check_activations(config)
        if config.get("sliding_window") is not None:
            raise unsupported("sliding_window", config["sliding_window"], "Nemotron-H's attention has no window")
        types = block_types(config)
        n_embd = int(require(config, "hidden_size"))
        n_heads = int(require(config, "num_attention_heads"))
        n_kv = config.get("num_key_value_heads")
        head_dim = config.get("head_dim") or n_embd // n_heads
        return {
            "architecture/vocab_size": int(require(config, "vocab_size")),
            "architecture/n_layers": len(types),
            "architecture/layer_types": types,
            "architecture/n_heads": n_heads,
            "architecture/n_kv_heads": n_heads if n_kv is None else int(n_kv),
            "architecture/n_embd": n_embd,
            "architecture/head_dim": int(head_dim),
            "architecture/d_ff": int(require(config, "intermediate_size")),
            "architecture/activation": "relu2",
            "architecture/norm_eps": float(read(config, "layer_norm_epsilon")),
            "architecture/tied_embeddings": bool(config.get("tie_word_embeddings", False)),
            "architecture/attention_bias": False,
            "architecture/attention_out_bias": False,
            "architecture/mlp_bias": bool(config.get("mlp_bias", False)),
            "architecture/dropout": 0.0,
            "architecture/block_size": int(config.get("max_position_embeddings", 4096)),
            **mamba_keys(MAMBA_FIELDS, lambda name: read(config, name)),
            **time_step_keys(config),
        }

    # -- both ways ---------------------------------------------------------------------------------
    def tensor_maps(self, arch: Architecture) -> list[TensorMap]:
        from theseus.model.models.nemotron_h.model import NemotronHArchitecture

        if not isinstance(arch, NemotronHArchitecture):
            raise cannot(self.model_type, "a model without Nemotron-H's layer kinds")
        e = arch.n_embd
        types = arch.layer_types or (FULL_ATTENTION,) * arch.n_layers
        maps = embedding_maps(arch, "model.embeddings.weight")
        for i, kind in enumerate(types):
            hf, ours = f"model.layers.{i}.", f"blocks_{i}"
            branch = "mlp" if kind == MLP_LAYER else "attn"
            maps.append(same(hf + "norm.weight", (ours, f"{branch}_norm", "scale"), (e,)))
            if kind == MAMBA:
                maps += mamba_maps(arch.mamba, e, hf + "mixer.", (ours, "attn"))
            elif kind == MLP_LAYER:
                maps += mlp_maps(arch, hf + "mixer.", (ours, "mlp"), ("up", "down"))
            else:
                maps += self.attention_maps(arch, hf + "mixer.", (ours, "attn"))
        maps += head_maps(arch, "model.norm_f.weight")
        return maps

    def attention_maps(self, arch: Architecture, hf: str, ours: tuple[str, ...]) -> list[TensorMap]:
        """One attention mixer's projections."""
        e, h, kv, d = arch.n_embd, arch.attention.n_heads, arch.attention.kv_heads, arch.head_dim
        return [
            heads_in(hf + "q_proj.weight", (*ours, "query"), e, h, d),
            heads_in(hf + "k_proj.weight", (*ours, "key"), e, kv, d),
            heads_in(hf + "v_proj.weight", (*ours, "value"), e, kv, d),
            heads_out(hf + "o_proj.weight", (*ours, "out"), e, h, d),
        ]

    # -- export ------------------------------------------------------------------------------------
    def config(self, arch: Architecture, settings: Mapping[str, Any]) -> dict[str, Any]:
        from theseus.model.models.nemotron_h.model import NemotronHArchitecture

        if not isinstance(arch, NemotronHArchitecture):
            raise cannot(self.model_type, "a model without Nemotron-H's layer kinds")
        if arch.feed_forward.activation != "relu2" or arch.feed_forward.moe is not None:
            raise cannot(self.model_type, f"architecture/activation={arch.feed_forward.activation}")
        if arch.attention.sliding_window is not None:
            raise cannot(self.model_type, f"architecture/sliding_window={arch.attention.sliding_window}")
        if arch.attention.qkv_bias or arch.attention.has_out_bias:
            raise cannot(self.model_type, "attention biases")
        if arch.attention.qk_norm or arch.position.kind != "none":
            raise cannot(self.model_type, "query/key norms or position embeddings")
        kinds = [EXPORT_KINDS[t] for t in arch.layer_types or (FULL_ATTENTION,) * arch.n_layers]
        return {
            "hidden_size": arch.n_embd,
            "intermediate_size": arch.feed_forward.d_ff,
            "mlp_hidden_act": "relu2",
            "mlp_bias": arch.feed_forward.bias,
            "num_hidden_layers": arch.n_layers,
            "layers_block_type": [name for name, _ in kinds],
            "hybrid_override_pattern": "".join(letter for _, letter in kinds),
            "num_attention_heads": arch.attention.n_heads,
            "num_key_value_heads": arch.attention.kv_heads,
            "head_dim": arch.head_dim,
            "attention_bias": False,
            "max_position_embeddings": arch.block_size,
            "layer_norm_epsilon": arch.norm.eps,
            **mamba_config(arch.mamba, MAMBA_FIELDS),
            "mamba_hidden_act": "silu",
        }


__all__ = ["HF_KINDS", "NEMOTRON_H_CLASS", "NemotronHFamily", "block_types"]
