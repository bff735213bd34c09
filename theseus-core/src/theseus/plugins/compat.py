"""Which theseus a plugin distribution was written for, and whether the installed one fits.

A plugin declares the plugin API it targets with its requirement on theseus-core, e.g.
``dependencies = ["theseus-core>=0.1,<0.2"]`` (``Requires-Dist`` in its metadata). The plugin API
(the public import paths and hooks listed in ``docs/writing-a-plugin.md``) is versioned by
theseus-core's release: while the major version is 0 it changes only with the minor version (0.1 ->
0.2), from 1.0 on only with the major version, and a name that goes away is deprecated (it warns)
for one minor release first. ``supported_range()`` is the range a new plugin should declare.

Only metadata is read here (no plugin is imported), and ``packaging`` only for a requirement
this module does not read itself, so listing stays fast.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from theseus.plugins.installed import Provider, canonical

if TYPE_CHECKING:
    from packaging.version import Version

CORE = "theseus-core"

#: A requirement line: name, optional extras, the rest (specifier, maybe in parentheses, and a marker).
_REQUIREMENT = re.compile(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*(.*)")
_RELEASE = re.compile(r"\d+(?:\.\d+)*")
_CLAUSE = re.compile(r"(>=|<=|==|!=|<|>)(\d+(?:\.\d+)*)")


def core_version() -> str:
    """The installed theseus-core version ("0" when its metadata is missing, e.g. a bare source tree)."""
    from importlib import metadata

    try:
        return metadata.version(CORE)
    except metadata.PackageNotFoundError:
        return "0"


def _parse(version: str | None) -> Version:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version if version is not None else core_version())
    except InvalidVersion:
        return Version("0")


def api_version(version: str | None = None) -> str:
    """The plugin API of a theseus-core version: ``MAJOR.MINOR`` (``"0.1"`` for 0.1.3)."""
    v = _parse(version)
    return f"{v.major}.{v.minor}"


def supported_range(version: str | None = None) -> str:
    """The theseus-core range a plugin written against ``version`` should declare (``>=0.1,<0.2``)."""
    v = _parse(version)
    upper = f"{v.major}.{v.minor + 1}" if v.major == 0 else f"{v.major + 1}"
    return f">={v.major}.{v.minor},<{upper}"


@dataclass(frozen=True)
class Target:
    """What one distribution declares about theseus-core and whether the installed one satisfies it."""

    distribution: str
    version: str
    requirement: str  #: the specifier on theseus-core ("" when the plugin declares none)
    compatible: bool

    @property
    def shown(self) -> str:
        """The requirement as ``theseus plugins`` shows it."""
        return self.requirement or "any"

    def problem(self, core: str) -> str:
        """The one-line warning for an incompatible plugin, naming the fix."""
        return (
            f"{self.distribution} {self.version} targets theseus-core{self.requirement} but theseus-core {core} "
            f"is installed; install a {self.distribution} release for theseus-core {api_version(core)} "
            f"(or theseus-core{self.requirement}), or block it with THESEUS_BLOCK_PLUGINS={self.distribution}"
        )


def _release(text: str) -> tuple[int, ...] | None:
    return tuple(int(part) for part in text.split(".")) if _RELEASE.fullmatch(text) else None


def _core_specifier(line: str) -> tuple[str, bool] | None:
    """``(specifier, applies)`` of a ``Requires-Dist`` line on theseus-core; None for other lines.

    ``applies`` is False for a requirement only under an extra (not what the plugin needs to work).
    Plain specifiers (``>=0.1,<0.2``) are read here; anything else (a marker, a URL, ``~=``) by
    ``packaging``, imported only then.
    """
    match = _REQUIREMENT.fullmatch(line)
    if match is None or canonical(match.group(1)) != CORE:
        return None
    rest = match.group(2).strip()
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    clauses = [clause.replace(" ", "") for clause in rest.split(",") if clause.strip()]
    if all(_CLAUSE.fullmatch(clause) for clause in clauses):
        return ",".join(clauses), True
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        req = Requirement(line)
    except InvalidRequirement:
        return None
    applies = req.marker is None or req.marker.evaluate({"extra": ""})
    return ",".join(map(str, req.specifier)), applies


def _compare(have: tuple[int, ...], op: str, want: tuple[int, ...]) -> bool:
    width = max(len(have), len(want))
    a, b = have + (0,) * (width - len(have)), want + (0,) * (width - len(want))
    return {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, "<": a < b, ">": a > b}[op]


def satisfies(specifier: str, version: str) -> bool:
    """Whether ``version`` is in ``specifier`` (pre-releases included), as ``packaging`` decides.

    A final release against plain clauses is compared here; anything else goes to ``packaging``.
    """
    clauses = [clause for clause in specifier.split(",") if clause]
    have = _release(version)
    matches = [_CLAUSE.fullmatch(clause) for clause in clauses]
    if have is not None and all(matches):
        return all(_compare(have, m.group(1), _release(m.group(2)) or ()) for m in matches if m is not None)
    from packaging.specifiers import SpecifierSet

    return SpecifierSet(specifier).contains(_parse(version), prereleases=True)


def target_of(provider: Provider, core: str | None = None) -> Target:
    """The theseus-core requirement of ``provider`` checked against ``core`` (default: the installed version)."""
    core = core if core is not None else core_version()
    for line in provider.requires:
        found = _core_specifier(line)
        if found is None or not found[1]:
            continue
        spec = ",".join(sorted(found[0].split(","), key=lambda s: (not s.startswith(">"), s))) if found[0] else ""
        return Target(provider.name, provider.version, spec, satisfies(spec, core) if spec else True)
    return Target(provider.name, provider.version, "", True)


def targets(found: Iterable[Provider], core: str | None = None) -> dict[str, Target]:
    """Targets of the given plugin distributions (theseus-core itself left out), by name."""
    return {p.name: target_of(p, core) for p in found if canonical(p.name) != CORE}


__all__ = ["CORE", "Target", "api_version", "core_version", "satisfies", "supported_range", "target_of", "targets"]
