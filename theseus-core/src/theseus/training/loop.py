"""The training loop: one jitted, donated step per iteration with metrics fetched one step late.

While the device runs update ``s``, the host fetches the scalars of update ``s-1`` (already
finished), writes metrics, and prepares batch ``s+1``; it never waits on the step it has just
dispatched. Everything else (validation, evaluations, analyses, checkpoints, status, plots,
preemption, and what trainers and plugins add) is a callback of ``theseus.training.callbacks``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from theseus.base.failures import resource_error
from theseus.base.killpoints import kill_point
from theseus.config import configuration
from theseus.errors import ConfigError, DataError, PluginError
from theseus.runs.directory import RunDirectory, provenance
from theseus.runs.lock import RunLock
from theseus.tracking.plots import CurvePlotter
from theseus.tracking.sinks import open_sinks, selected_sinks
from theseus.tracking.status import StatusRecorder, ending, record_ending
from theseus.training import callbacks as cb
from theseus.training import datacheck, selection, steps
from theseus.training.checkpointing import LazyCheckpointStore
from theseus.training.collector import rare_collections
from theseus.training.divergence import LossWatch, non_finite, too_many_skipped
from theseus.training.metrics import MetricsLogger, ProgressDisplay, scalars
from theseus.training.preemption import PreemptionGuard, setup_signals
from theseus.training.profiling import ProfileWindow, parse_window
from theseus.training.protocol import Trainer
from theseus.training.throughput import known_peak_flops, measured_peak, mfu

MEASURED_LATER = "peak FLOP/s measured after the first update (float32 matmul)"


#: Updates in a row whose batches hold no target (every ``y`` masked) after which a run is refused.
EMPTY_STEPS_LIMIT = 16


@dataclass
class Pending:
    """Device results of one update, fetched after the next update has been dispatched."""

    step: int
    loss: Any
    meta: Any
    grad_norm: Any
    lr: Any


def _human(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f}{unit}"
    return f"{value:.0f}"


def _duration(seconds: float) -> str:
    hours, rest = divmod(round(seconds), 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_stats(
    loss: float,
    lr: float,
    grad_norm: float,
    tokens: int,
    tokens_per_sec: float,
    utilisation: float,
    eta: float | None,
    live: bool,
) -> str:
    """The progress line: loss, learning rate, gradient norm, tokens seen, tokens/s, MFU and ETA
    (the live bar has its own ETA column)."""
    parts = [f"loss {loss:.4f}", f"lr {lr:.3g}", f"gnorm {grad_norm:.3g}", f"{_human(tokens)} tok"]
    if tokens_per_sec:
        parts.append(f"{_human(tokens_per_sec)} tok/s")
        if utilisation > 0:
            parts.append(f"MFU {utilisation * 100:.1f}%")
    if eta is not None and not live:
        parts.append(f"ETA {_duration(eta)}")
    return " | ".join(parts)


class TrainingLoop:
    """Runs a trainer's job: run directory, resume, the updates, and the callbacks around them."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.args = trainer.args

    # -- entry -----------------------------------------------------------------------------
    def run(self) -> None:
        with configuration(self.trainer.context.config), rare_collections(), setup_signals():
            self._run()

    def _run(self) -> None:
        """Check what can be checked, open the run directory, resume or start, train; always clean up."""
        added, window = self._check_before_writing()
        store = self._open_run_dir(window)
        logger: MetricsLogger | None = None
        # one writer per run: a second process on the same run stops here, before it reads or cuts anything
        lock = RunLock(self.run_dir.path).acquire() if self.main else None
        try:
            latest, rollback = self._resume_point(store)
            if latest is not None and self._already_done(latest):
                return
            self._fit_memory()
            # Restore before writing anything: a checkpoint that does not fit leaves the run directory as it was.
            resumed = self._restore(store, latest, rollback)
            self.records_written = True  # from here on, how this invocation ends is the run's status
            changed = self._write_records(resumed)
            kill_point("setup", 0)
            state, start = self._starting_state(resumed, changed)
            logger = self._open_tracking(start)
            self.display = self._live_display(start)
            self._announce(start)
            self.guard = PreemptionGuard().install()
            self.trainer.state = self._train(state, start, store, logger, added)
            if self.status is not None:
                self.status.finished()
        except BaseException as exc:
            # a full disk or no memory is recorded as the one line the command prints (failed, not crashed)
            context = getattr(self.trainer, "context", None)
            reported = (context and resource_error(exc, context.name, context.root, context.config)) or exc
            if self.status is not None:
                self.status.failed(reported)
            else:
                self._record_setup_ending(reported)
            raise
        finally:
            self._release(lock, logger, store)

    def _record_setup_ending(self, exc: BaseException) -> None:
        """A run that ended in set-up, before its status record started, records how: a stop always, a
        failure once this invocation wrote the run's records (a refused resume leaves the record as it was)."""
        if not getattr(self, "main", False) or not hasattr(self, "run_dir"):
            return  # nothing was opened yet, or another process writes the records
        if getattr(self, "records_written", False) or ending(exc)[0] == "stopped":
            t = self.trainer
            record_ending(self.run_dir.path, exc, run=t.run_name, job=t.context.name, total_steps=self.args.steps)

    # -- the steps of a run ----------------------------------------------------------------------
    def _check_before_writing(self) -> tuple[list[Any], Any]:
        """What fails before anything is written: ``training/steps``, an unknown or uninstalled tracker, the
        trainer's setup and ``prepare_to_run``, a bad callback, a malformed profile window. Returns the added
        callbacks and the profile window."""
        t, args = self.trainer, self.args
        if args.steps <= 0:
            raise ConfigError(f"training/steps must be positive, got {args.steps}; set training/steps=<updates>")
        selected_sinks(t.context.config)
        t.setup()
        t.prepare_to_run()
        added = self._added_callbacks()
        return added, parse_window(args.profile)

    def _open_run_dir(self, window: Any) -> LazyCheckpointStore:
        """Create the run directory, with its plotters, profile window and (quiet) display; returns the
        checkpoint store, which imports orbax at the first save (or to resume)."""
        t, args = self.trainer, self.args
        #: Only process 0 writes the run directory's files (metrics, plots, records); all write checkpoints.
        self.main = jax.process_index() == 0
        self.run_dir = RunDirectory(t.context.root, t.run_name)
        #: Whether this invocation made the run directory (a start that fails before writing a record removes it).
        self.made_run_dir = not self.run_dir.path.exists()
        self.run_dir.create()
        self.stop = min(args.stop_after, args.steps) if args.stop_after > 0 else args.steps
        self.profile = ProfileWindow(window, self.run_dir.profile_dir)
        self.plotters: dict[str, CurvePlotter] = {}
        if args.plots:
            self.plotters["loss"] = CurvePlotter(self.run_dir.loss_plot, t.run_name)
            for name in t.PLOTTED:
                self.plotters[name] = CurvePlotter(self.run_dir.plot(name), t.run_name, ylabel=name)
        store = LazyCheckpointStore(
            self.run_dir.checkpoints,
            keep=args.keep_checkpoints,
            async_save=args.async_checkpoints,
            verbose=t.context.verbose,
        )
        self.display = ProgressDisplay(args.steps, 0, enabled=False, quiet=not self.main)
        self.status: StatusRecorder | None = None
        return store

    def _resume_point(self, store: LazyCheckpointStore) -> tuple[int | None, int | None]:
        """The checkpoint the run resumes from (None: it starts afresh), and the ``training/resume_step``
        to roll back to first (None: none)."""
        latest = store.latest_step()
        rollback = self._rollback_step(store, latest)
        return (latest if rollback is None else rollback), rollback

    def _already_done(self, latest: int) -> bool:
        """Whether checkpoint ``latest`` already reached ``training/steps`` or ``training/stop_after`` (said so)."""
        t, args = self.trainer, self.args
        if latest >= args.steps:
            self.display.message(
                f"run {t.run_name!r} already completed ({latest}/{args.steps} steps); results in {self.run_dir.path}"
            )
            return True
        if latest >= self.stop:
            self.display.message(
                f"run {t.run_name!r} is at step {latest}, where training/stop_after={args.stop_after} stops it; "
                "run without training/stop_after (or with a later one) to continue"
            )
            return True
        return False

    def _fit_memory(self) -> None:
        """``model/remat=auto``: compile the step for its candidates and say which one fits."""
        choice = self.trainer.fit_memory()
        if choice is not None and choice.trials:  # a device without a memory limit (a CPU) keeps remat none quietly
            self.display.message(choice.line())

    def _restore(
        self, store: LazyCheckpointStore, latest: int | None, rollback: int | None
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """``(step, tree, meta)`` of the checkpoint resumed from (None: none), once the configuration and
        the data were checked against the run's records; ``rollback`` is applied only then, so a refused
        resume moves nothing."""
        if latest is None:
            return None
        t = self.trainer
        selection.check_resume(self.run_dir.previous_config(), t.context.config, t.run_name)
        self._check_data()
        if rollback is not None:
            self._roll_back(store, rollback)
        return store.restore_latest(t.abstract_checkpoint_tree(), warn=self.display.message)

    def _write_records(self, resumed: tuple[int, Any, Any] | None) -> list[str]:
        """Process 0 writes the configuration, the data record and the provenance; returns the keys that
        changed since the run's previous invocation."""
        if not self.main:
            return []
        t = self.trainer
        changed = self.run_dir.write_config(t.context.config)
        if t.flywheel is not None:
            datacheck.write_record(self.run_dir.path, t.flywheel.data_identity)
        tokenizer = t.flywheel.tokenizer_spec if t.flywheel is not None else t.tokenizer().spec
        self.run_dir.write_provenance(
            provenance(
                t.context.name,
                type(t),
                resumed_from=resumed[0] if resumed is not None else None,
                model=type(t.model),
                tokenizer=self.run_dir.keep_tokenizer(tokenizer),
                selection=selection.of_configuration(t.context.config),
                objective=t.objective(),
            )
        )
        return changed

    def _starting_state(self, resumed: tuple[int, Any, Any] | None, changed: list[str]) -> tuple[Any, int]:
        """The state and step training starts from: the restored checkpoint's, else a fresh one at 0."""
        t = self.trainer
        self.skipped = 0
        if resumed is None:
            return t.init_state(), 0
        start, tree, meta = resumed
        state = t.state_from_checkpoint(tree)
        self.skipped = int(meta.get("skipped_steps", 0))
        note = f" (changed: {', '.join(changed)})" if changed else ""
        self.display.message(f"resuming run {t.run_name!r} from step {start}{note}")
        return state, start

    def _open_tracking(self, start: int) -> MetricsLogger:
        """The status record and the metrics logger with its sinks (process 0 writes them), from ``start``."""
        t, args = self.trainer, self.args
        if self.main:
            self.status = StatusRecorder(
                self.run_dir.path,
                run=t.run_name,
                job=t.context.name,
                total_steps=args.steps,
                stop_step=self.stop,
                tokens_per_step=t.tokens_per_step,
                start_step=start,
            )
        sinks = (
            open_sinks(self.run_dir.path, t, start=start, plugin_sinks=self._sinks(), warn=self.display.message)
            if self.main
            else []
        )
        return MetricsLogger(self.run_dir.metrics_file, sinks, resume_step=start, enabled=self.main, plotted=t.PLOTTED)

    def _live_display(self, start: int) -> ProgressDisplay:
        """The progress display of the updates from ``start`` (a live bar with ``training/progress``)."""
        args = self.args
        return ProgressDisplay(
            args.steps,
            start,
            enabled=args.progress and self.main,
            description=self.trainer.run_name,
            quiet=not self.main,
        )

    def _release(self, lock: RunLock | None, logger: MetricsLogger | None, store: LazyCheckpointStore) -> None:
        """Close what the run opened, whether it completed, stopped or failed. A run directory this
        invocation made and wrote no record into is removed (a refused ``training/resume_step`` of a new
        name leaves no folder that ``theseus runs`` does not list but other commands find taken)."""
        self.profile.close()
        unused = self.made_run_dir and not getattr(self, "records_written", False)
        if lock is not None and unused:
            lock.discard()
        elif lock is not None:
            lock.release()
        try:
            for plotter in self.plotters.values():
                with contextlib.suppress(Exception):  # after a failure: let a plot being drawn finish
                    plotter.wait()
            self.display.close()
            try:
                if logger is not None:
                    logger.close()
                store.close()  # may raise: the last checkpoint's write failed
            finally:
                self.trainer.close()  # its loader and rollout worker end whatever happened above
        finally:  # last: a SIGTERM while the final checkpoint is written is still the guard's
            if hasattr(self, "guard"):
                self.guard.restore()
            if unused and lock is not None:
                self.run_dir.remove_if_empty()

    def _check_data(self) -> None:
        """A resumed run reads the data it recorded (``theseus.training.datacheck``): refuse, or warn
        under ``training/accept_new_data=true``."""
        t = self.trainer
        if t.flywheel is None:
            return
        accept = bool(t.context.config.get(datacheck.ACCEPT_KEY, False))
        warning = datacheck.check_resume(self.run_dir.path, t.run_name, t.flywheel.data_identity, accept=accept)
        if warning is not None:
            self.display.message(warning)

    def _rollback_step(self, store: LazyCheckpointStore, latest: int | None) -> int | None:
        """The checkpoint ``training/resume_step`` asks to resume from, when it is to be applied (once per
        value: a value the run recorded is done), else None; a step without a checkpoint is a ConfigError.
        Every process takes process 0's answer (process 0 rewrites the recorded value later)."""
        wanted = self.args.resume_step
        previous = self.run_dir.previous_config() or {}
        applies = bool(wanted) and previous.get("training/resume_step", 0) != wanted
        if wanted and jax.process_count() > 1:  # every process has the same wanted: all broadcast, or none
            from jax.experimental import multihost_utils

            applies = bool(multihost_utils.broadcast_one_to_all(np.int32(applies)))
        if not applies:
            return None
        steps = store.steps() if latest is not None else []
        if wanted not in steps:
            found = f"its checkpoints are at steps {', '.join(map(str, steps))}" if steps else "it has no checkpoints"
            raise ConfigError(
                f"training/resume_step={wanted}: run {self.trainer.run_name!r} has no checkpoint at step {wanted} "
                f"({found}); choose one of them, or leave training/resume_step out to resume from the newest"
            )
        return wanted

    def _roll_back(self, store: LazyCheckpointStore, step: int) -> None:
        """Set the checkpoints after ``step`` aside (``training/resume_step``)."""
        moved = store.roll_back(step)
        if moved:
            self.display.message(
                f"training/resume_step={step}: set the checkpoints after it aside "
                f"({', '.join(str(path) for path in moved)})"
            )

    def _sinks(self) -> list[Any]:
        from theseus.plugins.discovery import plugins

        sinks: list[Any] = []
        for _dist, result in plugins().call("theseus_metrics_sinks", run_dir=self.run_dir.path, job=self.trainer):
            sinks.extend(result or [])
        return sinks

    def _added_callbacks(self) -> list[Any]:
        """The trainer's callbacks (``callbacks()``), then those of the ``theseus_callbacks`` hook."""
        from theseus.plugins.discovery import plugins

        t = self.trainer
        added = [cb.as_callback(c, f"{type(t).__name__}.callbacks()") for c in t.callbacks()]
        for dist, result in plugins().call("theseus_callbacks", trainer=t):
            added += [cb.as_callback(c, f"the theseus_callbacks hook of {dist}", PluginError) for c in result or []]
        return added

    def _callbacks(self, store: LazyCheckpointStore, added: list[Any]) -> cb.CallbackList:
        """The built-ins (registered like any other callback, and before them), then ``added``."""
        t, args = self.trainer, self.args
        builtins: list[Any] = []
        if args.eval_batches > 0:
            builtins.append(cb.Validation(args.eval_interval, args.steps, self.stop, at_start=args.eval_at_start))
        if t.evaluations:
            builtins.append(cb.Evaluations(args.evaluation_interval, args.steps, self.stop))
        if t.analyses:
            builtins.append(cb.Analyses(args.analysis_interval, args.steps, self.stop, self.run_dir, main=self.main))
        self.checkpoints = cb.Checkpoints(
            store, args.checkpoint_interval, self.stop, skipped=lambda: self.skipped, watch=self.watch
        )
        builtins.append(self.checkpoints)
        if self.status is not None:
            builtins.append(cb.Status(self.status, lambda: self.eta))
        builtins.append(cb.Preemption(self.guard, self.stop, args.steps, self.run_dir.path))
        if self.main and self.plotters:  # drawn on a worker thread: the next update does not wait for matplotlib
            builtins.append(cb.Plots(self.plotters, self.logger.curves))
        return cb.CallbackList([*builtins, *added])

    def _announce(self, start: int) -> None:
        t = self.trainer
        params = sum(int(np.prod(p.shape)) for p in jax.tree.leaves(t.abstract_state.params))
        known = known_peak_flops(jax.devices()[0], self.args.peak_flops)
        #: Peak FLOP/s per device for MFU; None until measured (after the first update, see _updates).
        self.peak: float | None = known[0] if known is not None else None
        peak = f"peak {known[0] / 1e12:.2f} TFLOP/s/device ({known[1]})" if known is not None else MEASURED_LATER
        self.flops_per_step = float(t.model.flops(t.sequence_length)) * self.args.batch_size
        inactive = int(getattr(t.model, "inactive_parameter_count", lambda: 0)())
        active = f" ({(params - inactive) / 1e6:.2f}M active per token)" if inactive else ""
        self.display.message(
            f"{t.run_name}: {params / 1e6:.2f}M parameters{active}, "
            f"{self.args.batch_size}x{t.sequence_length} tokens/step "
            f"({t.accumulate_steps} micro-batch{'es' if t.accumulate_steps > 1 else ''}), "
            f"mesh {dict(t.sharding.mesh.shape)} layout {t.sharding.layout}, steps {start}->{self.stop}, "
            f"{peak}; run dir {self.run_dir.path}"
        )
        stages, plan = t.sharding.pipeline_size, t.sharding.pipelining
        if stages > 1:
            virtual = f" x {plan.pieces} virtual" if plan.pieces > 1 else ""
            self.display.message(
                f"pipeline: {stages} stages{virtual}, {plan.schedule}, {plan.microbatches_for(stages)} micro-batches "
                f"per micro batch; expected bubble {plan.bubble(stages):.1%} of each step"
            )

    def _measure_peak(self, pending: Pending | None) -> None:
        """Measure the peak once the first update is done and before the second is dispatched: the
        matmul then has the device to itself, and the first update never waits for it."""
        if pending is not None:
            jax.block_until_ready(pending.loss)
        self.peak = measured_peak()
        self.display.message(f"peak {self.peak / 1e12:.2f} TFLOP/s/device (measured float32 matmul), for MFU")

    # -- the loop ----------------------------------------------------------------------------
    def _train(
        self, state: Any, start: int, store: LazyCheckpointStore, logger: MetricsLogger, added: list[Any]
    ) -> Any:
        """Run the updates, calling the callbacks around each (``theseus.training.callbacks``)."""
        self.logger = logger
        self.window_start: float | None = None
        self.window_steps = 0
        self.pending: Pending | None = None
        self.metrics: dict[str, Any] = {}
        self.metrics_step = start
        self.validation: tuple[int, dict[str, Any]] | None = None
        self.eta: float | None = None
        self.stopping: str | None = None
        self.watch = LossWatch(resume_step=self.args.resume_step)
        self.skipped_in_a_row = 0
        self.empty_in_a_row, self.first_step = 0, start
        if start > 0:
            self.watch.saved(start)
        self.callbacks = callbacks = self._callbacks(store, added)
        callbacks.emit(cb.StepInfo(self, "start", start, state))
        done, updates = start, self._updates(state, start)
        if self.stopping is None:
            for done, state in updates:
                due = callbacks.due(done)
                if due:  # they see this update's own metrics, and the pause is left out of the throughput
                    self._flush()
                    callbacks.run(due, cb.StepInfo(self, "every", done, state))
                    self.window_start, self.window_steps = None, 0
                callbacks.emit(cb.StepInfo(self, "step", done, state))
                if self.stopping is not None:
                    break
        self._flush()
        reason = self.stopping or (cb.COMPLETED if done == self.args.steps else cb.STOP_AFTER)
        callbacks.emit(cb.StepInfo(self, "end", done, state, reason=reason))
        self._summary(done, store, reason)
        return state

    def _updates(self, state: Any, start: int) -> Iterator[tuple[int, Any]]:
        """Dispatch updates ``start + 1 .. stop``; yields ``(update, state)`` once each is dispatched and
        the one before it fetched (``_finish``)."""
        t = self.trainer
        step_fn = t.train_step_fn()
        t.state = state  # the live state, which a batch may depend on (an on-policy trainer's rollouts)
        for step in range(start, self.stop):
            if self.peak is None and step > start:
                self._measure_peak(self.pending)
            t.step = step
            host = t.host_batch("train", position=step)
            kill_point("data", step + 1)
            batch = t.device_train_batch(host)
            dispatched: list[Any] = []
            with self.profile.update(step + 1, dispatched):
                state, loss, meta, grad_norm, lr = step_fn(state, batch, t.step_key(step))
                t.state = state  # never the donated one
                dispatched.append(loss)
            kill_point("step", step + 1)
            self._flush()
            self.pending = Pending(step + 1, loss, meta, grad_norm, lr)
            yield step + 1, state

    def _flush(self) -> None:
        """Fetch the update in flight, if any (waiting for it)."""
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self._finish(pending)

    def _finish(self, pending: Pending) -> None:
        """Fetch one update's scalars, stop on non-finite values, log at intervals."""
        loss, grad_norm, meta, lr = jax.device_get((pending.loss, pending.grad_norm, pending.meta, pending.lr))
        loss, grad_norm, lr = float(np.asarray(loss)), float(np.asarray(grad_norm)), float(np.asarray(lr))
        meta_scalars = scalars(meta)
        self._count_learned(meta_scalars.pop(steps.TARGETS, None), pending.step)
        skipped = int(meta_scalars.get("skipped", 0))
        self.skipped += skipped
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        if self.skipped_in_a_row >= self.args.skip_nonfinite_limit:
            raise too_many_skipped(self.skipped_in_a_row, pending.step, self.watch)
        if not skipped:
            for quantity, value in (("loss", loss), ("gradient norm", grad_norm)):
                if not math.isfinite(value):
                    raise non_finite(quantity, value, pending.step, self.watch)
        # a skipped update's loss was computed with the state it left unchanged: it judges that state
        self.watch.observe(pending.step, loss)
        now = time.perf_counter()
        first = self.window_start is None
        if first:  # the first update after a pause includes compilation: time from its end
            self.window_start, self.window_steps = now, 0
        else:
            self.window_steps += 1
        assert self.window_start is not None
        elapsed = now - self.window_start
        rate = self.window_steps / elapsed if self.window_steps and elapsed > 0 else 0.0
        tokens_per_sec = rate * self.trainer.tokens_per_step
        utilisation = mfu(self.flops_per_step, self.window_steps, elapsed, self.peak or 0.0, jax.device_count())
        step = pending.step
        self.eta = (self.stop - step) / rate if rate else None
        stats = progress_stats(
            loss,
            lr,
            grad_norm,
            step * self.trainer.tokens_per_step,
            tokens_per_sec,
            utilisation,
            self.eta,
            self.display.live,
        )
        self.display.update(step, stats)
        values: dict[str, Any] = {
            "loss": loss,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens": step * self.trainer.tokens_per_step,
            **meta_scalars,
        }
        if rate:
            values.update({"tokens_per_sec": tokens_per_sec, "step_time": 1.0 / rate})
            if self.flops_per_step > 0:
                values["mfu"] = utilisation
        if self.args.skip_nonfinite:
            values["skipped_steps"] = self.skipped
        self.metrics, self.metrics_step = values, step
        if cb.due(step, self.args.log_interval, self.stop) or step == 1:
            self.logger.log(step, "train", values)
            if not self.display.live:
                self.display.message(f"step {step}/{self.args.steps}  {stats}")
        if first:
            self.window_start = time.perf_counter()

    def _count_learned(self, targets: float | None, step: int) -> None:
        """Refuse a run whose updates learn from nothing: :data:`EMPTY_STEPS_LIMIT` updates in a row (or
        every update of a shorter invocation) whose batches hold no target at all."""
        if targets is None:
            return
        self.empty_in_a_row = self.empty_in_a_row + 1 if targets == 0 else 0
        limit = max(1, min(EMPTY_STEPS_LIMIT, self.stop - self.first_step))
        if self.empty_in_a_row >= limit:
            raise DataError(
                f"updates {step - self.empty_in_a_row + 1}-{step} learned from nothing: every target of their "
                "batches is masked (y = -1); for chat data the rows end before the assistant's turn (raise "
                "training/sequence_length or shorten the prompts) or the template has no assistant turn"
            )

    def request_stop(self, reason: str) -> None:
        """A callback's ``info.stop()``: the first reason given is the one shown."""
        if self.stopping is None:
            self.stopping = reason

    def _summary(self, done: int, store: LazyCheckpointStore, reason: str) -> None:
        self.display.close()
        history = self.logger.history
        parts = [f"trained {self.trainer.run_name!r} to step {done}/{self.args.steps}"]
        if history["val"]:
            parts.append(f"val loss {history['val'][-1][1]:.4f}")
        best = store.best_step()
        if best is not None:
            parts.append(f"best checkpoint at step {best}")
        if reason == cb.STOP_AFTER:
            parts.append("stopped by training/stop_after; run the same command to continue")
        elif reason != cb.COMPLETED:
            parts.append(f"stopped: {reason}")
        self.display.message("; ".join(parts) + f"; run dir {self.run_dir.path}")
