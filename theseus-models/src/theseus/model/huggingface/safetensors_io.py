"""Reading and writing safetensors files one tensor at a time, without pickle and without a second
copy of the model in memory.

A safetensors file is an 8-byte little-endian header length, a JSON header mapping each tensor
name to ``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets into the data that follows),
and the raw little-endian tensor bytes. The reader checks the whole header before any tensor is
read and reads each tensor with one positioned read into its own buffer (the file is never mapped
as a whole, so the page cache is not charged to the process); the writer streams tensors out in
order and splits large models into shards with a ``model.safetensors.index.json``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from theseus.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Largest header accepted (the format's own limit).
MAX_HEADER = 100 * 1024 * 1024


def _bfloat16() -> Any:
    import ml_dtypes

    return ml_dtypes.bfloat16


_DTYPES: dict[str, Callable[[], Any]] = {
    "F64": lambda: np.float64,
    "F32": lambda: np.float32,
    "F16": lambda: np.float16,
    "BF16": _bfloat16,
    "I64": lambda: np.int64,
    "I32": lambda: np.int32,
    "I16": lambda: np.int16,
    "I8": lambda: np.int8,
    "U8": lambda: np.uint8,
    "BOOL": lambda: np.bool_,
}


def numpy_dtype(code: str) -> np.dtype:
    return np.dtype(_DTYPES[code]())


def dtype_code(dtype: Any) -> str:
    wanted = np.dtype(dtype)
    for code, make in _DTYPES.items():
        if np.dtype(make()) == wanted:
            return code
    raise CheckpointError(f"cannot store dtype {wanted} in safetensors; use float32 or bfloat16")


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor lives: file, dtype code, shape and byte range (absolute offsets)."""

    name: str
    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


def read_header(path: Path) -> dict[str, TensorInfo]:
    """The tensors of one safetensors file; CheckpointError (one line) for a damaged header."""
    problem = f"{path} is not a valid safetensors file"
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            raw = f.read(8)
            if len(raw) < 8:
                raise CheckpointError(f"{problem} (it is {size} bytes long); download it again")
            (length,) = struct.unpack("<Q", raw)
            if length > min(MAX_HEADER, size - 8):
                raise CheckpointError(f"{problem} (its header length {length} is impossible); download it again")
            header = json.loads(f.read(length))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{problem} ({type(exc).__name__}: {exc}); download it again") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{problem} (its header is not a JSON object); download it again")
    data_start = 8 + length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            code, shape, (begin, end) = entry["dtype"], tuple(int(d) for d in entry["shape"]), entry["data_offsets"]
            itemsize = numpy_dtype(code).itemsize
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{problem} (tensor {name!r} has a malformed entry); download it again") from exc
        count = int(np.prod(shape, dtype=np.int64))
        if end - begin != count * itemsize or begin < 0 or data_start + end > size:
            raise CheckpointError(
                f"{problem} (tensor {name!r} of shape {shape} does not fit its byte range); download it again"
            )
        tensors[name] = TensorInfo(name, path, code, shape, data_start + begin, data_start + end)
    return tensors


def read_tensor(info: TensorInfo) -> np.ndarray:
    """One tensor, read with a single positioned read into a fresh array."""
    out = np.empty(info.shape, numpy_dtype(info.dtype))
    view = memoryview(out.reshape(-1).view(np.uint8).data)
    fd = os.open(info.file, os.O_RDONLY)
    try:
        done = 0
        while done < info.nbytes:
            got = os.preadv(fd, [view[done:]], info.start + done)
            if got <= 0:
                raise CheckpointError(f"{info.file} ends inside tensor {info.name!r}; download it again")
            done += got
    finally:
        os.close(fd)
    check_finite(info, out)
    return out


def check_finite(info: TensorInfo, values: np.ndarray) -> None:
    """CheckpointError naming the tensor when a floating-point tensor holds NaN or infinity: a model
    with such weights computes NaN, however it is trained or run."""
    if values.dtype.kind in "biu":
        return
    try:
        finite = np.isfinite(values)  # float16/32/64 and the ml_dtypes floats (bfloat16, float8)
    except TypeError:
        return
    if finite.all():
        return
    nan = int(np.isnan(values).sum())
    what = f"NaN ({nan} of {values.size} values)" if nan else f"infinity ({values.size - int(finite.sum())} values)"
    raise CheckpointError(
        f"tensor {info.name!r} in {info.file} holds {what}; these weights are damaged, use an intact copy "
        "of the checkpoint (download or convert it again)"
    )


def checkpoint_files(folder: Path) -> list[Path]:
    """The safetensors files of a checkpoint folder: the index's shards, else ``model.safetensors``."""
    index = folder / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
            names = sorted(set(weight_map.values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{index} is not a valid safetensors index ({exc}); download it again") from exc
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists {missing[0]}, which is not in {folder}; download the missing shards")
        return [folder / n for n in names]
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    found = sorted(folder.glob("*.safetensors"))
    if found:
        return found
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
        raise CheckpointError(
            f"{folder} holds only PyTorch pickle weights (.bin/.pt), which theseus never loads because unpickling "
            "runs arbitrary code; convert them to safetensors (e.g. with transformers' save_pretrained"
            "(..., safe_serialization=True)) or download the repository's safetensors files"
        )
    raise CheckpointError(f"{folder} has no model.safetensors (nor sharded safetensors with {INDEX_FILE})")


def read_index(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder, from the headers only."""
    tensors: dict[str, TensorInfo] = {}
    for path in checkpoint_files(folder):
        tensors.update(read_header(path))
    return tensors


# -- writing ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlannedTensor:
    """A tensor to write: its name, shape, dtype code, and how to produce its values when its turn comes."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    produce: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * numpy_dtype(self.dtype).itemsize


def plan_shards(tensors: list[PlannedTensor], shard_bytes: int) -> list[list[PlannedTensor]]:
    """Split ``tensors`` (in order) into files of at most ``shard_bytes`` (a larger tensor gets its own)."""
    shards: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in tensors:
        if shards[-1] and size + tensor.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += tensor.nbytes
    return shards


def _write_file(path: Path, tensors: Iterable[PlannedTensor], metadata: dict[str, str]) -> None:
    listed = list(tensors)
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for tensor in listed:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for tensor in listed:
            values = np.ascontiguousarray(tensor.produce(), dtype=numpy_dtype(tensor.dtype))
            if values.shape != tensor.shape:
                raise CheckpointError(f"tensor {tensor.name!r} has shape {values.shape}, expected {tensor.shape}")
            f.write(values.reshape(-1).view(np.uint8).data)
            del values


def write_checkpoint(folder: Path, tensors: list[PlannedTensor], shard_bytes: int) -> list[Path]:
    """Write ``tensors`` as ``model.safetensors``, or as numbered shards plus an index when they exceed
    ``shard_bytes``; returns the files written."""
    metadata = {"format": "pt"}
    shards = plan_shards(tensors, shard_bytes)
    if len(shards) == 1:
        path = folder / SINGLE_FILE
        _write_file(path, shards[0], metadata)
        return [path]
    written: list[Path] = []
    weight_map: dict[str, str] = {}
    for number, shard in enumerate(shards, start=1):
        name = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        _write_file(folder / name, shard, metadata)
        written.append(folder / name)
        weight_map.update({t.name: name for t in shard})
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors)}, "weight_map": weight_map}
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    return written


def iter_tensors(tensors: dict[str, TensorInfo]) -> Iterator[tuple[str, np.ndarray]]:
    for name, info in tensors.items():
        yield name, read_tensor(info)
