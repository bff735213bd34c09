"""Plugins: pluggy hook specifications and entry-point discovery."""

from theseus.plugins.discovery import (
    COMPONENTS_GROUP,
    JOBS_GROUP,
    Plugins,
    plugins,
    register_hooks,
    reset,
)
from theseus.plugins.hookspecs import hookimpl, hookspec

__all__ = [
    "COMPONENTS_GROUP",
    "JOBS_GROUP",
    "Plugins",
    "hookimpl",
    "hookspec",
    "plugins",
    "register_hooks",
    "reset",
]
