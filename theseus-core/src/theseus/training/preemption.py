"""Clean preemption: SIGTERM or a first Ctrl-C ends training with a checkpoint at a step all processes agree on.

While the training loop runs, ``PreemptionGuard`` catches ``SIGTERM`` (what SLURM, Kubernetes and
cloud schedulers send before killing a job) and ``SIGINT`` (Ctrl-C). The first one only sets a
flag; the loop asks :meth:`PreemptionGuard.stop_step` after every update whether to stop, writes
a checkpoint at that step and raises :class:`Preempted` (exit code 75 on the command line, with
the line that says how to resume). A second Ctrl-C aborts at once, at the operating-system level,
leaving the checkpoints already committed as they are.

With several processes the signal may reach only some of them. The first process to see one
publishes a stop step in JAX's distributed key-value store: its current step plus
:data:`MULTI_PROCESS_MARGIN`. Every process polls the store once per step (after the step's
collective work) and stops at that step. Two more steps are enough: a process can be at most one
update ahead of another (each update waits for the previous one of all processes), and a
process that polled just before the stop step was published polls again before it can pass it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from theseus.errors import TrainingError

#: Exit code of a run that stopped on a signal after writing its checkpoint (``EX_TEMPFAIL``: try again).
EXIT_CODE = 75
#: Updates after the signal before a multi-process run stops (see the module docstring).
MULTI_PROCESS_MARGIN = 2
_KEY = "theseus/preemption"
_instances = itertools.count()


class Preempted(TrainingError):
    """Training stopped on a signal after writing a checkpoint; run the same command to resume."""

    exit_code = EXIT_CODE
    #: The CLI prints the message as it is, not as an ``error:`` line.
    plain = True
    #: The run stopped on purpose with a checkpoint: ``theseus runs`` lists it as stopped, not crashed.
    clean_stop = True

    def __init__(self, message: str, *, step: int, signal_name: str, seconds: float) -> None:
        super().__init__(message)
        self.step = step
        self.signal_name = signal_name
        self.seconds = seconds


class Interrupted(TrainingError):
    """SIGTERM stopped the run during its set-up, before its first update: there is nothing new to
    checkpoint, and what was committed before stays; run the same command to continue."""

    exit_code = EXIT_CODE
    plain = True
    clean_stop = True
    step = None  # the run stopped where its last checkpoint is


@contextlib.contextmanager
def setup_signals() -> Iterator[None]:
    """While a run sets up (before :class:`PreemptionGuard` takes over), SIGTERM raises :class:`Interrupted`
    at once, as Ctrl-C raises ``KeyboardInterrupt``, so the run ends through its ``finally`` blocks and
    records that it stopped. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise Interrupted("SIGTERM: stopped during set-up, before the first update; run the same command to continue")

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _distributed_client() -> Any:
    """JAX's distributed-runtime client when several processes run, else None."""
    try:
        from jax._src import distributed
    except ImportError:  # pragma: no cover - a future jax without the module
        return None
    state = getattr(distributed, "global_state", None)
    client = getattr(state, "client", None)
    if client is None or int(getattr(state, "num_processes", 1) or 1) <= 1:
        return None
    return client


class PreemptionGuard:
    """Signal handlers for the duration of a training loop (a context manager).

    ``stop_step(step)`` (or ``stops_at``) is called after update ``step`` has been dispatched and the
    iteration's collective work (validation, checkpoint) is done; it returns the step to stop at, or None.
    Handlers are installed only in the main thread (elsewhere the guard does nothing).
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.received_at: float | None = None
        self._target: int | None = None
        self._previous: dict[int, Any] = {}
        self._client = _distributed_client()
        self._folder = f"{_KEY}/{next(_instances)}/"
        self._key = self._folder + "stop"
        self._published = False

    # -- signals -----------------------------------------------------------------------------
    def install(self) -> PreemptionGuard:
        """Catch SIGTERM and SIGINT from now on (until :meth:`restore`)."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def restore(self) -> None:
        """Put back the handlers that were there before :meth:`install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous.clear()

    def __enter__(self) -> PreemptionGuard:
        return self.install()

    def __exit__(self, *_: Any) -> None:
        self.restore()

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signal_name is not None:
            if signum == signal.SIGINT:  # Ctrl-C while already stopping (after a SIGTERM): abort now
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            return  # a second SIGTERM changes nothing
        self.signal_name = signal.Signals(signum).name
        self.received_at = time.monotonic()
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, signal.SIG_DFL)  # the next Ctrl-C ends the process at once
            note = "press Ctrl-C again to abort at once (committed checkpoints stay)"
        else:
            note = "the run will exit once the checkpoint is written"
        # os.write: safe even when the signal interrupted a write to stderr.
        os.write(2, f"\n{self.signal_name}: finishing the current step and writing a checkpoint; {note}\n".encode())

    def request(self, signal_name: str = "SIGTERM") -> None:
        """Ask for a stop as a signal would (for callers that learn of a preemption otherwise)."""
        if self.signal_name is None:
            self.signal_name = signal_name
            self.received_at = time.monotonic()

    # -- agreeing on the step ------------------------------------------------------------------
    def stop_step(self, step: int) -> int | None:
        """The step at which every process stops (``>= step``), or None while no stop is asked."""
        if self._target is not None:
            return self._target
        if self._client is None:
            if self.signal_name is not None:
                self._target = step
            return self._target
        client = self._client
        if self.signal_name is not None and not self._published:
            self._published = True
            # The first process to publish decides; for the others the key exists and they read it below.
            with contextlib.suppress(Exception):
                client.key_value_set(self._key, f"{step + MULTI_PROCESS_MARGIN}:{self.signal_name}")
        found = dict(client.key_value_dir_get(self._folder))
        value = next(iter(found.values()), None) if found else None
        if value is None and self.signal_name is not None:  # published but not listed yet
            value = client.blocking_key_value_get(self._key, 60_000)
        if value is not None:
            target, _, name = str(value).partition(":")
            self._target = max(int(target), step)
            if self.signal_name is None:
                self.signal_name = f"{name} (on another process)"
                self.received_at = time.monotonic()
        return self._target

    def stops_at(self, step: int, last: int) -> bool:
        """Whether the loop, having finished update ``step`` of an invocation ending at ``last``, stops here."""
        target = self.stop_step(step)
        return target is not None and target <= step < last

    def preempted(self, step: int, steps: int, run_dir: Any) -> None:
        """Raise :class:`Preempted` for a run stopped (and checkpointed) at ``step`` of ``steps``."""
        seconds = self.elapsed()
        raise Preempted(
            f"{self.signal_name}: stopped at step {step}/{steps} with a checkpoint {seconds:.1f} s after the signal; "
            f"run the same command to resume from step {step} (run dir {run_dir})",
            step=step,
            signal_name=self.signal_name or "",
            seconds=seconds,
        )

    def elapsed(self) -> float:
        """Seconds since the signal (0 when none was received)."""
        return time.monotonic() - self.received_at if self.received_at is not None else 0.0


__all__ = ["EXIT_CODE", "MULTI_PROCESS_MARGIN", "Interrupted", "Preempted", "PreemptionGuard", "setup_signals"]
