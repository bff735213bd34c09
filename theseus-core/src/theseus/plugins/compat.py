"""Which theseus a plugin distribution was written for, and whether the installed one fits.

A plugin declares the plugin API it targets with its requirement on theseus-core, e.g.
``dependencies = ["theseus-core>=0.1,<0.2"]`` (``Requires-Dist`` in its metadata). The plugin API
(the public import paths and hooks listed in ``docs/writing-a-plugin.md``) is versioned by
theseus-core's release: while the major version is 0 it changes only with the minor version (0.1 ->
0.2), from 1.0 on only with the major version, and a name that goes away is deprecated (it warns)
for one minor release first. ``supported_range()`` is the range a new plugin should declare.

Only metadata is read here (no plugin is imported), so listing stays fast.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

CORE = "theseus-core"


def core_version() -> str:
    """The installed theseus-core version ("0" when its metadata is missing, e.g. a bare source tree)."""
    try:
        return metadata.version(CORE)
    except metadata.PackageNotFoundError:
        return "0"


def _parse(version: str | None) -> Version:
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


def target_of(dist: metadata.Distribution, core: str | None = None) -> Target:
    """The theseus-core requirement of ``dist`` checked against ``core`` (default: the installed version)."""
    core = core if core is not None else core_version()
    name = dist.metadata["Name"] or "?"
    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if canonicalize_name(req.name) != CORE:
            continue
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # only under an extra: not what the plugin needs to work
        spec = ",".join(sorted(map(str, req.specifier), key=lambda s: (not s.startswith(">"), s)))  # lower bound first
        ok = req.specifier.contains(_parse(core), prereleases=True) if spec else True
        return Target(name, dist.version, spec, ok)
    return Target(name, dist.version, "", True)


def targets(distributions: Iterable[str], core: str | None = None) -> dict[str, Target]:
    """Targets of the named installed distributions (theseus-core itself and unknown names left out)."""
    found: dict[str, Target] = {}
    for name in distributions:
        if canonicalize_name(name) == CORE:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = target_of(dist, core)
    return found


__all__ = ["CORE", "Target", "api_version", "core_version", "supported_range", "target_of", "targets"]
