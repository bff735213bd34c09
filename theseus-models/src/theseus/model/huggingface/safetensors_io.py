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

import itertools
import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from theseus.base import jsonfile
from theseus.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: Largest header accepted (the format's own limit).
MAX_HEADER = 100 * 1024 * 1024
#: How deep a header nests: the header, a tensor's entry, its shape.
HEADER_DEPTH = 3
#: Largest ``model.safetensors.index.json`` read (the largest checkpoints list ~100,000 tensors in ~10 MB).
INDEX_BYTES = 64 << 20


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
    """The tensors of one safetensors file; CheckpointError (one line naming the file, and the tensor when
    one is at fault) for a damaged header: not JSON or nested past its format, a dtype, shape or byte
    range that is malformed, out of the file or overlapping another tensor's."""
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
            # every number is checked below, naming its tensor
            header = jsonfile.parse(f.read(length), max_depth=HEADER_DEPTH, check_numbers=False)
    except OSError as exc:
        raise CheckpointError(f"{problem} ({type(exc).__name__}: {exc}); download it again") from exc
    except jsonfile.UnreadableJSON as exc:
        raise CheckpointError(f"{problem} (its header: {exc.reason}); download it again") from exc
    if not isinstance(header, dict):
        raise CheckpointError(f"{problem} (its header is not a JSON object); download it again")
    data_start = 8 + length
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        why = _entry_problem(entry, size)
        if why:
            raise CheckpointError(f"{problem} (tensor {name!r} {why}); download it again")
        begin, end = (data_start + offset for offset in entry["data_offsets"])
        tensors[name] = TensorInfo(name, path, entry["dtype"], tuple(entry["shape"]), begin, end)
    if tensors and max(t.end for t in tensors.values()) > size:
        late = max(tensors.values(), key=lambda t: t.end)
        raise CheckpointError(
            f"{problem} (tensor {late.name!r} of shape {late.shape} does not fit its byte range); download it again"
        )
    _refuse_overlaps(problem, tensors.values(), data_start)
    return tensors


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _entry_problem(entry: Any, file_size: int) -> str | None:
    """What is wrong with one tensor's header entry (None when nothing is): a dtype, a shape of counts no
    larger than the file, and ``[begin, end]`` byte offsets that hold exactly that many elements."""
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        return "has no dtype, shape and data_offsets"
    code, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(code, str) or code not in _DTYPES:
        return f"has dtype {str(code)[:40]!r}, which theseus does not read"
    if not isinstance(shape, list) or not all(map(_count, shape)):
        return f"has shape {str(shape)[:80]}, not a list of counts"
    if max(shape, default=0) > file_size:
        return f"has shape {tuple(shape)}, with a dimension larger than the whole file"
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_count, offsets)):
        return f"has data_offsets {str(offsets)[:80]}, not [begin, end] byte offsets"
    begin, end = offsets
    if end < begin or end - begin != math.prod(shape) * numpy_dtype(code).itemsize:
        return f"of shape {tuple(shape)} does not fit its byte range [{begin}, {end}]"
    return None


def _refuse_overlaps(problem: str, tensors: Iterable[TensorInfo], data_start: int) -> None:
    """CheckpointError naming two tensors whose bytes overlap (each byte belongs to one tensor at most),
    and the bytes they share as the header counts them (from the start of the data)."""
    placed = sorted((t for t in tensors if t.nbytes), key=lambda t: (t.start, t.end))
    for before, after in itertools.pairwise(placed):
        if after.start < before.end:
            raise CheckpointError(
                f"{problem} (tensors {before.name!r} and {after.name!r} share data bytes "
                f"{after.start - data_start}..{min(before.end, after.end) - data_start}); download it again"
            )


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
    """The safetensors files of a checkpoint folder: the index's shards, else ``model.safetensors``, else
    every ``*.safetensors``; each one must lie in ``folder`` (:func:`inside`)."""
    index = folder / INDEX_FILE
    if index.is_file():
        names = index_files(index)
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise CheckpointError(f"{index} lists {missing[0]}, which is not in {folder}; download the missing shards")
        return [inside(folder, folder / n) for n in names]
    if (folder / SINGLE_FILE).is_file():
        return [inside(folder, folder / SINGLE_FILE)]
    found = sorted(folder.glob("*.safetensors"))
    if found:
        return [inside(folder, path) for path in found]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")) or any(folder.glob("*.pth")):
        raise CheckpointError(
            f"{folder} holds only PyTorch pickle weights (.bin/.pt), which theseus never loads because unpickling "
            "runs arbitrary code; convert them to safetensors (e.g. with transformers' save_pretrained"
            "(..., safe_serialization=True)) or download the repository's safetensors files"
        )
    raise CheckpointError(f"{folder} has no model.safetensors (nor sharded safetensors with {INDEX_FILE})")


def index_files(index: Path) -> list[str]:
    """The file names ``model.safetensors.index.json`` maps tensors to, sorted; CheckpointError (one line)
    for an unreadable index, or one that names anything but a file of its own folder (an absolute path,
    a path through ``..`` or into a subfolder)."""
    try:
        weight_map = jsonfile.read_object(index, max_bytes=INDEX_BYTES).get("weight_map")
    except jsonfile.UnreadableJSON as exc:
        raise CheckpointError(f"{exc}; download it again") from exc
    if not isinstance(weight_map, dict):
        raise CheckpointError(f"{index} is not a valid safetensors index (it has no weight_map); download it again")
    for tensor, name in weight_map.items():
        if not isinstance(name, str) or name in ("", ".", "..") or name != Path(name).name or "\\" in name:
            raise CheckpointError(
                f"{index} maps tensor {tensor!r} to {str(name)[:200]!r}, which is not a file of its folder; "
                "theseus reads only the checkpoint folder's own files"
            )
    return sorted(set(weight_map.values()))


def inside(folder: Path, path: Path) -> Path:
    """``path``, a file of checkpoint ``folder``; CheckpointError when it is a symlink that leads out of the
    folder (a hub cache's snapshot may lead into its repository's ``blobs``, where the hub keeps the files)."""
    target = path.resolve()
    allowed = [folder.resolve()]
    if folder.parent.name == "snapshots" and (folder.parent.parent / "blobs").is_dir():
        allowed.append((folder.parent.parent / "blobs").resolve())
    if not any(target.is_relative_to(root) for root in allowed):
        raise CheckpointError(
            f"{path} leads outside {folder} (to {target}); theseus reads only the checkpoint folder's own files: "
            "copy the file into the folder"
        )
    return path


def read_index(folder: Path) -> dict[str, TensorInfo]:
    """Every tensor of a checkpoint folder, from the headers only; a tensor in two files is refused."""
    tensors: dict[str, TensorInfo] = {}
    for path in checkpoint_files(folder):
        for name, info in read_header(path).items():
            if name in tensors:
                raise CheckpointError(
                    f"tensor {name!r} is in both {tensors[name].file} and {path}; the checkpoint is damaged, "
                    "download it again"
                )
            tensors[name] = info
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
