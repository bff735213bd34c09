"""Options that several ``theseus`` commands take, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

#: ``--config FILE``: a YAML written by ``theseus configure``.
config_option = click.option(
    "--config", "config_file", type=click.Path(path_type=Path), default=None, help="YAML from 'theseus configure'."
)


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
        return super().convert(value, param, ctx)


def root_option(help: str = "Root for data and runs (default $THESEUS_ROOT or ~/.theseus).") -> Any:
    """``--root DIR``: where data and runs live (never empty)."""
    return click.option("--root", type=RootPath(file_okay=False, path_type=Path), default=None, help=help)
