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


def configure_job(name: str, out: Path, overrides: list[str]) -> None:
    from theseus.config import parse_overrides, write_yaml
    from theseus.config.types import coerce

    _cls, schema = job_schema(name)
    values = schema.defaults()
    for key, value in parse_overrides(overrides).items():
        if key not in schema:
            raise TheseusError(f"unknown configuration key {key!r} (override){schema.suggest(key)}")
        values[key] = coerce(value, schema[key].type, key)
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
    from theseus.base.job import JobContext, default_root
    from theseus.config import configuration, load

    from_options(distributed)  # joins a multi-process run before the job touches a device
    cls, schema = job_schema(name)
    cfg = load(schema, config_file, overrides)
    root = (root or default_root()).expanduser()
    if root.exists() and not root.is_dir():
        raise TheseusError(f"root {str(root)!r} is a file; pass --root with a directory")
    context = JobContext(name=name, root=root, config=cfg, verbose=verbose, extra={"distributed": distributed or {}})
    with configuration(cfg):
        job = cls(context)
        job.run()
