"""``status.json``: a run's state and heartbeat, so ``theseus runs`` can tell how each run stands.

Process 0 of a training run writes it when the run starts, at most every few seconds while it
trains (and from a background heartbeat thread during long compilations or validations), and
when it ends. A reader decides between:

- ``completed``: the run reached ``training/steps`` (``complete`` in records written before);
- ``stopped``: it ended early on purpose (``training/stop_after``, a callback's stop, SIGTERM or
  Ctrl-C, during set-up too) at a step, with a checkpoint there (or none yet at step 0);
- ``failed``: it ended with a :class:`~theseus.errors.TheseusError` (divergence, bad data, a full
  disk ...): ``error`` holds its one line;
- ``running``: the writing process is alive (it holds the run's lock, see ``theseus.runs.lock``; or,
  same host: its pid and start time; another host: a heartbeat younger than ``STALE_AFTER`` seconds);
- ``crashed``: it says running but its process is gone, or it ended with an error nothing caught.

This module is imported by ``theseus runs``: standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.base.read_numbers import count, finite
from theseus.errors import ConfigError
from theseus.files import replace_file
from theseus.runs.layout import STATUS_FILE

#: Seconds between heartbeats written by the background thread.
HEARTBEAT_INTERVAL = 30.0
#: A run on another host whose heartbeat is older than this is taken to have crashed.
STALE_AFTER = 600.0
#: Seconds between status writes from the training loop (besides start, end and checkpoints).
WRITE_INTERVAL = 5.0


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (jiffies since boot) on Linux, to detect reused pids."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return fields[19] if len(fields) > 19 else None


#: The largest ``status.json`` a reader takes: a record is a few hundred bytes.
STATUS_BYTES = 1 << 20
#: What each field of a record may hold: anything else is dropped when it is read (a hand-edited or
#: hostile record must not break ``theseus runs`` for the whole root).
_COUNTS = ("step", "total_steps", "tokens", "tokens_per_step", "checkpoint", "pid")
_TIMES = ("updated", "started")
_SECONDS = ("wall_time", "eta_seconds")
_TEXTS = ("job", "state", "error", "host", "process_start", "name")
_LARGEST_COUNT = 2**63 - 1
_LATEST_TIME = 253402300799.0  # 9999-12-31T23:59:59 UTC, the last second datetime can show
_TEXT_CHARS = 2000


def printable(text: str, limit: int = _TEXT_CHARS) -> str:
    """``text`` safe for a terminal line: control characters (escape sequences, newlines) shown as
    ``\\xNN`` escapes, at most ``limit`` characters."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[: limit + 1])
    return shown if len(shown) <= limit else shown[: limit - 1] + "…"


def _checked(name: str, value: Any) -> Any:
    """``value`` if field ``name`` may hold it, else None."""
    if name in _COUNTS:
        return count(value, _LARGEST_COUNT)
    if name in _TIMES or name in _SECONDS or name in ("best_val_loss", "last_val_loss"):
        number = finite(value)
        if number is None or (name in _TIMES and not 0 <= number <= _LATEST_TIME) or (name in _SECONDS and number < 0):
            return None
        return number
    if name in _TEXTS:
        return printable(value) if isinstance(value, str) else None
    return value


def read_status(run_dir: Path) -> dict[str, Any] | None:
    """The ``status.json`` of a run directory, each known field of its type and range or dropped, text
    made printable (None when missing, unreadable, too large or not a JSON object)."""
    path = Path(run_dir) / STATUS_FILE
    try:
        with open(path, "rb") as handle:
            raw = handle.read(STATUS_BYTES + 1)
        record = json.loads(raw.decode("utf-8")) if len(raw) <= STATUS_BYTES else None
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(record, dict):
        return None
    checked = {name: _checked(name, value) for name, value in record.items()}
    return {name: value for name, value in checked.items() if value is not None}


def process_alive(record: Mapping[str, Any], now: float | None = None) -> bool:
    """Whether the process that wrote ``record`` is still running."""
    pid = record.get("pid")
    if record.get("host") == platform.node() and isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        started = record.get("process_start")
        return started is None or _process_start(pid) in (None, started)
    updated = record.get("updated")
    now = time.time() if now is None else now
    return isinstance(updated, (int, float)) and now - updated < STALE_AFTER


#: States of records written before ``completed`` was named so.
_OLD_NAMES = {"complete": "completed"}


def state_of(record: Mapping[str, Any], now: float | None = None) -> str:
    """``completed``, ``stopped``, ``failed``, ``running`` or ``crashed`` for a status record."""
    state = _OLD_NAMES.get(str(record.get("state")), record.get("state"))
    if state in ("completed", "stopped", "failed"):
        return str(state)
    if state == "running" and process_alive(record, now):
        return "running"
    return "crashed"


def ending(error: BaseException) -> tuple[str, str | None]:
    """How an invocation that raised ``error`` ended: ``(state, its line)``. ``stopped`` for a clean stop
    (a preemption's ``clean_stop``) or Ctrl-C, ``failed`` with the one line of a
    :class:`~theseus.errors.TheseusError`, else ``crashed`` with the exception's type and first line."""
    from theseus.errors import TheseusError, error_line

    if getattr(error, "clean_stop", False) is True or isinstance(error, KeyboardInterrupt):
        return "stopped", None
    if isinstance(error, TheseusError):
        return "failed", (str(error).strip().splitlines() or [type(error).__name__])[0]
    return "crashed", error_line(error)


