"""``CheckpointStore``: an orbax ``CheckpointManager`` with the run's layout and policies.

Layout under ``<run dir>/checkpoints/<step>/``: ``state`` (params, opt_state, step, rng as
OCDBT/tensorstore arrays, with a checksum manifest: :mod:`theseus.checkpoint.integrity`), ``meta``
(JSON: step, data position, seed, job) and ``metrics`` (JSON: ``val_loss`` when the step was
validated). Orbax writes each step to a temporary
directory and renames it on commit, so an interrupted save never replaces a good checkpoint
(the debris of one is removed when the store is opened again). ``restore_latest`` falls back to
the newest checkpoint that is intact (its files match their checksums) and loads when later ones
are damaged, and moves those aside.
Nothing on the load path unpickles: arrays are tensorstore data, everything else is JSON.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.checkpoint_managers import preservation_policy as policies

from theseus.checkpoint import integrity
from theseus.checkpoint.agreement import agreed_verification
from theseus.checkpoint.commits import committed_steps
from theseus.checkpoint.layers import LayoutChange, convert_restored, layout_changes, to_layout
from theseus.checkpoint.shapes import param_shapes
from theseus.errors import CheckpointError

STATE = "state"
META = "meta"
VAL_LOSS = "val_loss"


CORRUPT_SUFFIX = ".corrupt"
#: Checkpoints after the one ``training/resume_step`` resumes from are renamed with this suffix.
ABANDONED_SUFFIX = ".abandoned"


class CorruptCheckpointError(CheckpointError):
    """A checkpoint cannot be read (damaged files, or a state that does not fit the configured job)."""

    def __init__(self, detail: str, fix: str) -> None:
        super().__init__(f"{detail}; {fix}")
        #: What is wrong, without the advice.
        self.detail = detail


class _QuietOrbax(logging.Filter):
    """Drop orbax's warning about checkpoints saved without a validation metric and, unless
    ``verbose``, the tracebacks that orbax's and tensorstore's background work logs after a save
    or restore failed: the store reports those failures itself, as one ``CheckpointError`` line."""

    verbose = False

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "tracked_metric" in message:
            return False
        if self.verbose or record.levelno < logging.ERROR:
            return True
        if record.name == "asyncio":  # reads still pending when a restore failed
            return not ("Task exception was never retrieved" in message and "tensorstore" in message)
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, OSError):
            return False
        # background writer threads of a failed save, stopped by the interpreter's exit
        return not (isinstance(error, RuntimeError) and "cannot schedule new futures" in str(error))


_FILTER = _QuietOrbax()
logging.getLogger("absl").addFilter(_FILTER)
logging.getLogger("asyncio").addFilter(_FILTER)


def _quiet_unraisable() -> None:
    """Unless verbose, drop the "Event loop is closed" errors of tensorstore reads that finish
    after a failed restore has closed orbax's event loop (reported without a frame to blame)."""
    previous = sys.unraisablehook
    if getattr(previous, "_theseus_quiet", False):
        return

    def hook(unraisable: Any) -> None:
        error = unraisable.exc_value
        closed = isinstance(error, RuntimeError) and str(error) == "Event loop is closed"
        if closed and unraisable.object is None and not _FILTER.verbose:
            return
        previous(unraisable)

    hook._theseus_quiet = True  # type: ignore[attr-defined]
    sys.unraisablehook = hook


class ChecksummedHandler(ocp.StandardCheckpointHandler):
    """orbax's standard handler, recording checksums of the state: every process its own files once its
    writes are done (before orbax's commit barrier), then process 0 the rest when orbax has finalised
    the files (before the step is committed). See :mod:`theseus.checkpoint.integrity`."""

    async def async_save(self, directory: Any, *args: Any, **kwargs: Any) -> list[Any] | None:
        futures = await super().async_save(directory, *args, **kwargs)
        process = jax.process_index()
        folder = Path(str(getattr(directory, "path", directory)))  # a path, or one awaiting creation
        return [ocp.future.ChainedFuture(list(futures or []), lambda: integrity.write_part(folder, process))]

    def finalize(self, directory: Any) -> None:
        super().finalize(directory)
        if jax.process_index() == 0:
            integrity.write_manifest(Path(directory))


