"""The ``theseus`` console command.

``theseus run`` first restarts itself with transparent huge pages for XLA's per-step host buffers
(:mod:`theseus.base.host_memory`); every command then goes to :func:`theseus.cli.main.main`. This
module imports nothing heavy, so the restart costs one interpreter start.
"""

from __future__ import annotations

import sys

#: Options of the ``theseus`` group that take a value (the subcommand comes after it).
_VALUED_OPTIONS = ("--load",)


def subcommand(args: list[str]) -> str | None:
    """The subcommand in ``args`` (the first argument that is neither a group option nor its value)."""
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg in _VALUED_OPTIONS:
            skip = True
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> None:
    if subcommand(sys.argv[1:]) == "run":
        from theseus.base.host_memory import restart_with_huge_pages

        restart_with_huge_pages()
    from theseus.cli.main import main as run_cli

    run_cli()
