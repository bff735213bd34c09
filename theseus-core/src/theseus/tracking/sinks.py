"""Choosing a run's metrics sinks (``metrics/sinks``) and keeping a failing tracker from stopping training."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError
from theseus.tracking.config import BUILTIN_SINKS, EXTRAS

#: The module each tracker needs, checked before a run writes anything.
WANDB_MODES = ("online", "offline", "disabled")
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}


def selected_sinks(config: Mapping[str, Any]) -> list[str]:
    """The trackers named by ``metrics/sinks`` (besides ``jsonl``), validated and installed."""
    raw = config.get("metrics/sinks", "jsonl")
    names = raw if isinstance(raw, (list, tuple)) else str(raw or "").split(",")
    chosen: list[str] = []
    for name in (str(n).strip().lower() for n in names):
        if not name or name == "jsonl" or name in chosen:
            continue
        if name not in BUILTIN_SINKS:
            raise ConfigError(
                f"unknown metrics sink {name!r} in metrics/sinks; choose from {', '.join(BUILTIN_SINKS)} "
                "(other trackers are added by plugins through the theseus_metrics_sinks hook)"
            )
        if importlib.util.find_spec(_PACKAGES[name]) is None:
            raise ConfigError(
                f"metrics/sinks selects {name} but {_PACKAGES[name]} is not installed; "
                f"pip install 'theseus-core[{EXTRAS[name]}]'"
            )
        chosen.append(name)
    mode = str(config.get("metrics/wandb/mode") or "")
    if "wandb" in chosen and mode and mode not in WANDB_MODES:
        raise ConfigError(f"metrics/wandb/mode must be one of {', '.join(WANDB_MODES)} (or empty), got {mode!r}")
    return chosen


class GuardedSink:
    """Forwards to a sink until it raises; then warns once and leaves it out for the rest of the run."""

    def __init__(self, name: str, sink: Any, warn: Callable[[str], None]) -> None:
        self.name = name
        self.sink = sink
        self.warn = warn
        self.failed = False

    def _fail(self, action: str, exc: BaseException) -> None:
        self.failed = True
        self.warn(
            f"warning: metrics sink {self.name} failed {action} ({type(exc).__name__}: {exc}); "
            "training goes on without it and metrics.jsonl keeps every record"
        )

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        if self.failed:
            return
        try:
            self.sink.write(step, dict(metrics))
        except Exception as exc:
            self._fail(f"at step {step}", exc)

    def write_table(self, step: int, name: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Forward a table to a sink that takes tables (``write_table``); others never see one."""
        write = getattr(self.sink, "write_table", None)
        if self.failed or not callable(write):
            return
        try:
            write(step, name, list(columns), [list(row) for row in rows])
        except Exception as exc:
            self._fail(f"writing the table {name} at step {step}", exc)

    def close(self) -> None:
        close = getattr(self.sink, "close", None)
        if self.failed or not callable(close):
            return
        try:
            close()
        except Exception as exc:
            self._fail("while closing", exc)


def _sink_name(sink: Any) -> str:
    return str(getattr(sink, "name", None) or type(sink).__name__)


def open_sinks(
    run_dir: Path,
    trainer: Any,
    *,
    start: int,
    plugin_sinks: Sequence[Any] = (),
    warn: Callable[[str], None] = print,
) -> list[GuardedSink]:
    """The selected trackers plus the plugins' sinks for a run starting after update ``start``.

    A tracker that cannot start (no network, bad credentials) warns and is left out; the run goes on.
    """
    config = trainer.context.config
    sinks: list[GuardedSink] = []
    for name in selected_sinks(config):
        try:
            sink = _open(name, Path(run_dir), trainer, start)
        except ConfigError:
            raise
        except Exception as exc:
            warn(
                f"warning: metrics sink {name} could not start ({type(exc).__name__}: {exc}); "
                "training goes on without it and metrics.jsonl keeps every record"
            )
            continue
        sinks.append(GuardedSink(name, sink, warn))
    sinks.extend(GuardedSink(_sink_name(sink), sink, warn) for sink in plugin_sinks)
    return sinks


def run_record(run_dir: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """The resolved configuration (selections included) and the provenance record, for trackers."""
    from theseus.base import jsonfile

    record: dict[str, Any] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in config.items()}
    with contextlib.suppress(jsonfile.UnreadableJSON):  # a record of any configured value: numbers unchecked
        record["provenance"] = jsonfile.read(Path(run_dir) / "provenance.json", check_numbers=False)
    return record


def _open(name: str, run_dir: Path, trainer: Any, start: int) -> Any:
    config = trainer.context.config
    if name == "tensorboard":
        from theseus.tracking.tensorboard import TensorBoardSink

        return TensorBoardSink(run_dir, start=start)
    if name == "wandb":
        from theseus.tracking.wandb import WandbSink

        return WandbSink(run_dir, config, run_name=trainer.run_name, record=run_record(run_dir, config))
    if name == "mlflow":
        from theseus.tracking.mlflow import MlflowSink

        return MlflowSink(
            run_dir,
            config,
            root=trainer.context.root,
            run_name=trainer.run_name,
            job=trainer.context.name,
            record=run_record(run_dir, config),
        )
    raise AssertionError(name)