@ocp.args.register_with_handler(ChecksummedHandler, for_save=True)
@dataclasses.dataclass
class ChecksummedSave(ocp.args.StandardSave):
    """``StandardSave`` for :class:`ChecksummedHandler` (orbax pairs arguments with handlers by type)."""


@ocp.args.register_with_handler(ChecksummedHandler, for_restore=True)
@dataclasses.dataclass
class ChecksummedRestore(ocp.args.StandardRestore):
    """``StandardRestore`` for :class:`ChecksummedHandler`."""


def _saved_meta(restored: Mapping[str, Any] | None) -> dict[str, Any]:
    """A checkpoint's meta as the caller saved it (without the manifest declaration the store adds)."""
    return {key: value for key, value in (restored or {}).items() if key != integrity.META_KEY}


def _val_loss(metrics: Mapping[str, Any]) -> float:
    return float(metrics[VAL_LOSS])


class CheckpointStore:
    """Periodic, best (lowest ``val_loss``) and final checkpoints; the latest ``keep`` are kept.

    ``keep <= 0`` keeps every checkpoint. The best checkpoint is always kept.
    """

    def __init__(
        self,
        directory: str | Path,
        keep: int = 3,
        *,
        async_save: bool = True,
        verbose: bool = False,
        save_concurrent_gb: int | None = None,
    ) -> None:
        """``save_concurrent_gb`` caps the bytes orbax serialises at once (default: orbax's own, 96):
        a small cap keeps a save from holding a second copy of a large state in host memory."""
        self.directory = Path(directory)
        self._writing: int | None = None  # the step of a save that may still be running
        _FILTER.verbose = verbose
        latest = policies.LatestN(n=keep if keep > 0 else None)
        best = policies.BestN(get_metric_fn=_val_loss, reverse=True, n=1, keep_checkpoints_without_metrics=False)
        options = ocp.CheckpointManagerOptions(
            best_fn=_val_loss,
            best_mode="min",
            preservation_policy=policies.AnyPreservationPolicy([latest, best]),
            enable_async_checkpointing=async_save,
            cleanup_tmp_directories=True,  # debris of a save interrupted by a crash
            create=True,
        )
        try:
            self.manager = ocp.CheckpointManager(
                self.directory.absolute(),
                item_names=(STATE, META),
                item_handlers={
                    STATE: ChecksummedHandler()
                    if save_concurrent_gb is None
                    else ChecksummedHandler(save_concurrent_gb=save_concurrent_gb),
                    META: ocp.JsonCheckpointHandler(),
                },
                options=options,
            )
        except Exception as exc:  # unreadable directory or metadata
            raise CheckpointError(
                f"cannot open checkpoints in {str(self.directory)!r}: {type(exc).__name__}: {_first_line(exc)}; "
                "fix or remove that directory"
            ) from exc

    # -- queries --------------------------------------------------------------------------
    def steps(self) -> list[int]:
        """The committed checkpoints (a folder merely named like a step is not one)."""
        return committed_steps(self.directory, self.manager.all_steps(), STATE)

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def best_step(self) -> int | None:
        """The checkpoint with the lowest validation loss (None if none was validated)."""
        return self.manager.best_step()

    def meta(self, step: int) -> dict[str, Any]:
        restored = self.manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
        return _saved_meta(restored[META])

    # -- save / restore ------------------------------------------------------------------
    def save(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], val_loss: float | None = None) -> None:
        """Start saving ``state`` (a tree of arrays) and ``meta`` (JSON) as ``step``."""
        metrics = {VAL_LOSS: float(val_loss)} if val_loss is not None else None
        self._finish_writes()  # a failure of the previous background save is reported first
        if step in self.manager.all_steps():
            if step not in self.steps():  # orbax's, but no checkpoint (its manifest is gone): kept aside
                self._set_aside(step)
            self.manager.reload()  # or set aside by another process
        self._writing = step
        try:
            self.manager.save(
                step,
                args=ocp.args.Composite(
                    **{
                        STATE: ChecksummedSave(dict(state)),
                        META: ocp.args.JsonSave({**meta, integrity.META_KEY: integrity.ALGORITHM}),
                    }
                ),
                metrics=metrics,
                force=True,
            )
        except OSError as exc:
            raise self._write_error(step, exc) from exc

    def _saved_tree(self, step: int) -> Mapping[str, Any]:
        """The metadata tree (shapes, no values) of checkpoint ``step``'s state."""
        _quiet_unraisable()
        try:
            saved = self.manager.item_metadata(step)[STATE]
        except Exception as exc:
            raise CorruptCheckpointError(
                f"checkpoint {self._where(step)} is unreadable ({type(exc).__name__}: {_first_line(exc)})",
                "remove it to resume from an earlier one",
            ) from exc
        tree = getattr(saved, "tree", saved)
        if not isinstance(tree, Mapping) or "params" not in tree:
            raise CorruptCheckpointError(
                f"checkpoint {self._where(step)} is unreadable (it holds no parameters)",
                "remove it to resume from an earlier one, or use a new run/name",
            )
        return tree

    def check_shapes(self, step: int, abstract_params: Any, saved: Mapping[str, Any] | None = None) -> None:
        """Raise CheckpointError if the saved parameters do not match ``abstract_params`` (in the
        saved layer layout)."""
        tree = self._saved_tree(step) if saved is None else saved
        saved_shapes = param_shapes(tree["params"])
        wanted = param_shapes(abstract_params)
        for path, shape in wanted.items():
            if path not in saved_shapes:
                raise CheckpointError(
                    f"checkpoint {self._where(step)} has no parameter {path!r} of the configured model; "
                    "use the model configuration the run was started with, or a new run/name"
                )
            if tuple(saved_shapes[path]) != tuple(shape):
                vocab_hint = (
                    " (a checkpoint from before vocabulary padding loads with architecture/vocab_multiple=1)"
                    if path.endswith(("token_embedding/embedding", "lm_head"))
                    else ""
                )
                raise CheckpointError(
                    f"checkpoint {self._where(step)} has parameter {path!r} of shape {tuple(saved_shapes[path])} "
                    f"but the configured model expects {tuple(shape)}; use the model configuration the run was "
                    f"started with{vocab_hint}, or a new run/name"
                )
        extra = sorted(set(saved_shapes) - set(wanted))
        if extra:
            raise CheckpointError(
                f"checkpoint {self._where(step)} has parameter {extra[0]!r} that the configured model lacks; "
                "use the model configuration the run was started with, or a new run/name"
            )

    def restore(self, step: int, abstract_state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore ``step`` into the shapes, dtypes and shardings of ``abstract_state``.

        A checkpoint whose repeated layers are stacked while ``abstract_state`` holds them per layer
        (or the reverse) is read in its own layout and converted (see :mod:`theseus.checkpoint.layers`).
        """
        _quiet_unraisable()
        self.verify(step)
        changes: list[LayoutChange] = []
        target = dict(abstract_state)
        if "params" in abstract_state:
            saved = self._saved_tree(step)
            changes = layout_changes(param_shapes(saved), abstract_state)
            target = to_layout(target, changes)
            self.check_shapes(step, target["params"], saved)
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(**{STATE: ChecksummedRestore(target), META: ocp.args.JsonRestore()}),
            )
            state = convert_restored(dict(restored[STATE]), changes, dict(abstract_state))
        except CheckpointError:
            raise
        except Exception as exc:
            raise CorruptCheckpointError(
                f"cannot restore checkpoint {self._where(step)} ({type(exc).__name__}: {_first_line(exc)})",
                "remove it to resume from an earlier one, or use a new run/name",
            ) from exc
        return dict(state), _saved_meta(restored[META])

    def verify(self, step: int) -> None:
        """Raise CorruptCheckpointError if a file of checkpoint ``step``'s state does not match its checksum.
        The processes of a run split the files among them and agree on one verdict (every process calls it)."""
        problem = agreed_verification(self.directory / str(step) / STATE).problem
        if problem is not None:
            raise CorruptCheckpointError(
                f"checkpoint {self._where(step)} is damaged: {problem}",
                "remove it to resume from an earlier one, or use a new run/name",
            )

    def restore_latest(
        self, abstract_state: Mapping[str, Any], warn: Callable[[str], None] | None = None
    ) -> tuple[int, dict[str, Any], dict[str, Any]] | None:
        """Restore the newest checkpoint that loads: ``(step, state, meta)``, or None without checkpoints.

        A checkpoint that cannot be read while an earlier one can is damaged: it is renamed to
        ``<step>.corrupt`` (kept for inspection, ignored from then on) and ``warn`` is told. A
        checkpoint that does not match the configured model raises at once; when no checkpoint
        loads, the error of the newest one is raised with what to delete.
        """
        damaged: list[tuple[int, CorruptCheckpointError]] = []
        for step in sorted(self.steps(), reverse=True):
            try:
                tree, meta = self.restore(step, abstract_state)
            except CorruptCheckpointError as exc:
                damaged.append((step, exc))
                continue
            for bad, error in damaged:
                moved = self._set_aside(bad)
                if warn is not None:
                    warn(f"warning: {error.detail}; moved it to {str(moved)!r} and resumed from step {step}")
            if damaged:
                self.manager.reload()
            return step, tree, meta
        if not damaged:
            return None
        error = damaged[0][1]
        earlier = "no earlier checkpoint loads either" if len(damaged) > 1 else "there is no earlier checkpoint"
        raise CorruptCheckpointError(
            f"{error.detail}; {earlier}",
            f"if the job's configuration changed since the run started, use the configuration in "
            f"{str(self.directory.parent / 'config.yaml')!r} or a new run/name; if the checkpoints are damaged, "
            f"delete {str(self.directory)!r} to start the run over",
        ) from error

    def roll_back(self, step: int) -> list[Path]:
        """Set the checkpoints after ``step`` aside (renamed ``<step>.abandoned``); where they went."""
        moved = [self._set_aside(newer, ABANDONED_SUFFIX) for newer in self.steps() if newer > step]
        self.manager.reload()
        return moved

    def _set_aside(self, step: int, suffix: str = CORRUPT_SUFFIX) -> Path:
        """Rename checkpoint ``step`` to ``<step><suffix>``: process 0 does it for all processes, between two
        barriers (every process names the target before anything moves and is done reading the step before
        it moves, and sees it moved before it lists the steps again)."""
        source = self.directory / str(step)
        target = self.directory / f"{step}{suffix}"
        index = 1
        while target.exists():  # named before the first barrier: no process has moved anything yet
            index += 1
            target = self.directory / f"{step}{suffix}{index}"
        _barrier(f"theseus: setting checkpoint {step} aside")
        if jax.process_index() == 0:
            source.rename(target)
        _barrier(f"theseus: checkpoint {step} set aside")
        return target

    def wait(self) -> None:
        """Block until background saves have committed (a failed save raises ``CheckpointError``)."""
        self._finish_writes()

    def close(self) -> None:
        """Wait for background saves, then release the manager."""
        try:
            self._finish_writes()
        except CheckpointError:
            with contextlib.suppress(Exception):
                self.manager.close()
            raise
        self.manager.close()

    def _finish_writes(self) -> None:
        step, self._writing = self._writing, None
        try:
            self.manager.wait_until_finished()
        except Exception as exc:
            raise self._write_error(step, exc) from exc

    def _write_error(self, step: int | None, exc: BaseException) -> CheckpointError:
        """One line for a failed save, naming the checkpoint the run can resume from."""
        where = f"checkpoint {self._where(step)}" if step is not None else f"a checkpoint in {str(self.directory)!r}"
        try:
            self.manager.reload()
            kept = self.latest_step()
        except Exception:
            kept = None
        resume = (
            f"run the same command again to resume from step {kept}, the last complete checkpoint"
            if kept is not None
            else "run the same command again to start over (no checkpoint was completed)"
        )
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            return CheckpointError(
                f"no space left on the device while writing {where}; free disk space (or lower "
                f"training/keep_checkpoints) and {resume}"
            )
        return CheckpointError(
            f"writing {where} failed ({type(exc).__name__}: {_first_line(exc)}); fix the cause and {resume}"
        )

    def _where(self, step: int) -> str:
        return f"{str(self.directory / str(step))!r}"


def _barrier(name: str) -> None:
    """Wait until every process of the run reaches the barrier ``name`` (nothing with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _first_line(exc: BaseException, limit: int = 160) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."
