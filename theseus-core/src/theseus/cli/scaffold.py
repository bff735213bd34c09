"""``theseus new plugin NAME [--dir DIR]``: write a ready plugin distribution from templates.

The templates (``templates/plugin/``, shipped as package data) hold a ``pyproject.toml`` with the
entry points, the theseus-core range the plugin targets and a ``test`` extra (pytest), a trainer job,
a schedule component, a training objective, a reinforcement-learning environment with its reward, a
multi-turn environment with a tool, a hook module, tests that run the job for a few steps on the
objective and play the environments, and a README.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass
from pathlib import Path
from string import Template

import click

from theseus.errors import ConfigError

TEMPLATES = Path(__file__).parent / "templates" / "plugin"
#: A distribution name: lower-case words of letters and digits joined by single dashes.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*")
#: The longest name accepted (the generated files stay within their line length).
MAX_NAME = 40
#: Names a plugin cannot take: theseus's own distributions and its namespace.
RESERVED = frozenset({"theseus", "theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example"})


@dataclass(frozen=True)
class PluginNames:
    """The names one plugin is known by."""

    dist: str  #: the distribution (``pip install``): ``theseus-wordcount``
    package: str  #: its top-level import package: ``theseus_wordcount``
    short: str  #: the prefix of its job and component names: ``wordcount``

    @classmethod
    def of(cls, name: str) -> PluginNames:
        """The names derived from ``NAME``; a ConfigError when it cannot name a distribution."""
        if not NAME_PATTERN.fullmatch(name):
            raise ConfigError(
                f"plugin name {name!r} is not a distribution name; use lower-case letters, digits and "
                "single dashes, starting with a letter (e.g. theseus-wordcount)"
            )
        if len(name) > MAX_NAME:
            raise ConfigError(f"plugin name {name!r} has {len(name)} characters; use at most {MAX_NAME}")
        if name in RESERVED:
            raise ConfigError(f"plugin name {name!r} belongs to theseus itself; choose another name")
        package = name.replace("-", "_")
        if keyword.iskeyword(package):
            raise ConfigError(f"plugin name {name!r} makes the package {package!r}, a Python keyword")
        short = name.removeprefix("theseus-")
        return cls(dist=name, package=package, short=short)


def render_plugin(name: str, parent: Path) -> list[Path]:
    """Write the plugin ``name`` into ``parent/name`` and return the files written.

    The folder must not exist yet (or be empty): nothing is overwritten.
    """
    from theseus.plugins.compat import api_version, supported_range

    names = PluginNames.of(name)
    folder = Path(parent).expanduser() / names.dist
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"{folder} already exists and is not empty; choose another NAME or --dir (nothing written)")
    values = {
        "dist": names.dist,
        "package": names.package,
        "short": names.short,
        "core_range": supported_range(),
        "api": api_version(),
    }
    written = []
    for template in sorted(TEMPLATES.rglob("*.tmpl")):
        relative = template.relative_to(TEMPLATES).with_suffix("")
        target = folder.joinpath(*(names.package if part == "PACKAGE" else part for part in relative.parts))
        target = target.with_name(target.name.replace("PACKAGE", names.package))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(Template(template.read_text(encoding="utf-8")).substitute(values), encoding="utf-8")
        written.append(target)
    return written


@click.group(no_args_is_help=False)
def new() -> None:
    """Create a project from a template (``theseus new plugin NAME``)."""


@new.command("plugin")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Folder in which NAME/ is created.",
)
def plugin(name: str, directory: Path) -> None:
    """Write a ready plugin distribution NAME/: a job, an objective, environments, hooks, tests, a README."""
    written = render_plugin(name, directory)
    names = PluginNames.of(name)
    folder = directory / names.dist
    click.echo(f"created {folder} ({len(written)} files):")
    for path in written:
        click.echo(f"  {path.relative_to(folder)}")
    # pip reads a bare relative name as a package to download: a relative folder is spelled ./NAME
    install = folder if folder.is_absolute() else f"./{folder.as_posix()}"
    click.echo(
        f"job {names.short}/train, objective/{names.short}-focal, schedule/{names.short}-warmup, "
        f"environment/{names.short}-sort with reward/{names.short}-sorted, environment/{names.short}-boxes "
        f"(multi-turn), hooks plugin/{names.short}\n"
        f"next: pip install '{install}[test]' && theseus jobs; then run its tests: cd {folder} && pytest"
    )
