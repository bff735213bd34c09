"""TensorBoard event files in the run directory, written with TensorBoard's own writer (no TensorFlow).

``tensorboard --logdir <root>/runs`` then shows every run by name. A resumed run first removes
from the earlier event files every scalar an interrupted invocation logged after the checkpoint
it resumes from, and starts its new event file with a purge marker (a ``SessionLog.START``
event) at the first step it redoes: no step appears twice, for TensorBoard or any other reader.
"""

from __future__ import annotations

import io
import struct
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from theseus.files import replace_file


class TensorBoardSink:
    """Every scalar as a TensorBoard scalar named like ``train/loss``, at its step; tables as text."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, *, start: int = 0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        for path in sorted(Path(run_dir).glob("events.out.tfevents.*")):
            drop_steps_after(path, start)
        self.writer = EventFileWriter(str(run_dir), flush_secs=10)
        self.writer.add_event(
            Event(wall_time=time.time(), step=start + 1, session_log=SessionLog(status=SessionLog.START))
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = [
            self._summary.Value(tag=name, simple_value=float(value))
            for name, value in metrics.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool)
        ]
        if values:
            self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=values)))

    def write_table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """The table as a text summary named ``name`` at ``step``: a string tensor of the header row and the
        rows, which TensorBoard's Text tab shows as a table."""
        import numpy as np
        from tensorboard.plugins.text.metadata import create_summary_metadata
        from tensorboard.util.tensor_util import make_tensor_proto

        cells = np.array([list(columns), *[[str(cell) for cell in row] for row in rows]], dtype=object)
        value = self._summary.Value(
            tag=name,
            metadata=create_summary_metadata(display_name=name, description=""),
            tensor=make_tensor_proto(cells),
        )
        self.writer.add_event(self._event(wall_time=time.time(), step=step, summary=self._summary(value=[value])))

    def close(self) -> None:
        self.writer.close()


def _records(data: bytes) -> Iterator[bytes]:
    """The payloads of a TFRecord file: length (u64), its CRC (u32), payload, the payload's CRC (u32)."""
    position = 0
    while position + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[position : position + 8])
        start = position + 12
        if start + length + 4 > len(data):
            return  # a record cut short by a crash
        yield data[start : start + length]
        position = start + length + 4


def drop_steps_after(path: Path, step: int) -> None:
    """Rewrite an event file without its scalar events after ``step`` (untouched when it has none)."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    kept: list[bytes] = []
    dropped = False
    for payload in _records(path.read_bytes()):
        event = Event.FromString(payload)
        if event.HasField("summary") and event.step > step:
            dropped = True
            continue
        kept.append(payload)
    if not dropped:
        return
    events = io.BytesIO()
    writer = RecordWriter(events)
    for payload in kept:
        writer.write(payload)
    writer.flush()
    replace_file(path, events.getvalue())
