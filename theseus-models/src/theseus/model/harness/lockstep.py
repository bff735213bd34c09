"""The harness on several processes: process 0 drives lm-eval, every process computes.

lm-eval (tasks, requests, metrics) runs on process 0 only. Before each batch it computes, process
0 broadcasts what the batch is (:class:`Lockstep` as the request code's :class:`.Compute`); the other
processes wait in :meth:`Lockstep.follow`, receive it and run the same jitted computation on their
share of the mesh. When process 0 is done it releases them with a last message, which carries what
every process should return (e.g. the metrics of a training evaluation). With one process nothing
is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import numpy as np

from theseus.errors import TheseusError
from theseus.model.harness.compute import Devices, Generation

T = TypeVar("T")


def _broadcast(values: np.ndarray) -> np.ndarray:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.broadcast_one_to_all(values))


def send(message: dict[str, Any]) -> None:
    """Process 0: ``message`` (plain JSON values) to every other process."""
    data = np.frombuffer(json.dumps(message).encode(), np.uint8)
    _broadcast(np.asarray([data.size], np.int64))
    _broadcast(data)


def receive() -> dict[str, Any]:
    """Processes other than 0: the next message process 0 sends."""
    size = int(_broadcast(np.zeros(1, np.int64))[0])
    message: dict[str, Any] = json.loads(_broadcast(np.zeros(size, np.uint8)).tobytes().decode())
    return message


class Lockstep:
    """Every process's :class:`Devices` computing together; process 0 :attr:`leads`."""

    def __init__(self, devices: Devices) -> None:
        self.devices = devices
        self.several = jax.process_count() > 1
        self.leads = jax.process_index() == 0

    def score(self, ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.several:
            send({"op": "score", "ids": ids.tolist(), "targets": targets.tolist()})
        return self.devices.score(ids, targets)

    def generate(self, request: Generation) -> list[list[int]]:
        if self.several:
            send({"op": "generate", "request": request.record()})
        return self.devices.generate(request)

    def release(self, shared: Any = None, error: str | None = None) -> None:
        """Process 0, when lm-eval is done: the others return ``shared`` from :meth:`follow` (or
        raise ``error``, when process 0 failed)."""
        if self.several:
            send({"op": "release", "shared": shared, "error": error})

    def follow(self) -> Any:
        """Processes other than 0: compute what process 0 asks until it releases; what it shared."""
        while True:
            message = receive()
            try:
                if message["op"] == "score":
                    self.devices.score(np.asarray(message["ids"], np.int32), np.asarray(message["targets"], np.int32))
                elif message["op"] == "generate":
                    self.devices.generate(Generation.from_record(message["request"]))
            except TheseusError:
                continue  # refused before any computation; process 0 meets the same error and releases
            if message["op"] == "release":
                if message.get("error"):
                    raise TheseusError(f"process 0 stopped the evaluation: {message['error']}")
                return message.get("shared")

    def lead(self, drive: Callable[[], T], share: Callable[[T], Any] | None = None) -> T | Any:
        """``drive()`` on process 0 while the others follow; its result on process 0, and
        ``share(result)`` (plain values) on the others."""
        if not self.leads:
            return self.follow()
        try:
            result = drive()
        except BaseException as exc:
            self.release(error=(str(exc).splitlines() or [type(exc).__name__])[0])
            raise
        self.release(share(result) if share is not None else None)
        return result


__all__ = ["Lockstep", "receive", "send"]
