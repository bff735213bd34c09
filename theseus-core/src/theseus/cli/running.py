"""``theseus configure`` and ``theseus run``: resolve a job, its schema and configuration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from theseus.errors import TheseusError


def job_schema(name: str) -> tuple[Any, Any]:
    """The job class registered as ``name`` and the schema of its configuration."""
    from theseus.registry import get_registry

    cls: Any = get_registry().load_job(name)
    return cls, cls.schema()


def selected_job(
    name: str, config_file: Path | None, overrides: list[str], root: Path | None = None
) -> tuple[Any, Any, dict[str, Any], dict[str, Any]]:
    """The job class a run selects (``optimizer=lion`` ...), its schema, file values and overrides
    (``root``: where a ``training/init_from`` run is found)."""
    from theseus.base.job import default_root
    from theseus.config import parse_overrides, read_yaml
    from theseus.config.paths import absolute
    from theseus.registry import get_registry

    cls: Any = get_registry().load_job(name)
    file_values = read_yaml(config_file) if config_file is not None else {}
    values = parse_overrides(overrides)
    chosen, file_values, given = cls.selected(file_values, values, absolute(root or default_root()))
    return chosen, chosen.schema(), file_values, given


def configure_job(name: str, out: Path, overrides: list[str]) -> None:
    from theseus.config import write_yaml
    from theseus.config.types import coerce

    _cls, schema, _, given = selected_job(name, None, overrides)
    values = schema.defaults()
    for key, value in given.items():
        if key not in schema:
            raise TheseusError(f"unknown configuration key {key!r} (override){schema.suggest(key)}")
        values[key] = coerce(value, schema[key].type, key)
    problems = schema.violations(values)
    if problems:
        raise TheseusError("\nerror: ".join(problems))
    if out.exists() and out.is_dir():
        raise TheseusError(f"{str(out)!r} is a directory; give a file name such as {str(out / 'config.yaml')!r}")
    write_yaml(values, out, schema)
    click.echo(f"wrote {len(values)} keys of {name} to {out}")


def run_job(
    name: str,
    overrides: list[str],
    config_file: Path | None,
    root: Path | None,
    *,
    verbose: bool = False,
    distributed: dict[str, Any] | None = None,
) -> None:
    from theseus.base.distributed import from_options
    from theseus.base.failures import one_line_failures
    from theseus.base.job import JobContext, default_root, running_under
    from theseus.config import configuration
    from theseus.config.paths import absolute, resolve_absolute

    from_options(distributed)  # joins a multi-process run before the job touches a device
    root = absolute(root or default_root())
    cls, schema, file_values, given = selected_job(name, config_file, overrides, root)
    cfg = resolve_absolute(schema, file_values, given)  # nothing below sees a relative path
    if root.exists() and not root.is_dir():
        raise TheseusError(f"root {str(root)!r} is a file; pass --root with a directory")
    context = JobContext(name=name, root=root, config=cfg, verbose=verbose, extra={"distributed": distributed or {}})
    with configuration(cfg), one_line_failures(name, root, cfg, schema), running_under(root):
        job = cls(context)
        job.run()
