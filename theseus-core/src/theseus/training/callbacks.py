"""Loop callbacks: code that runs every N updates or on the training loop's events.

The loop (``theseus.training.loop``) dispatches one update after another and calls, around each,
the callbacks that are due, in the order they were registered: first the built-ins of this
module (validation, evaluations, analyses, checkpoints, status, preemption, plots), then the
trainer's own (``CALLBACKS`` or ``callbacks()``), then those that installed plugins return from
the ``theseus_callbacks`` hook. A callback is any callable taking a :class:`StepInfo`, with two
attributes that say when it runs:

``every = N``
    after update N, 2N, 3N, ... (``info.event == "every"``). The loop first waits for that update
    and fetches its metrics, so ``info.metrics`` are the update's own; 0: never by count.
``on = (events...)``
    ``"start"``: once, before the first update of an invocation (``info.step`` is where it starts);
    ``"step"``: after every update, without waiting for it: ``info.metrics`` are the newest ones
    fetched, usually those of the update before (``info.metrics_step``);
    ``"validation"``: after each validation (``info.validation``);
    ``"checkpoint"``: after each checkpoint is handed to the store (it commits in the background);
    ``"end"``: once, after the last update of an invocation that was not preempted (``info.reason``).

``info.stop(reason)`` ends the invocation after the current update, as ``training/stop_after``
does: a checkpoint is written, the summary gives the reason and the same command resumes.
Every process runs the callbacks (validation and checkpoints are collective): stop on values all
processes share, such as the metrics, so that they all stop at the same step.
"""

from __future__ import annotations

import dataclasses
import difflib
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from theseus.base.killpoints import kill_point
from theseus.errors import ConfigError, TheseusError
from theseus.training.divergence import unsound_end
from theseus.training.metrics import scalars

if TYPE_CHECKING:
    from theseus.runs.directory import RunDirectory
    from theseus.tracking.plots import CurvePlotter
    from theseus.tracking.status import StatusRecorder
    from theseus.training.checkpointing import LazyCheckpointStore
    from theseus.training.divergence import LossWatch
    from theseus.training.metrics import MetricsLogger, ProgressDisplay
    from theseus.training.preemption import PreemptionGuard

#: The events a callback may list in ``on``.
EVENTS = ("start", "step", "validation", "checkpoint", "end")
#: ``info.reason`` at the end of an invocation that reached ``training/steps``.
COMPLETED = "completed"
#: ``info.reason`` at the end of an invocation stopped by ``training/stop_after``.
STOP_AFTER = "stop_after"


def due(step: int, interval: int, final: int) -> bool:
    """Whether something run every ``interval`` steps (and at ``final``) is due after ``step``."""
    return step == final or (interval > 0 and step % interval == 0)


class LoopControl(Protocol):
    """What a :class:`StepInfo` reads from, and asks of, the loop that runs the callbacks."""

    trainer: Any
    run_dir: RunDirectory
    logger: MetricsLogger
    display: ProgressDisplay
    callbacks: CallbackList
    metrics: dict[str, Any]
    metrics_step: int
    validation: tuple[int, dict[str, Any]] | None

    def request_stop(self, reason: str) -> None: ...


