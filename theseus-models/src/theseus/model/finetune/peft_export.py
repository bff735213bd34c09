"""``hf/export-adapter``: a run's LoRA adapters as a PEFT adapter (``adapter_config.json`` +
``adapter_model.safetensors``) for the base model exported with ``hf/export``.

PEFT stores ``lora_A.weight`` ``[r, in]`` and ``lora_B.weight`` ``[out, r]`` per module and scales by
``lora_alpha / r``. The Hugging Face family names the modules (``HFFamily.peft_modules``): Llama-family
projections map one to one (``q_proj`` ... ``down_proj``). Modules that fuse several projections
(``HFFamily.peft_fused``: GPT-2's ``c_attn``, Phi-3's ``qkv_proj`` and ``gate_up_proj``) get one adapter
of rank ``k * r`` (``k`` the number of adapted projections) whose ``B`` is block-structured (each
projection's ``B`` in its own rows), with ``rank_pattern`` / ``alpha_pattern`` keeping the scale
``alpha / r``; a module whose rows interleave attention projections head by head
(``HFFamily.peft_interleaved``: Qwen3-Next's ``q_proj``, each head's query then its output gate, and its
``in_proj_qkvz``, each key head's query, key, then the values and output gates of the value heads it serves)
the same, its ``B`` blocks placed within each group's rows. ``HFFamily.peft_layout`` gives each layer its
modules (Qwen3-Next's linear-attention layers have other modules than its full-attention ones).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from theseus.checkpoint.layers import StackEntry
from theseus.errors import ConfigError
from theseus.model.huggingface.family import HFFamily, PeftLayout
from theseus.model.stack.architecture import Architecture
from theseus.model.stack.transformer import LAYERS
from theseus.runs.ref import RunRef

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"

QKV = ("query", "key", "value")
ATTENTION = (*QKV, "out")


def _linear(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(lora_A [r, in], lora_B [out, r])`` from our ``A [*in, r]`` and ``B [r, *out]``."""
    rank = a.shape[-1]
    return np.ascontiguousarray(a.reshape(-1, rank).T), np.ascontiguousarray(b.reshape(rank, -1).T)


