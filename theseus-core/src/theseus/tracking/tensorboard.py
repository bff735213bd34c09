"""TensorBoard event files in the run directory, written with TensorBoard's own writer (no TensorFlow).

``tensorboard --logdir <root>/runs`` then shows every run by name. A resumed run starts its new
event file with a purge marker (a ``SessionLog.START`` event) at the first step it redoes, so
TensorBoard drops whatever an interrupted invocation logged after the checkpoint and no step
appears twice.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class TensorBoardSink:
    """Every scalar as a TensorBoard scalar named like ``train/loss``, at its step."""

    name = "tensorboard"

    def __init__(self, run_dir: Path, *, start: int = 0) -> None:
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
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

    def close(self) -> None:
        self.writer.close()
