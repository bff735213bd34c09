"""The registry of jobs and components, and the ``@job`` decorator."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from theseus.registry.entries import COMPONENT_KINDS, LOCAL, Entry
from theseus.registry.registry import BLOCK_ENV, STRICT_ENV, Failure, Registry

T = TypeVar("T", bound=type)

_LOCAL_JOBS: dict[str, type] = {}
_LOCAL_COMPONENTS: dict[str, Any] = {}


def job(key: str) -> Callable[[T], T]:
    """Register a Job/BaseTrainer subclass under ``key`` (e.g. ``"my/gpt/train"``).

    Importing the file that holds the decorated class registers it.
    """

    def decorate(cls: T) -> T:
        _LOCAL_JOBS[key] = cls
        cls.JOB_KEY = key  # type: ignore[attr-defined]
        return cls

    return decorate


def component(key: str) -> Callable[[T], T]:
    """Register an object in-process as the component ``kind/name``."""

    def decorate(obj: T) -> T:
        _LOCAL_COMPONENTS[key] = obj
        return obj

    return decorate


def get_registry() -> Registry:
    """The registry of installed and in-process jobs and components."""
    from theseus.plugins.discovery import plugins

    registry = plugins().registry
    with registry.attributed(LOCAL):
        for key, cls in _LOCAL_JOBS.items():
            registry.add_job(key, cls)
        for key, obj in _LOCAL_COMPONENTS.items():
            registry.add_component(key, obj)
    return registry


def resolve_component(kind: str, value: Any) -> Any:
    """Turn a registered name (``"gpt"`` or ``"model/gpt"``) into its object; pass objects through."""
    if not isinstance(value, str):
        return value
    name = value.split("/", 1)[1] if value.startswith(kind + "/") else value
    return get_registry().load_component(kind, name)


__all__ = [
    "BLOCK_ENV",
    "COMPONENT_KINDS",
    "LOCAL",
    "STRICT_ENV",
    "Entry",
    "Failure",
    "Registry",
    "component",
    "get_registry",
    "job",
    "resolve_component",
]
