"""The pluggy hook specifications of theseus (project name ``"theseus"``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from pathlib import Path

    from theseus.plugins.registry import Registry

PROJECT = "theseus"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec(historic=True)
def theseus_register(registry: Registry) -> None:
    """Add jobs and components with ``registry.add_job`` / ``registry.add_component``.

    Called once per process with the process's registry, and for a plugin registered later (an
    in-process ``register_hooks``) when it is registered. Entries are attributed to the
    distribution of the plugin that adds them.
    """


@hookspec
def theseus_gather(owner: type) -> list[type] | None:
    """Return extra configuration classes to include when ``owner`` gathers its schemas.

    Called by ``Module.gather()`` (``owner`` is the module class) and by
    ``BaseTrainer.config()`` (``owner`` is the trainer class).
    """


@hookspec
def theseus_metrics_sinks(run_dir: Path, job: Any) -> list[Any] | None:
    """Return metrics sinks for a run: objects with ``write(step, metrics)`` and ``close()``."""


@hookspec
def theseus_cli_commands() -> list[Any] | None:
    """Return extra ``click`` commands to add to the ``theseus`` CLI."""


@hookspec
def theseus_callbacks(trainer: Any) -> list[Any] | None:
    """Return loop callbacks (``theseus.training.callbacks``) to add to a training run of ``trainer``.

    Called once per run, after ``trainer.setup()``; they run after the built-ins and the trainer's own.
    """