def this_process() -> dict[str, Any]:
    """The fields of a record that name the process writing it (``process_alive`` reads them)."""
    return {"pid": os.getpid(), "process_start": _process_start(os.getpid()), "host": platform.node()}


def write_record(path: Path, record: Mapping[str, Any]) -> None:
    """Replace ``path`` with ``record`` atomically; a failed write is ignored (a status record must never
    stop a run, nor hide the error that ended it)."""
    with contextlib.suppress(OSError, ConfigError):  # a link or a folder at status.json is left alone, unwritten
        replace_file(path, json.dumps(record, sort_keys=True) + "\n")


def record_ending(run_dir: Path, error: BaseException, *, run: str, job: str | None, total_steps: int) -> None:
    """Write how a run ended that stopped or failed in set-up, before its :class:`StatusRecorder` started:
    its previous record (if any) with the new state, else a record at step 0; a stop is at the last
    checkpoint, where the run resumes. Never raises."""
    previous = dict(read_status(Path(run_dir)) or {})
    state, line = ending(error)
    if state == "stopped" and previous.get("step") != previous.get("checkpoint"):
        previous["step"] = previous.get("checkpoint") or 0
    now = time.time()
    record = {
        "version": 1,
        "step": 0,
        "start_step": 0,
        "stop_step": total_steps,
        "tokens": 0,
        "checkpoint": None,
        "started": now,
        **previous,
        "run": run,
        "job": job,
        "total_steps": total_steps,
        "state": state,
        "error": line,
        "eta_seconds": None,
        **this_process(),
        "updated": now,
    }
    write_record(Path(run_dir) / STATUS_FILE, record)


class StatusRecorder:
    """Writes ``status.json`` for one invocation of a training run (process 0 only)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        run: str,
        job: str | None,
        total_steps: int,
        stop_step: int,
        tokens_per_step: int,
        start_step: int,
    ) -> None:
        self.path = Path(run_dir) / STATUS_FILE
        previous = read_status(Path(run_dir)) or {}
        self._wall_before = float(previous.get("wall_time", 0.0) or 0.0) if start_step > 0 else 0.0
        self._began = time.time()
        self._lock = threading.Lock()
        self._last_write = 0.0
        self._stop_event = threading.Event()
        self.record: dict[str, Any] = {
            "version": 1,
            "run": run,
            "job": job,
            "state": "running",
            "step": start_step,
            "start_step": start_step,
            "total_steps": total_steps,
            "stop_step": stop_step,
            "tokens_per_step": tokens_per_step,
            "tokens": start_step * tokens_per_step,
            "best_val_loss": finite(previous.get("best_val_loss")) if start_step > 0 else None,
            "last_val_loss": finite(previous.get("last_val_loss")) if start_step > 0 else None,
            "checkpoint": start_step if start_step > 0 else None,
            "eta_seconds": None,
            "started": previous.get("started") if start_step > 0 and previous.get("started") else self._began,
            **this_process(),
            "error": None,
        }
        self._write()
        self._thread = threading.Thread(target=self._heartbeat, name="theseus-status", daemon=True)
        self._thread.start()

    def _write(self) -> None:
        with self._lock:
            now = time.time()
            self.record["updated"] = now
            self.record["wall_time"] = self._wall_before + (now - self._began)
            write_record(self.path, self.record)
            self._last_write = now

    def _heartbeat(self) -> None:
        while not self._stop_event.wait(HEARTBEAT_INTERVAL):
            self._write()

    def step(self, step: int, *, eta_seconds: float | None = None, force: bool = False) -> None:
        """Record that update ``step`` finished; written at most every ``WRITE_INTERVAL`` seconds."""
        self.record["step"] = int(step)
        self.record["tokens"] = int(step) * int(self.record["tokens_per_step"])
        self.record["eta_seconds"] = eta_seconds
        if force or time.time() - self._last_write >= WRITE_INTERVAL:
            self._write()

    def validated(self, step: int, loss: float) -> None:
        value = finite(loss)
        if value is not None:
            self.record["last_val_loss"] = value
            best = self.record.get("best_val_loss")
            self.record["best_val_loss"] = value if best is None else min(best, value)
        self.step(step, eta_seconds=self.record.get("eta_seconds"), force=True)

    def checkpointed(self, step: int) -> None:
        self.record["checkpoint"] = int(step)
        self.step(step, eta_seconds=self.record.get("eta_seconds"), force=True)

    def _end(self, state: str, error: str | None = None) -> None:
        self._stop_event.set()
        self.record["state"] = state
        self.record["error"] = error
        self.record["eta_seconds"] = None
        self._write()

    def finished(self) -> None:
        """The invocation ended normally: ``completed`` at ``training/steps``, else ``stopped``."""
        complete = int(self.record["step"]) >= int(self.record["total_steps"])
        self._end("completed" if complete else "stopped")

    def failed(self, error: BaseException) -> None:
        """The invocation ended with ``error`` (:func:`ending`): ``stopped`` at the step of a clean stop
        (a preemption's checkpoint) or, for a stop before it checkpointed, at its last checkpoint;
        ``failed`` with a TheseusError's line; else ``crashed``."""
        state, line = ending(error)
        if state == "stopped":
            step = getattr(error, "step", None)
            if not isinstance(step, int):
                step = int(self.record.get("checkpoint") or 0)
            self.record["step"] = step
            self.record["tokens"] = step * int(self.record["tokens_per_step"])
        self._end(state, line)
