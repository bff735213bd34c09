"""The job's real training step, built as ``theseus run`` builds it, compiled for a target's devices.

The trainer is the job's own class (plugins' included) with two changes: its mesh spans the target's
devices, and without prepared data it has no loader (the step's inputs are described by
:meth:`~theseus.training.base.BaseTrainer.abstract_train_batch`). Compiling it and what it holds per
device: :mod:`theseus.training.compiled`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from theseus.errors import DataError
from theseus.training.compiled import (
    CompiledStep,
    StepTooLarge,
    compile_train_step,
    held_bytes,
    shard_bytes,
)


def planning_trainer(job: type, devices: Sequence[Any]) -> type:
    """``job`` with its mesh on ``devices``, reading data only where it is prepared."""

    class Planned(job):  # type: ignore[misc,valid-type]
        def mesh_devices(self) -> list[Any]:
            return list(devices)

        def _build_flywheel(self) -> Any:
            try:
                return super()._build_flywheel()
            except (DataError, FileNotFoundError):
                return None

    Planned.__name__ = job.__name__
    Planned.__qualname__ = job.__qualname__
    Planned.__module__ = job.__module__
    return Planned


def build_trainer(
    job: type, devices: Sequence[Any], overrides: Sequence[str], root: Path, config_file: Path | None = None
) -> Any:
    """The planning trainer of ``job`` configured from ``overrides`` as ``theseus run`` would, set up."""
    planned: Any = planning_trainer(job, devices)
    trainer = planned.create(root, list(overrides), config_file=config_file)
    trainer.setup()
    return trainer


__all__ = [
    "CompiledStep",
    "StepTooLarge",
    "build_trainer",
    "compile_train_step",
    "held_bytes",
    "planning_trainer",
    "shard_bytes",
]
