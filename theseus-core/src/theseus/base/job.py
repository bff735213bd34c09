"""The Job protocol: what ``theseus run`` configures and runs."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from theseus.config import Configuration, Schema, configure

ROOT_ENV = "THESEUS_ROOT"


def default_root() -> Path:
    """``$THESEUS_ROOT`` if set, else ``~/.theseus``."""
    env = os.environ.get(ROOT_ENV)
    return Path(env).expanduser() if env else Path.home() / ".theseus"


_JOB_ROOT: contextvars.ContextVar[Path | None] = contextvars.ContextVar("theseus_job_root", default=None)


@contextlib.contextmanager
def running_under(root: Path) -> Iterator[None]:
    """Make ``root`` the root of the job this process runs (``theseus run --root``) while it runs."""
    token = _JOB_ROOT.set(root)
    try:
        yield
    finally:
        _JOB_ROOT.reset(token)


def job_root() -> Path:
    """The root of the job this process runs, else :func:`default_root`: where what a job reaches by name
    (a reward model's run) lives, under ``--root`` as its own run does."""
    return _JOB_ROOT.get() or default_root()


@dataclass
class JobContext:
    """What a job is given by the CLI: its key, the root directory and the configuration."""

    name: str
    root: Path
    config: Configuration
    verbose: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


class Job:
    """A runnable unit registered under a key (``theseus run KEY``).

    ``CONFIG`` is a dataclass with ``field()`` attributes; ``config()`` lists every class
    whose fields make up the job's schema; ``DEFAULTS`` replaces defaults of keys declared
    by those classes; ``self.args`` is the hydrated ``CONFIG``.
    """

    CONFIG: ClassVar[type | None] = None
    JOB_KEY: ClassVar[str | None] = None
    #: Defaults this job gives keys declared elsewhere (e.g. ``{"architecture/n_layers": 2}``);
    #: users still override them as usual.
    DEFAULTS: ClassVar[dict[str, Any]] = {}

    def __init__(self, context: JobContext) -> None:
        self.context = context
        self.args: Any = configure(self.CONFIG) if self.CONFIG is not None else None

    @classmethod
    def config(cls) -> list[type]:
        """Classes whose ``field()`` declarations make up this job's configuration."""
        return [cls.CONFIG] if cls.CONFIG is not None else []

    @classmethod
    def selected(
        cls, file_values: Mapping[str, Any], overrides: Mapping[str, Any], root: Path | None = None
    ) -> tuple[type[Job], dict[str, Any], dict[str, Any]]:
        """The job class a run's values select, and the values to resolve against its schema (``root``:
        the run root, where a selection may read what it names).

        Plain jobs return themselves; trainers replace declarations chosen by name (``model=llama``).
        """
        return cls, dict(file_values), dict(overrides)

    @classmethod
    def schema(cls) -> Schema:
        """The job's schema: the fields of ``config()`` with this job's ``DEFAULTS`` applied."""
        return Schema.build(cls.config()).with_defaults(cls.DEFAULTS, owner=cls)

    def run(self) -> None:
        raise NotImplementedError(f"{type(self).__qualname__}.run() is not implemented")
