"""Options that several ``theseus`` commands take, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

#: ``--config FILE``: a YAML written by ``theseus configure``.
config_option = click.option(
    "--config", "config_file", type=click.Path(path_type=Path), default=None, help="YAML from 'theseus configure'."
)


#: Where ``--root`` leaves its value in the click context's ``meta`` (shared by every command's context).
ROOT_META = "theseus.root"


class RootPath(click.Path):
    """A root directory; an empty value (``--root ""``, an unset shell variable) is refused rather than
    read as the working directory."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and not value.strip():
            from theseus.errors import ConfigError

            raise ConfigError(
                f"--root is empty ({value!r}); give a directory (--root DIR), "
                "or leave --root out to use $THESEUS_ROOT or ~/.theseus"
            )
        path = super().convert(value, param, ctx)
        if ctx is not None:
            ctx.meta[ROOT_META] = path  # for the one-line disk and memory failures of any command
        return path


def given_root(ctx: click.Context) -> Path:
    """The root the command was given (``--root``), else ``$THESEUS_ROOT`` or ``~/.theseus``, absolute."""
    from theseus.base.job import default_root
    from theseus.config.paths import absolute

    return absolute(ctx.meta.get(ROOT_META) or default_root())


def root_option(help: str = "Root for data and runs (default $THESEUS_ROOT or ~/.theseus).") -> Any:
    """``--root DIR``: where data and runs live (never empty)."""
    return click.option("--root", type=RootPath(file_okay=False, path_type=Path), default=None, help=help)