class StepInfo:
    """What a callback is given: the step, the trainer and its state, the newest metrics, and
    :meth:`stop`. Valid during the call only (the next update donates ``state``)."""

    def __init__(self, loop: LoopControl, event: str, step: int, state: Any, reason: str | None = None) -> None:
        self._loop = loop
        #: Why the callback runs: ``"every"`` (its interval) or one of :data:`EVENTS`.
        self.event = event
        #: Updates done: ``state`` is the train state after this many. Reading its arrays waits
        #: for the update, which on the ``"step"`` event may still be running.
        self.step = step
        self.state = state
        #: On ``"end"``: ``"completed"``, ``"stop_after"`` or the reason given to :meth:`stop`.
        self.reason = reason

    @property
    def trainer(self) -> Any:
        """The ``BaseTrainer`` running (its ``args``, ``model``, ``sharding``, ``host_batch()``, ...)."""
        return self._loop.trainer

    @property
    def run_dir(self) -> Path:
        """The run directory, ``<root>/runs/<run name>``."""
        return self._loop.run_dir.path

    @property
    def metrics(self) -> Mapping[str, Any]:
        """Training metrics of update :attr:`metrics_step` (``loss``, ``grad_norm``, ``lr``, ``tokens``,
        the step's scalar metadata, throughput once measured); empty before the first arrives."""
        return self._loop.metrics

    @property
    def metrics_step(self) -> int:
        """The update :attr:`metrics` belong to: :attr:`step` on ``"every"`` and later events, usually
        ``step - 1`` on ``"step"`` (the loop fetches them one update late so as not to wait)."""
        return self._loop.metrics_step

    @property
    def validation(self) -> dict[str, Any] | None:
        """The validation result (``loss``, ``tokens``, metadata) of this step, if it was validated."""
        found = self._loop.validation
        return found[1] if found is not None and found[0] == self.step else None

    def stop(self, reason: str) -> None:
        """End this invocation after the current update, with a checkpoint; ``reason`` is shown."""
        self._loop.request_stop(reason)

    def log(self, split: str, values: Mapping[str, Any]) -> None:
        """Record the scalar ``values`` at this step as a ``split`` record of ``metrics.jsonl`` (and sinks)."""
        self._loop.logger.log(self.step, split, values)

    def log_table(self, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Send the table ``name`` (a header of ``columns``, then ``rows`` of cells) at this step to the trackers
        that take tables: a W&B Table, a TensorBoard text summary, an MLflow artifact (process 0 only)."""
        self._loop.logger.table(self.step, name, columns, rows)

    def message(self, text: str) -> None:
        """Print a line with the loop's progress messages (process 0 only)."""
        self._loop.display.message(text)

    def _emit(self, event: str) -> None:
        self._loop.callbacks.emit(self.as_event(event))

    def as_event(self, event: str) -> StepInfo:
        """This step's information for another event."""
        return StepInfo(self._loop, event, self.step, self.state, self.reason)


class Callback:
    """A loop callback: ``Callback(fn, every=100)`` or ``Callback(fn, on="end")`` wraps a function of a
    :class:`StepInfo`; or subclass, set the class attributes ``every`` / ``on`` and override ``__call__``."""

    every: int = 0
    on: tuple[str, ...] = ()

    def __init__(
        self,
        fn: Callable[[StepInfo], object] | None = None,
        *,
        every: int = 0,
        on: str | Iterable[str] = (),
    ) -> None:
        self.fn = fn
        self.every = every
        self.on = (on,) if isinstance(on, str) else tuple(on)

    def __call__(self, info: StepInfo) -> None:
        if self.fn is None:
            raise NotImplementedError(f"{type(self).__name__} has no function: pass one or override __call__")
        self.fn(info)

    def __repr__(self) -> str:
        name = getattr(self.fn, "__qualname__", None) or type(self).__qualname__
        return f"Callback({name}, every={self.every}, on={self.on})"


def callback(*, every: int = 0, on: str | Iterable[str] = ()) -> Callable[[Callable[[StepInfo], object]], Callback]:
    """Decorator form of :class:`Callback`: ``@callback(every=100)`` above a function of a :class:`StepInfo`."""

    def wrap(fn: Callable[[StepInfo], object]) -> Callback:
        return Callback(fn, every=every, on=on)

    return wrap


def as_callback(entry: Any, source: str, error: type[TheseusError] = ConfigError) -> Any:
    """``entry`` checked as a callback (callable, ``every`` >= 0, known events, runs at all);
    ``source`` names who added it in the error."""
    every = getattr(entry, "every", 0)
    on = getattr(entry, "on", ())
    on = (on,) if isinstance(on, str) else tuple(on)
    problem = None
    if isinstance(entry, type) or not callable(entry):
        problem = "is not a callback instance (a callable taking a StepInfo)"
    elif not isinstance(every, int) or isinstance(every, bool) or every < 0:
        problem = f"has every={every!r}; give a whole number of updates (0: not by count)"
    elif not every and not on:
        problem = "has neither every=N nor on=(events): it would never run; use Callback(fn, every=N) or on=..."
    else:
        for event in on:
            if event not in EVENTS:
                close = difflib.get_close_matches(str(event), EVENTS, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"events are: {', '.join(EVENTS)}"
                problem = f"listens to an unknown event {event!r}; {hint}"
    if problem is not None:
        raise error(f"loop callback {entry!r} from {source} {problem}")
    return entry


@dataclasses.dataclass
class _Registered:
    callback: Any
    every: int
    on: tuple[str, ...]


class CallbackList:
    """Callbacks in registration order, with the schedule each declared (read once)."""

    def __init__(self, callbacks: Iterable[Any]) -> None:
        self.entries: list[_Registered] = []
        for cb in callbacks:
            on = getattr(cb, "on", ())
            self.entries.append(
                _Registered(cb, int(getattr(cb, "every", 0)), (on,) if isinstance(on, str) else tuple(on))
            )

    @property
    def callbacks(self) -> list[Any]:
        return [entry.callback for entry in self.entries]

    def due(self, step: int) -> list[Any]:
        """The callbacks whose ``every`` falls on ``step``."""
        return [e.callback for e in self.entries if e.every > 0 and step % e.every == 0]

    def run(self, callbacks: Sequence[Any], info: StepInfo) -> None:
        for cb in callbacks:
            cb(info)

    def emit(self, info: StepInfo) -> None:
        """Call every callback listening to ``info.event``."""
        self.run([e.callback for e in self.entries if info.event in e.on], info)


# -- the built-ins -------------------------------------------------------------------------------


class AtIntervals(Callback):
    """A built-in run every ``every`` updates and at the run's ``final`` step. At ``last``, the last
    update of the invocation, it runs in the ``end`` pass instead, so that the final validation,
    evaluations and analyses come before the final checkpoint."""

    on: tuple[str, ...] = ("end",)

    def __init__(self, every: int, final: int, last: int) -> None:
        self.every, self.final, self.last = every, final, last
        self.ran: int | None = None

    def __call__(self, info: StepInfo) -> None:
        if info.event == "every" and info.step == self.last:
            return
        if info.event == "end" and (self.ran == info.step or not due(info.step, self.every, self.final)):
            return
        self.ran = info.step
        self.work(info)

    def work(self, info: StepInfo) -> None:
        raise NotImplementedError


class Validation(AtIntervals):
    """``trainer.validate()``: a ``val`` record, then the ``validation`` event; with ``at_start``, also
    before the first update of a run that starts at step 0 (its baseline)."""

    on = ("start", "end")

    def __init__(self, every: int, final: int, last: int, *, at_start: bool = False) -> None:
        super().__init__(every, final, last)
        self.at_start = at_start

    def __call__(self, info: StepInfo) -> None:
        if info.event == "start":
            if self.at_start and info.step == 0:
                self.work(info, ranked=False)  # logged only: step 0 has no checkpoint to rank as best
            return
        super().__call__(info)

    def work(self, info: StepInfo, ranked: bool = True) -> None:
        result = info.trainer.validate(info.state)
        info.log("val", result)
        info.message(f"step {info.step}: val loss {result['loss']:.4f}")
        if ranked:
            info._loop.validation = (info.step, result)
            info._emit("validation")


class Evaluations(AtIntervals):
    """Every evaluation; their results form one ``eval`` record named ``<evaluation>/<key>``."""

    def work(self, info: StepInfo) -> None:
        record: dict[str, Any] = {}
        for evaluation in info.trainer.evaluations:
            results = evaluation.evaluate(info.trainer, info.state)
            name = evaluation.label()
            record.update({f"{name}/{k}": v for k, v in results.items()})
            shown = ", ".join(f"{k} {v:.4g}" for k, v in scalars(results).items())
            info.message(f"step {info.step}: {name}: {shown}")
        info.log("eval", record)


class Analyses(AtIntervals):
    """Every analysis (artefacts under ``analysis/<name>``); returned scalars form one record."""

    def __init__(self, every: int, final: int, last: int, run_dir: RunDirectory, *, main: bool) -> None:
        super().__init__(every, final, last)
        self.run_dir, self.main = run_dir, main

    def work(self, info: StepInfo) -> None:
        record: dict[str, Any] = {}
        for analysis in info.trainer.analyses:
            name = analysis.label()
            if self.main:
                results = analysis.analyze(info.trainer, info.state, info.step, self.run_dir.analysis_dir(name))
            else:  # every process computes (collectives); only process 0's artefacts are kept
                with tempfile.TemporaryDirectory() as scratch:
                    results = analysis.analyze(info.trainer, info.state, info.step, Path(scratch))
            record.update({f"{name}/{k}": v for k, v in (results or {}).items()})
        if record:
            info.log("analysis", record)


class Checkpoints(Callback):
    """Saves every ``every`` updates and at the end of every invocation (with this step's validation
    loss, for the best checkpoint), then the ``checkpoint`` event; the end waits for the commit."""

    on = ("start", "end")

    def __init__(
        self, store: LazyCheckpointStore, every: int, last: int, *, skipped: Callable[[], int], watch: LossWatch
    ) -> None:
        self.store, self.every, self.last, self.skipped, self.watch = store, every, last, skipped, watch
        #: The newest checkpoint of this run.
        self.saved: int | None = None
        self.start = 0

    def __call__(self, info: StepInfo) -> None:
        if info.event == "start":
            self.start = info.step
            self.saved = info.step if info.step > 0 else None
        elif info.event == "every" and info.step != self.last:
            self.save(info)
        elif info.event == "end":
            if info.step > self.start and self.saved != info.step:
                if self.watch.exploded(info.step):  # the run's end is not trustworthy: no checkpoint, no completion
                    self.store.wait()
                    raise unsound_end(info.step, str(self.watch.unsound(info.step)), self.watch)
                self.save(info)  # (a skipped last update is reported by save() and not checkpointed)
            self.store.wait()

    def save(self, info: StepInfo) -> None:
        """Save this step, unless its update's loss is non-finite or exploded (then say so, and keep the last)."""
        t, step = info.trainer, info.step
        unsound = self.watch.unsound(step)
        if unsound is not None:
            kept = f"checkpoint {self.saved} stays the newest" if self.saved is not None else "no checkpoint exists"
            info.message(f"warning: step {step} is not checkpointed: its {unsound}; {kept}")
            return
        val_loss = float(info.validation["loss"]) if info.validation is not None else None
        record = {
            "step": step,
            "data_position": step,
            "seed": t.args.seed,
            "job": t.context.name,
            "val_loss": val_loss,
            "skipped_steps": self.skipped(),
        }
        self.store.save(step, t.checkpoint_tree(info.state), record, val_loss=val_loss)
        self.saved = info.step
        self.watch.saved(step)
        info._emit("checkpoint")
        kill_point("save", info.step)


class Status(Callback):
    """Keeps ``status.json`` current: step and ETA, validation losses, the newest checkpoint."""

    on = ("step", "validation", "checkpoint", "end")

    def __init__(self, recorder: StatusRecorder, eta: Callable[[], float | None]) -> None:
        self.recorder, self.eta = recorder, eta

    def __call__(self, info: StepInfo) -> None:
        if info.event in ("step", "end"):
            self.recorder.step(info.metrics_step, eta_seconds=self.eta())
        elif info.event == "validation" and info.validation is not None:
            self.recorder.validated(info.step, float(info.validation["loss"]))
        elif info.event == "checkpoint":
            self.recorder.checkpointed(info.step)


class Preemption(Callback):
    """Stops at the step all processes agree on after a signal (``theseus.training.preemption``);
    at the end, once the checkpoint is committed, raises ``Preempted``."""

    on = ("step", "end")

    def __init__(self, guard: PreemptionGuard, last: int, steps: int, run_path: Path) -> None:
        self.guard, self.last, self.steps, self.run_path = guard, last, steps, run_path
        self.stopped: int | None = None

    def __call__(self, info: StepInfo) -> None:
        if info.event == "step" and self.stopped is None and self.guard.stops_at(info.step, self.last):
            self.stopped = info.step
            info.stop(f"preempted by {self.guard.signal_name}")
        elif info.event == "end" and self.stopped is not None:
            self.guard.preempted(self.stopped, self.steps, self.run_path)


class Plots(Callback):
    """Redraws ``loss.png``, and a plot of each metric the trainer plots, after each validation (on worker
    threads; the process's first plot on the training thread) and at the end when the curves changed."""

    on = ("validation", "end")

    def __init__(self, plotters: Mapping[str, CurvePlotter], curves: Mapping[str, Mapping[str, Any]]) -> None:
        self.plotters, self.curves = plotters, curves

    def __call__(self, info: StepInfo) -> None:
        for name, plotter in self.plotters.items():
            curve = self.curves[name]
            if info.event == "validation" or curve["train"] or curve["val"]:
                plotter.submit(curve["train"], curve["val"])
        if info.event == "end":
            for plotter in self.plotters.values():
                plotter.wait()


__all__ = [
    "COMPLETED",
    "EVENTS",
    "STOP_AFTER",
    "Analyses",
    "AtIntervals",
    "Callback",
    "CallbackList",
    "Checkpoints",
    "Evaluations",
    "Plots",
    "Preemption",
    "Status",
    "StepInfo",
    "Validation",
    "as_callback",
    "callback",
    "due",
]
