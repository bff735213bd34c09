"""Reading tracker output back with each tracker's own code (TensorBoard, W&B protobufs, MLflow)."""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Keys of metrics.jsonl records that are not metrics.
NOT_METRICS = ("step", "split")


def jsonl_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """``{"train/loss": [(step, value), ...]}`` from metrics.jsonl."""
    out: dict[str, list[tuple[int, float]]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        for key, value in record.items():
            if key not in NOT_METRICS and isinstance(value, (int, float)):
                out.setdefault(f"{record['split']}/{key}", []).append((record["step"], float(value)))
    return out


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the run directory's event files, through TensorBoard's EventAccumulator."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={SCALARS: 0})
    accumulator.Reload()
    return {
        tag: [(event.step, event.value) for event in accumulator.Scalars(tag)] for tag in accumulator.Tags()[SCALARS]
    }


def tensorboard_tables(run_dir: Path, tag: str) -> dict[int, list[list[str]]]:
    """The text summaries ``tag`` of the run by step (header row first), through TensorBoard's
    EventAccumulator and its tensor reader."""
    from tensorboard.backend.event_processing.event_accumulator import TENSORS, EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    accumulator = EventAccumulator(str(run_dir), size_guidance={TENSORS: 0})
    accumulator.Reload()
    assert accumulator.SummaryMetadata(tag).plugin_data.plugin_name == "text"
    return {
        event.step: [[cell.decode() for cell in row] for row in make_ndarray(event.tensor_proto)]
        for event in accumulator.Tensors(tag)
    }


def raw_tensorboard_points(run_dir: Path) -> list[tuple[str, int]]:
    """Every ``(tag, step)`` stored in any event file of the run, with TensorBoard's raw file loader
    (no purging: what any reader of the files sees)."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event

    points = []
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        for payload in RawEventFileLoader(str(path)).Load():
            event = Event.FromString(payload)
            points += [(value.tag, event.step) for value in event.summary.value]
    return points


def _wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf records of a ``.wandb`` transaction log (W&B's LevelDB-style log of 32 KiB blocks)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", "not a W&B transaction log"
    block, header, position, pending = 32768, 7, 7, b""
    while position + header <= len(data):
        left = block - position % block
        if left < header:  # a block's tail too short for a record header is padding
            position += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[position : position + header])
        position += header
        pending += data[position : position + length]
        position += length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()  # type: ignore[attr-defined]
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_offline_run(path: Path) -> dict[str, Any]:
    """Run id, config and history (by step) of one offline run's ``.wandb`` file."""
    run_id: str | None = None
    config: dict[str, Any] = {}
    history: dict[int, dict[str, Any]] = {}
    for record in _wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
        elif kind == "history":
            row = {(item.key or "/".join(item.nested_key)): json.loads(item.value_json) for item in record.history.item}
            step = int(row.pop("_step"))
            history.setdefault(step, {}).update({k: v for k, v in row.items() if not k.startswith("_")})
    return {"id": run_id, "config": config, "history": history}


def close(a: float, b: float, rel: float = 1e-6) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
