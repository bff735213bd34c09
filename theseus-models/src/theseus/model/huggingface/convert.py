"""Converting parameters between a Hugging Face checkpoint folder and a theseus parameter tree.

Import checks everything it can before reading any weight (``config.json``, every tensor's name
and shape against the architecture), then reads one tensor at a time, converts its layout and
places it on its device(s) with ``place``; the host buffer is dropped before the next tensor, so
memory holds the model once plus one tensor. Export produces each checkpoint tensor only when
the writer reaches it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from theseus.errors import CheckpointError
from theseus.model.huggingface.config_checks import WeightSizes, checked_keys
from theseus.model.huggingface.family import HFFamily, family
from theseus.model.huggingface.names import IGNORED_SUFFIXES, TensorMap
from theseus.model.huggingface.safetensors_io import PlannedTensor, TensorInfo, dtype_code, read_index, read_tensor
from theseus.model.huggingface.source import read_config

if TYPE_CHECKING:
    from theseus.model.stack.architecture import Architecture

ParamPath = tuple[str, ...]
Place = Callable[[ParamPath, np.ndarray], Any]


@dataclass(frozen=True)
class Imported:
    """What a ``config.json`` becomes: the family, the theseus model class and its configuration keys."""

    family: str
    model_class: str
    keys: dict[str, Any]


def checkpoint_family(config: Mapping[str, Any]) -> HFFamily:
    """The installed family of a ``config.json``; CheckpointError for a quantized checkpoint."""
    found = family(config.get("model_type"))
    quantized = config.get("quantization_config")
    if quantized:
        method = quantized.get("quant_method", "?") if isinstance(quantized, Mapping) else quantized
        raise CheckpointError(
            f"config.json has quantization_config (quant_method={method!r}): theseus imports unquantized "
            "weights; use a bfloat16/float32 copy of the checkpoint (dequantize it first)"
        )
    return found


def from_config(config: Mapping[str, Any], weights: WeightSizes) -> tuple[HFFamily, Imported]:
    """The installed family of a ``config.json`` and what the checkpoint becomes; the sizes ``config``
    claims are checked against ``weights`` (those of the tensors present) before the family reads them."""
    found = checkpoint_family(config)
    return found, Imported(found.model_type, found.model_class, checked_keys(found, config, weights))


@dataclass
class HFCheckpoint:
    """A checkpoint folder whose ``config.json`` and safetensors headers have been read (no weights yet)."""

    folder: Path
    config: dict[str, Any]
    imported: Imported
    tensors: dict[str, TensorInfo]
    family: HFFamily


def open_checkpoint(folder: Path) -> HFCheckpoint:
    """``folder``'s ``config.json`` and safetensors headers, checked against each other (no weights read)."""
    config = read_config(folder)
    headers = read_index(folder)
    found, imported = from_config(config, WeightSizes.of(info.shape for info in headers.values()))
    tensors = {found.canonical_name(n): info for n, info in headers.items()}
    imported = dataclasses.replace(imported, keys=found.checkpoint_keys(imported.keys, tensors.keys()))
    return HFCheckpoint(folder, config, imported, tensors, found)


def plan_import(checkpoint: HFCheckpoint, arch: Architecture) -> list[TensorMap]:
    """The tensor maps of ``arch``, each checked against the checkpoint; CheckpointError (one line) for a
    missing tensor, a wrong shape, or a tensor theseus would not load."""
    maps = checkpoint.family.tensor_maps(arch)
    tensors = dict(checkpoint.tensors)
    if arch.tied_embeddings and "lm_head.weight" in tensors:
        tensors.pop("lm_head.weight")  # a tied head saved anyway: the embedding is authoritative
    for tensor_map in maps:
        if tensor_map.pieces:
            _check_pieces(checkpoint, tensors, tensor_map)
            continue
        info = tensors.get(tensor_map.hf)
        if info is None and tensor_map.copy:
            continue
        if info is None:
            raise CheckpointError(
                f"{checkpoint.folder} has no tensor {tensor_map.hf!r}, which its config.json implies; "
                "the weights do not match the configuration"
            )
        if info.shape != tensor_map.hf_shape:
            raise CheckpointError(
                f"tensor {tensor_map.hf!r} in {info.file.name} has shape {info.shape} but config.json implies "
                f"{tensor_map.hf_shape}; the weights do not match the configuration"
            )
        if not np.issubdtype(np.dtype(_float_kind(info.dtype)), np.floating):
            raise CheckpointError(f"tensor {tensor_map.hf!r} in {info.file.name} has dtype {info.dtype}, not a float")
    constants = checkpoint.family.constant_tensors(arch)
    for name, value in constants.items():
        if name in tensors and not np.array_equal(read_tensor(tensors[name]), value):
            raise CheckpointError(
                f"tensor {name!r} in {tensors[name].file.name} differs from what config.json derives; "
                "the weights do not match the configuration"
            )
    known = {name for m in maps for name in m.stored} | set(constants)
    aside = checkpoint.family.set_aside
    extra = [
        n for n in tensors if n not in known and not n.endswith(IGNORED_SUFFIXES) and not aside(n, checkpoint.config)
    ]
    if extra:
        raise CheckpointError(
            f"{checkpoint.folder} holds tensor {extra[0]!r} that the {checkpoint.imported.family} layout does not "
            f"use ({len(extra)} such); theseus would drop weights, so it refuses this checkpoint"
        )
    return [m for m in maps if not m.copy]  # a copy's parameter is read from its other tensor


