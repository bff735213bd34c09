"""The registry of jobs and components, and the ``@job`` / ``@component`` decorators.

The public import path of what ``theseus.plugins`` keeps: this package imports the plugins
package, never the other way round.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from theseus.plugins.entries import COMPONENT_KINDS, LOCAL, Entry
from theseus.plugins.registry import BLOCK_ENV, STRICT_ENV, Failure, Registry

T = TypeVar("T")


def job(key: str) -> Callable[[T], T]:
    """Register a Job/BaseTrainer subclass under ``key`` (e.g. ``"my/gpt/train"``).

    Importing the file that holds the decorated class registers it: the class becomes a
    ``theseus_register`` hook implementation of ``<local>``, like any plugin's.
    """

    def decorate(cls: T) -> T:
        from theseus.plugins.discovery import declare

        cls.JOB_KEY = key  # type: ignore[attr-defined]
        declare("job", key, cls)
        return cls

    return decorate


def component(key: str) -> Callable[[T], T]:
    """Register an object in-process as the component ``kind/name`` (see ``job``)."""

    def decorate(obj: T) -> T:
        from theseus.plugins.discovery import declare

        declare("component", key, obj)
        return obj

    return decorate


def get_registry() -> Registry:
    """The registry of installed and in-process jobs and components."""
    from theseus.plugins.discovery import plugins

    return plugins().registry


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
