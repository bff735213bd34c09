"""``CheckpointStore``: an orbax ``CheckpointManager`` with the run's layout and policies.

Layout under ``<run dir>/checkpoints/<step>/``: ``state`` (params, opt_state, step, rng as
OCDBT/tensorstore arrays), ``meta`` (JSON: step, data position, seed, job) and ``metrics``
(JSON: ``val_loss`` when the step was validated). Orbax writes each step to a temporary
directory and renames it on commit, so an interrupted save never replaces a good checkpoint.
Nothing on the load path unpickles.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.checkpoint_managers import preservation_policy as policies

from theseus.errors import CheckpointError

STATE = "state"
META = "meta"
VAL_LOSS = "val_loss"


class _QuietOrbax(logging.Filter):
    """Drop orbax's warning about checkpoints saved without a validation metric."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "tracked_metric" not in record.getMessage()


_FILTER = _QuietOrbax()
logging.getLogger("absl").addFilter(_FILTER)


def _val_loss(metrics: Mapping[str, Any]) -> float:
    return float(metrics[VAL_LOSS])


class CheckpointStore:
    """Periodic, best (lowest ``val_loss``) and final checkpoints; the latest ``keep`` are kept.

    ``keep <= 0`` keeps every checkpoint. The best checkpoint is always kept.
    """

    def __init__(self, directory: str | Path, keep: int = 3, *, async_save: bool = True) -> None:
        self.directory = Path(directory)
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
                item_handlers={STATE: ocp.StandardCheckpointHandler(), META: ocp.JsonCheckpointHandler()},
                options=options,
            )
        except Exception as exc:  # unreadable directory or metadata
            raise CheckpointError(
                f"cannot open checkpoints in {str(self.directory)!r}: {type(exc).__name__}: {_first_line(exc)}; "
                "fix or remove that directory"
            ) from exc

    # -- queries --------------------------------------------------------------------------
    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def best_step(self) -> int | None:
        """The checkpoint with the lowest validation loss (None if none was validated)."""
        return self.manager.best_step()

    def meta(self, step: int) -> dict[str, Any]:
        restored = self.manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()}))
        return dict(restored[META] or {})

    # -- save / restore ------------------------------------------------------------------
    def save(self, step: int, state: Mapping[str, Any], meta: Mapping[str, Any], val_loss: float | None = None) -> None:
        """Start saving ``state`` (a tree of arrays) and ``meta`` (JSON) as ``step``."""
        metrics = {VAL_LOSS: float(val_loss)} if val_loss is not None else None
        self.manager.save(
            step,
            args=ocp.args.Composite(**{STATE: ocp.args.StandardSave(dict(state)), META: ocp.args.JsonSave(dict(meta))}),
            metrics=metrics,
            force=True,
        )

    def check_shapes(self, step: int, abstract_params: Any) -> None:
        """Raise CheckpointError if the saved parameters do not match ``abstract_params``."""
        try:
            saved = self.manager.item_metadata(step)[STATE]
        except Exception as exc:
            raise CheckpointError(
                f"checkpoint {self._where(step)} is unreadable ({type(exc).__name__}: {_first_line(exc)}); "
                "remove it to resume from an earlier one"
            ) from exc
        tree = getattr(saved, "tree", saved)
        if not isinstance(tree, Mapping) or "params" not in tree:
            raise CheckpointError(
                f"checkpoint {self._where(step)} holds no parameters; remove it or use a new run/name"
            )
        saved_shapes = _shapes(tree["params"])
        wanted = _shapes(abstract_params)
        for path, shape in wanted.items():
            if path not in saved_shapes:
                raise CheckpointError(
                    f"checkpoint {self._where(step)} has no parameter {path!r} of the configured model; "
                    "use the model configuration the run was started with, or a new run/name"
                )
            if tuple(saved_shapes[path]) != tuple(shape):
                raise CheckpointError(
                    f"checkpoint {self._where(step)} has parameter {path!r} of shape {tuple(saved_shapes[path])} "
                    f"but the configured model expects {tuple(shape)}; use the model configuration the run was "
                    "started with, or a new run/name"
                )
        extra = sorted(set(saved_shapes) - set(wanted))
        if extra:
            raise CheckpointError(
                f"checkpoint {self._where(step)} has parameter {extra[0]!r} that the configured model lacks; "
                "use the model configuration the run was started with, or a new run/name"
            )

    def restore(self, step: int, abstract_state: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """Restore ``step`` into the shapes, dtypes and shardings of ``abstract_state``."""
        if "params" in abstract_state:
            self.check_shapes(step, abstract_state["params"])
        try:
            restored = self.manager.restore(
                step,
                args=ocp.args.Composite(
                    **{STATE: ocp.args.StandardRestore(dict(abstract_state)), META: ocp.args.JsonRestore()}
                ),
            )
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"cannot restore checkpoint {self._where(step)}: {type(exc).__name__}: {_first_line(exc)}; "
                "remove it to resume from an earlier one, or use a new run/name"
            ) from exc
        return dict(restored[STATE]), dict(restored[META] or {})

    def wait(self) -> None:
        """Block until background saves have committed."""
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()

    def _where(self, step: int) -> str:
        return f"{str(self.directory / str(step))!r}"


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: hasattr(x, "shape"))[0]
    return {_path(path): tuple(leaf.shape) for path, leaf in flat if hasattr(leaf, "shape")}


def _path(path: tuple[Any, ...]) -> str:
    parts = []
    for entry in path:
        for attr in ("key", "name", "idx"):
            if hasattr(entry, attr):
                parts.append(str(getattr(entry, attr)))
                break
        else:
            parts.append(str(entry))
    return "/".join(parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
