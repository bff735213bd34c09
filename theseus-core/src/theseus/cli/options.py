"""Options that several ``theseus`` commands take, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

#: ``--config FILE``: a YAML written by ``theseus configure``.
config_option = click.option(
    "--config", "config_file", type=click.Path(path_type=Path), default=None, help="YAML from 'theseus configure'."
)


def root_option(help: str = "Root for data and runs (default $THESEUS_ROOT or ~/.theseus).") -> Any:
    """``--root DIR``: where data and runs live."""
    return click.option("--root", type=click.Path(file_okay=False, path_type=Path), default=None, help=help)