def peft_tensors(
    family: HFFamily, params: Mapping[str, Any], arch: Architecture, stacked: Iterable[StackEntry] = (LAYERS,)
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """PEFT tensor names -> values, and the rank of each adapted module (module path -> rank);
    ``stacked``: the model's ``stacked_layers`` (its runs of layers, if several).

    The module names come from the family (``peft_layout`` of each layer, ``peft_layer_prefix``)."""
    from theseus.checkpoint.layers import per_layer

    tensors: dict[str, np.ndarray] = {}
    ranks: dict[str, int] = {}
    params = per_layer(params, stacked)  # a scanned model's stacked layers, one entry per layer
    for i in range(arch.n_layers):
        block = params[f"blocks_{i}"]
        prefix = family.peft_layer_prefix(i)
        attn, mlp = block.get("attn", {}), block.get("mlp", {})  # a layer may have one branch (Nemotron-H)
        found = layer_adapters(family, family.peft_layout(arch, i), attn, mlp)
        for name, mixer in parallel_mixers(block):  # beside attn on the same input (Falcon-H1's mamba)
            found += layer_adapters(family, family.peft_mixer_layout(arch, i, name), mixer, {})
        for module, (a, b) in found:
            tensors[f"base_model.model.{prefix}{module}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"base_model.model.{prefix}{module}.lora_B.weight"] = b.astype(np.float32)
            ranks[prefix + module] = int(a.shape[0])
    return tensors, ranks


def parallel_mixers(block: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """A layer's parallel mixers (:meth:`~theseus.model.stack.block.Block.parallel_mixers`): its entries other
    than ``attn``, ``mlp`` and the norms."""
    return [
        (name, node)
        for name, node in block.items()
        if name not in ("attn", "mlp") and not name.endswith("_norm") and isinstance(node, Mapping)
    ]


def layer_adapters(
    family: HFFamily, layout: PeftLayout, attn: Mapping[str, Any], mlp: Mapping[str, Any]
) -> list[tuple[str, tuple[np.ndarray, np.ndarray]]]:
    """One layer's PEFT adapters, ``(module, (lora_A, lora_B))`` for each adapted module of ``layout``;
    a ConfigError when an adapter has no module."""
    found: list[tuple[str, tuple[np.ndarray, np.ndarray] | None]] = []
    found += [(module, fused_adapter(attn, mlp, parts)) for module, parts in layout.fused.items()]
    found += [(module, interleaved_adapter(attn, parts)) for module, parts in layout.interleaved.items()]
    for target, module in layout.modules.items():
        mixer = target in ATTENTION or f"{target}_lora_a" in attn  # a mixer's own projection (Mamba-2's in_proj)
        holder, key = (attn, f"{target}_") if mixer else (mlp.get(target), "")
        if isinstance(holder, Mapping) and f"{key}lora_a" in holder:
            found.append((module, _linear(np.asarray(holder[f"{key}lora_a"]), np.asarray(holder[f"{key}lora_b"]))))
    in_attn, in_mlp = adapted(attn, mlp)
    mapped = {*layout.modules, *(name for parts in layout.fused.values() for name in parts)}
    interleaved = {name for parts in layout.interleaved.values() for name in parts}
    unmapped = sorted((in_attn - mapped - interleaved) | (in_mlp - mapped))
    if unmapped:
        raise ConfigError(
            f"the {family.model_type} family names no PEFT module for the {', '.join(unmapped)} adapters; "
            "export the merged model with hf/export instead"
        )
    return [(module, adapter) for module, adapter in found if adapter is not None]


def _holder(attn: Mapping[str, Any], mlp: Mapping[str, Any], target: str) -> tuple[Any, str, Any]:
    """(the mapping holding ``target``'s adapter, its key prefix, the base kernel)."""
    if target in ATTENTION:
        return attn, f"{target}_", attn[target]
    node = mlp[target]
    return node, "", node["kernel"]


def fused_adapter(
    attn: Mapping[str, Any], mlp: Mapping[str, Any], parts: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray] | None:
    """One PEFT adapter ``(lora_A [k*r, in], lora_B [out, k*r])`` on a module whose output rows are
    ``parts`` in order, from the ``k`` adapted parts' own adapters (None when none is adapted).

    ``A`` stacks the parts' ``A``; ``B`` is block-structured: part ``j``'s ``B`` in its own rows and
    columns, zeros elsewhere, so ``B @ A @ x`` puts ``B_j A_j x`` in part ``j``'s rows and nothing in an
    unadapted part's."""
    holders = [_holder(attn, mlp, part) for part in parts]
    widths = [int(np.prod(np.shape(kernel)[1:])) for _, _, kernel in holders]
    offsets = np.cumsum([0, *widths]).tolist()
    found = [(j, holder, key) for j, (holder, key, _) in enumerate(holders) if f"{key}lora_a" in holder]
    if not found:
        return None
    rank = int(np.shape(found[0][1][f"{found[0][2]}lora_a"])[-1])
    a_parts, b_full = [], np.zeros((offsets[-1], rank * len(found)), np.float32)
    for slot, (j, holder, key) in enumerate(found):
        a, b = _linear(np.asarray(holder[f"{key}lora_a"]), np.asarray(holder[f"{key}lora_b"]))
        a_parts.append(a)
        b_full[offsets[j] : offsets[j + 1], slot * rank : (slot + 1) * rank] = b
    return np.concatenate(a_parts, axis=0), b_full


def interleaved_adapter(attn: Mapping[str, Any], parts: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """One PEFT adapter on a module whose rows go in groups, one per head of the first of the attention
    projections ``parts`` (kernels ``[embed, heads, head_dim]``), each group those projections' rows of
    that head in order (a projection with more heads gives each group an equal run of them), from the
    adapted parts' adapters (None when none is adapted): ``A`` stacked, ``B`` block-structured within
    each group's rows."""
    found = [(j, part) for j, part in enumerate(parts) if f"{part}_lora_a" in attn]
    if not found:
        return None
    groups = int(np.shape(attn[parts[0]])[1])
    offsets = np.cumsum([0, *(int(np.prod(np.shape(attn[part])[1:])) // groups for part in parts)]).tolist()
    rank = int(np.shape(attn[f"{found[0][1]}_lora_a"])[-1])
    a_parts, b_full = [], np.zeros((groups, offsets[-1], rank * len(found)), np.float32)
    for slot, (j, part) in enumerate(found):
        a, b = _linear(np.asarray(attn[f"{part}_lora_a"]), np.asarray(attn[f"{part}_lora_b"]))
        a_parts.append(a)
        b_full[:, offsets[j] : offsets[j + 1], slot * rank : (slot + 1) * rank] = b.reshape(groups, -1, rank)
    return np.concatenate(a_parts, axis=0), b_full.reshape(-1, rank * len(found))


def adapted(attn: Mapping[str, Any], mlp: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """The projections with adapters in one layer: its attention's (a family's own too, such as an output
    gate) and its MLP's."""
    names = {key.removesuffix("_lora_a") for key in attn if key.endswith("_lora_a")}
    return names, {name for name, node in mlp.items() if isinstance(node, Mapping) and "lora_a" in node}


def _constant(value: np.ndarray) -> Callable[[], np.ndarray]:
    return lambda: value


def adapter_config(
    family: HFFamily, ranks: Mapping[str, int], *, rank: int, alpha: float, dropout: float, base: str
) -> dict[str, Any]:
    """``adapter_config.json`` for the modules of ``ranks`` (a fused module's rank is a multiple of
    ``rank``: ``rank_pattern`` and ``alpha_pattern`` keep its scale at ``alpha / rank``)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": sorted(ranks),
        "rank_pattern": {m: r for m, r in ranks.items() if r != rank},
        "alpha_pattern": {m: alpha * r / rank for m, r in ranks.items() if r != rank},
        "fan_in_fan_out": family.fan_in_fan_out,
        "bias": "none",
        "inference_mode": True,
        "init_lora_weights": True,
    }


def write_adapter(folder: Path, config: Mapping[str, Any], tensors: Mapping[str, np.ndarray]) -> None:
    """``adapter_config.json`` and ``adapter_model.safetensors`` in ``folder``."""
    from theseus.model.huggingface.safetensors_io import PlannedTensor, _write_file

    (folder / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    planned = [
        PlannedTensor(name, tuple(value.shape), "F32", _constant(value)) for name, value in sorted(tensors.items())
    ]
    _write_file(folder / ADAPTER_WEIGHTS, planned, {"format": "pt"})


def export_adapter(root: Path, run: str | RunRef, out: str, *, step: int | None = None, base: str = "") -> Path:
    """Write the adapters of run ``run`` (``NAME``, ``NAME@STEP`` or a reference; ``step`` names the
    checkpoint too, default: the latest) as a PEFT adapter in ``out``."""
    from theseus.model.huggingface.exporter import output_folder, staged_folder
    from theseus.model.huggingface.family import export_family
    from theseus.model.loading.run import load_run
    from theseus.runs.records import read_provenance

    folder = output_folder(out)
    loaded = load_run(root, RunRef.of(run, root, key="hf/run", step=step), tokenizer=None)
    rank = int(loaded.config.get("model/lora/rank") or 0)
    if rank <= 0:
        raise ConfigError(f"run {loaded.name!r} has no LoRA adapters (model/lora/rank=0); export it with hf/export")
    record = read_provenance(loaded.path)
    model_class = f"{type(loaded.model).__module__}:{type(loaded.model).__qualname__}"
    arch = loaded.model.architecture
    family = export_family(model_class, arch, (record.get("huggingface") or {}).get("model_type"))
    tensors, ranks = peft_tensors(family, loaded.params, arch, loaded.model.stacked_layers)
    config = adapter_config(
        family,
        ranks,
        rank=rank,
        alpha=float(loaded.config.get("model/lora/alpha", 16.0)),
        dropout=float(loaded.config.get("model/lora/dropout", 0.0)),
        base=base or str(loaded.config.get("training/init_from") or "").partition(":")[2],
    )
    with staged_folder(folder) as staging:
        write_adapter(staging, config, tensors)
    return folder


__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "adapter_config",
    "export_adapter",
    "fused_adapter",
    "interleaved_adapter",
    "layer_adapters",
    "peft_tensors",
    "write_adapter",
]
