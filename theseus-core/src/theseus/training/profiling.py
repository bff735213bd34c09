"""``training/profile=START:STOP``: a ``jax.profiler`` trace of a window of updates, each one annotated.

The trace goes to the run's ``profile/`` folder (TensorBoard's profile plugin reads it:
``tensorboard --logdir <run>/profile``; so does Perfetto, from the ``perfetto_trace.json.gz`` beside it).
Each update in the window is a ``train`` step annotation numbered by its update, so the viewers split
the timeline by step. The trace stops after update STOP has finished, or when the loop ends first.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError


def parse_window(text: str) -> tuple[int, int] | None:
    """``(start, stop)`` of ``training/profile`` (updates counted from 1, both included); None when unset."""
    if not text:
        return None
    start, sep, stop = text.partition(":")
    if not sep or not start.strip().isdigit() or not stop.strip().isdigit():
        raise ConfigError(f"training/profile={text!r} is not START:STOP; write the updates to trace, e.g. 10:12")
    first, last = int(start), int(stop)
    if not 1 <= first <= last:
        raise ConfigError(f"training/profile={text!r}: START must be at least 1 and at most STOP, e.g. 10:12")
    return first, last


class ProfileWindow:
    """Starts the trace before update ``start``, annotates each update, stops after update ``stop``."""

    def __init__(self, window: tuple[int, int] | None, directory: Path) -> None:
        self.window = window
        self.directory = directory
        self.active = False

    @contextlib.contextmanager
    def update(self, step: int, result: list[Any]) -> Iterator[None]:
        """Around dispatching update ``step``; ``result`` receives what the update returns (waited for
        at the window's end, so that the trace holds the whole update)."""
        if self.window is None or not self.window[0] <= step <= self.window[1]:
            yield
            return
        import jax

        if not self.active:
            self.directory.mkdir(parents=True, exist_ok=True)
            jax.profiler.start_trace(str(self.directory), create_perfetto_trace=True)
            self.active = True
        with jax.profiler.StepTraceAnnotation("train", step_num=step):
            yield
            if step == self.window[1]:
                jax.block_until_ready(result)
        if step == self.window[1]:
            self.close()

    def close(self) -> None:
        """Stop the trace if it runs (the loop ended inside the window)."""
        if self.active:
            import jax

            jax.profiler.stop_trace()
            self.active = False


__all__ = ["ProfileWindow", "parse_window"]