def _check_pieces(checkpoint: HFCheckpoint, tensors: Mapping[str, TensorInfo], tensor_map: TensorMap) -> None:
    """CheckpointError (one line) unless the pieces of ``tensor_map`` are there, float, and join to its shape."""
    shape = tensor_map.hf_shape
    for name in tensor_map.stored:
        info = tensors.get(name)
        if info is None:
            raise CheckpointError(
                f"{checkpoint.folder} has no tensor {name!r}, which its config.json implies; "
                "the weights do not match the configuration"
            )
        if tuple(info.shape[1:]) != tuple(shape[1:]) or not np.issubdtype(
            np.dtype(_float_kind(info.dtype)), np.floating
        ):
            raise CheckpointError(
                f"tensor {name!r} in {info.file.name} has shape {info.shape} ({info.dtype}), not float rows of "
                f"{tuple(shape[1:])}; the weights do not match the configuration"
            )
    rows = sum(tensors[name].shape[0] for name in tensor_map.stored)
    if rows != shape[0]:
        raise CheckpointError(
            f"tensors {', '.join(map(repr, tensor_map.stored))} hold {rows} rows together but config.json implies "
            f"{shape[0]}; the weights do not match the configuration"
        )


def _read(checkpoint: HFCheckpoint, tensor_map: TensorMap) -> np.ndarray:
    """The checkpoint's tensor of ``tensor_map``, its pieces joined along the first axis."""
    parts = [read_tensor(checkpoint.tensors[name]) for name in tensor_map.stored]
    return parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)


def _float_kind(code: str) -> str:
    return {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "float32"}.get(code, "int64")


def load_params(checkpoint: HFCheckpoint, maps: list[TensorMap], place: Place) -> dict[str, Any]:
    """The nested parameter tree: each tensor read, converted and handed to ``place(path, array)``.

    The slices of a stacked parameter (maps with an ``index``) fill one host buffer, placed once its
    last slice is read."""
    params: dict[str, Any] = {}
    slices: dict[ParamPath, int] = {}
    for tensor_map in maps:
        if tensor_map.index is not None:
            for path in tensor_map.paths:
                slices[path] = slices.get(path, 0) + 1
    buffers: dict[ParamPath, tuple[np.ndarray, set[int]]] = {}
    for tensor_map in maps:
        values = _read(checkpoint, tensor_map)
        parts = tensor_map.to_theseus(values)
        del values
        for path, part in zip(tensor_map.paths, parts, strict=True):
            if tensor_map.index is None:
                _assign(params, path, place(path, part))
                continue
            buffer, filled = buffers.setdefault(path, (np.empty((slices[path], *part.shape), part.dtype), set()))
            buffer[tensor_map.index] = part
            filled.add(tensor_map.index)
            if len(filled) == slices[path]:
                del buffers[path]
                _assign(params, path, place(path, buffer))
            del buffer
        del parts
    return params


def _assign(tree: dict[str, Any], path: ParamPath, value: Any) -> None:
    node = tree
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = value


def _lookup(tree: Mapping[str, Any], path: ParamPath) -> Any:
    node: Any = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise CheckpointError(f"the run's parameters have no {'/'.join(path)!r}; it cannot be exported")
        node = node[key]
    return node


def export_plan(family: HFFamily, arch: Architecture, params: Mapping[str, Any], dtype: Any) -> list[PlannedTensor]:
    """The checkpoint tensors of ``params``, produced one at a time in ``dtype`` when written."""
    code = dtype_code(dtype)
    planned = []
    for tensor_map in family.tensor_maps(arch):
        leaves = [_lookup(params, path) for path in tensor_map.paths]
        if tensor_map.index is not None:
            leaves = [leaf[tensor_map.index] for leaf in leaves]

        def produce(tensor_map: TensorMap = tensor_map, leaves: list[Any] = leaves) -> np.ndarray:
            host = [np.asarray(leaf, dtype=np.float32) for leaf in leaves]
            return np.ascontiguousarray(tensor_map.to_hf(host)).astype(dtype, copy=False)

        if not tensor_map.pieces:
            planned.append(PlannedTensor(tensor_map.hf, tensor_map.hf_shape, code, produce))
            continue
        edges = np.cumsum([0, *(rows for _, rows in tensor_map.pieces)]).tolist()
        for (name, rows), start in zip(tensor_map.pieces, edges, strict=False):

            def piece(produce: Callable[[], np.ndarray] = produce, start: int = start, rows: int = rows) -> np.ndarray:
                return np.ascontiguousarray(produce()[start : start + rows])

            planned.append(PlannedTensor(name, (rows, *tensor_map.hf_shape[1:]), code, piece))
    for name, value in family.constant_tensors(arch).items():

        def constant(value: np.ndarray = value) -> np.ndarray:
            return value

        planned.append(PlannedTensor(name, value.shape, dtype_code(value.dtype), constant))
    return planned
