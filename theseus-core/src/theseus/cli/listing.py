"""``theseus jobs`` / ``components`` / ``plugins``: listings that read metadata only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from theseus.errors import TheseusError
from theseus.registry import COMPONENT_KINDS, Registry

if TYPE_CHECKING:
    from theseus.plugins.discovery import Plugins


def _table(rows: Sequence[tuple[str, ...]], header: tuple[str, ...]) -> str:
    if not rows:
        return ""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(header, widths, strict=False)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() for row in rows]
    return "\n".join(lines)


def warn_problems(registry: Registry, include_failures: bool = True) -> None:
    if include_failures:
        for failure in registry.failures:
            if not failure.announced:  # a hook failure was printed when it happened
                click.echo(f"warning: {failure.message}", err=True)
    for line in registry.conflict_warnings():
        click.echo(f"warning: {line}", err=True)


def list_jobs(registry: Registry) -> None:
    rows = [(name, e.provider) for name, e in sorted(registry.jobs.items())]
    click.echo(_table(rows, ("JOB", "PROVIDED BY")) or "no jobs installed")
    warn_problems(registry)


def list_components(registry: Registry, kind: str | None) -> None:
    if kind is not None and kind not in COMPONENT_KINDS:
        raise TheseusError(f"unknown component kind {kind!r}; kinds are: {', '.join(COMPONENT_KINDS)}")
    rows = [(e.key, e.provider, e.target) for e in registry.components_of(kind)]
    click.echo(_table(rows, ("COMPONENT", "PROVIDED BY", "TARGET")) or "no components installed")
    warn_problems(registry)


def list_plugins(plugins: object) -> None:
    from theseus.plugins.discovery import Plugins

    assert isinstance(plugins, Plugins)
    registry = plugins.registry
    commands = plugin_commands(plugins)  # also so that a failing CLI hook shows below
    rows = []
    for dist, version in sorted(registry.distributions.items()):
        jobs = sum(1 for e in registry.jobs.values() if e.distribution == dist)
        comps = sum(1 for e in registry.components.values() if e.distribution == dist and e.kind != "plugin")
        hooks = ", ".join(plugins.hooks_of(dist)) or "-"
        target = plugins.targets.get(dist)
        incompatible = target is not None and not target.compatible
        failures = sum(1 for f in registry.failures if f.distribution == dist) - int(incompatible)
        status = ", ".join([*(["incompatible"] if incompatible else []), *([f"{failures} failed"] if failures else [])])
        rows.append((dist, version, target.shown if target else "-", str(jobs), str(comps), hooks, status or "ok"))
    for dist in sorted(registry.blocked):
        rows.append((dist, "", "-", "-", "-", "-", "blocked"))
    header = ("DISTRIBUTION", "VERSION", "THESEUS-CORE", "JOBS", "COMPONENTS", "HOOKS", "STATUS")
    click.echo(_table(rows, header) or "no plugins installed")
    for failure in registry.failures:
        click.echo(f"  {failure.distribution}: {failure.message}")
    if commands:
        click.echo("plugin commands: " + ", ".join(f"{name} ({dist})" for name, (dist, _) in sorted(commands.items())))
    warn_problems(registry, include_failures=False)


def plugin_commands(plugins: Plugins) -> dict[str, tuple[str, click.Command]]:
    """``{name: (distribution, command)}`` of the commands plugins add (``theseus_cli_commands``).

    This imports every plugin's hook module: only running a command that is not built in, and
    ``theseus plugins``, ask for it; ``theseus --help`` lists the built-in commands only.
    """
    commands: dict[str, tuple[str, click.Command]] = {}
    for dist, result in plugins.call("theseus_cli_commands"):
        for command in result:
            if isinstance(command, click.Command) and command.name:
                commands.setdefault(command.name, (dist, command))
    return commands
