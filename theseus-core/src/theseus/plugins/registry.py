"""The registry of jobs and components, filled from entry points, hooks and ``@job``.

It lives beside discovery, which fills it; ``theseus.registry`` is its public import path.
"""

from __future__ import annotations

import difflib
import importlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from theseus.errors import PluginError
from theseus.plugins.entries import COMPONENT_KINDS, LOCAL, Entry

BLOCK_ENV = "THESEUS_BLOCK_PLUGINS"
STRICT_ENV = "THESEUS_STRICT_PLUGINS"
#: theseus's own distributions: a component name they provide cannot be taken over by a plugin.
OWN_DISTRIBUTIONS = ("theseus-core", "theseus-models", "theseus-data")


@dataclass
class Failure:
    """A plugin problem found while discovering or loading: reported, then skipped."""

    distribution: str
    entry: str
    message: str
    announced: bool = False  #: already printed as a warning when it happened


def blocked_distributions() -> set[str]:
    raw = os.environ.get(BLOCK_ENV, "")
    return {_normalize(name) for name in raw.replace(";", ",").split(",") if name.strip()}


def strict_plugins() -> bool:
    return os.environ.get(STRICT_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _normalize(dist: str) -> str:
    return dist.strip().lower().replace("_", "-").replace(".", "-")


#: What ``Registry`` checks a loaded object against: ``{kind: base type}``, where a base type is a
#: class or an ``"module:Class"`` path imported on first use (so that listing imports nothing).
BaseTypes = Mapping[str, "type | str"]


def _resolve(base: type | str) -> type:
    if isinstance(base, type):
        return base
    module_name, _, attribute = base.partition(":")
    resolved = importlib.import_module(module_name)
    for part in attribute.split("."):
        resolved = getattr(resolved, part)
    if not isinstance(resolved, type):
        raise TypeError(f"base type {base!r} is not a class")
    return resolved


def _expected(kind: str, base: type) -> str:
    if kind == "job":
        return "a Job class"
    return f"a {base.__module__}.{base.__qualname__} subclass"


def _check(entry: Entry, obj: Any, base: type | str | None) -> None:
    """Raise a PluginError unless ``obj`` is what an entry of its kind must be."""
    kind = entry.kind
    if base is not None:
        klass = _resolve(base)
        ok, expected = isinstance(obj, type) and issubclass(obj, klass), _expected(kind, klass)
    elif kind in ("optimizer", "schedule"):
        ok = hasattr(obj, "config") and callable(getattr(obj, "factory", None))
        expected = f"a {kind.capitalize()} factory container (config type + factory function)"
    elif kind == "init_source":
        ok = all(callable(getattr(obj, method, None)) for method in ("open", "model_class"))
        expected = "a reader with open(target, spec) and model_class(target)"
    elif kind == "reward":
        ok, expected = callable(obj), "a callable reward(prompts, completions, metadata) (a function or a class)"
    elif kind in ("plugin", "job"):
        ok, expected = True, ""
    else:
        ok, expected = isinstance(obj, type), "a class"
    if ok:
        return
    got = type(obj).__name__
    if kind == "job":
        raise PluginError(
            f"job {entry.name!r} from {entry.distribution} points at {entry.target!r}, which is "
            f"not {expected} (got {got}); point the entry point at a BaseTrainer or Job subclass"
        )
    raise PluginError(
        f"component {entry.key!r} from {entry.distribution} points at {entry.target!r}, "
        f"which is not {expected} (got {got}); fix the entry point"
    )


class Registry:
    """Jobs by key and components by ``(kind, name)``, each attributed to a distribution.

    ``bases`` is what a loaded object must subclass, by kind (``"job"`` included); kinds not in
    it are checked by shape only. The registry imports none of these types itself.
    """

    def __init__(self, bases: BaseTypes | None = None) -> None:
        self.bases: dict[str, type | str] = dict(bases or {})
        self.jobs: dict[str, Entry] = {}
        self.components: dict[tuple[str, str], Entry] = {}
        self.failures: list[Failure] = []
        self.conflicts: dict[str, list[Entry]] = {}
        self.distributions: dict[str, str] = {}  # name -> version, of every contributor
        self.blocked: set[str] = set()
        #: Entries that blocked distributions would have added: job name or "kind/name" -> distribution.
        self.blocked_entries: dict[str, str] = {}
        self._current_distribution: tuple[str, str] | None = None

    # -- adding -----------------------------------------------------------------
    def attributed(self, distribution: str, version: str = "") -> _Attribution:
        """Context manager: entries added inside are attributed to ``distribution``."""
        return _Attribution(self, distribution, version)

    def add_job(self, name: str, target: str | type, *, distribution: str | None = None, version: str = "") -> None:
        entry = self._entry("job", name, target, distribution, version)
        self._insert(self.jobs, name, entry, f"job {name!r}")

    def add_component(self, key: str, target: str | Any, *, distribution: str | None = None, version: str = "") -> None:
        kind, sep, name = key.partition("/")
        dist = distribution or (self._current_distribution or (LOCAL, ""))[0]
        if not sep or not name:
            self.report(dist, key, f"component name {key!r} from {dist} must be 'kind/name' (e.g. 'model/gpt')")
            return
        if kind not in COMPONENT_KINDS:
            kinds = ", ".join(COMPONENT_KINDS)
            self.report(dist, key, f"component {key!r} from {dist} has unknown kind {kind!r}; use one of: {kinds}")
            return
        entry = self._entry(kind, name, target, distribution, version)
        self._insert(self.components, (kind, name), entry, f"component {key!r}")

    def report(self, distribution: str, entry: str, message: str) -> None:
        """Record a plugin failure (fatal when THESEUS_STRICT_PLUGINS is set)."""
        if strict_plugins():
            raise PluginError(message + f" ({STRICT_ENV} is set)")
        self.failures.append(Failure(distribution, entry, message))

    def _validator(self, kind: str) -> Callable[[Entry, Any], None]:
        base = self.bases.get(kind)
        return lambda entry, obj: _check(entry, obj, base)

    def _entry(self, kind: str, name: str, target: str | Any, distribution: str | None, version: str) -> Entry:
        validate = self._validator(kind)
        if distribution is None and self._current_distribution is not None:
            distribution, version = self._current_distribution
        distribution = distribution or LOCAL
        if distribution != LOCAL:
            self.distributions.setdefault(distribution, version)
        if isinstance(target, str):
            return Entry(kind, name, target, distribution, version, validate=validate)
        qual = f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', repr(target))}"
        entry = Entry(kind, name, qual, distribution, version, validate=validate)
        validate(entry, target)
        entry.obj = target
        return entry

    def _insert(self, table: dict[Any, Entry], key: Any, entry: Entry, label: str) -> None:
        existing = table.get(key)
        if existing is None:
            table[key] = entry
            return
        if existing.target == entry.target or (existing.obj is not None and existing.obj is entry.obj):
            table[key] = entry  # the same object registered again (e.g. a file imported twice)
            return
        if existing.distribution == LOCAL and entry.distribution == LOCAL:
            table[key] = entry  # a re-imported user file replaces its own registration
            return
        providers = self.conflicts.setdefault(label, [existing])
        providers.append(entry)
        if _has_winner(providers) and precedence(entry) < precedence(existing):
            table[key] = entry  # the name keeps one provider, whatever the discovery order

    def conflict_warnings(self) -> list[str]:
        """One line per name that several distributions provide, saying what is used."""
        lines = []
        for label, providers in self.conflicts.items():
            names = _and(sorted({p.distribution for p in providers}))
            if not _has_winner(providers):
                lines.append(f"{label} is provided by both {names}; it cannot be used until one is removed")
                continue
            winner = min(providers, key=precedence)  # what _insert kept: the first of the lowest
            others = sorted({p.distribution for p in providers} - {winner.distribution})
            lines.append(
                f"{label} is provided by both {names}; {winner.distribution}'s ({winner.target}) is used; "
                f"to silence this, {_unshadow(others)}"
            )
        return lines

    # -- lookup -----------------------------------------------------------------
    def _check_conflict(self, label: str) -> None:
        """A job several plugin distributions provide cannot be run (a component name, and a job name that
        theseus itself provides, has a winner)."""
        providers = self.conflicts.get(label)
        if providers and not _has_winner(providers):
            names = " and ".join(sorted({f"{p.distribution} ({p.target})" for p in providers}))
            raise PluginError(
                f"{label} is provided by both {names}; uninstall one, or block one with {BLOCK_ENV}=<distribution>"
            )

    def job(self, name: str) -> Entry:
        self._check_conflict(f"job {name!r}")
        if name not in self.jobs:
            self._check_blocked("job", name)
            close = difflib.get_close_matches(name, list(self.jobs), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else "; run 'theseus jobs' to list them"
            raise PluginError(f"unknown job {name!r}{hint}")
        return self.jobs[name]

    def _check_blocked(self, label: str, key: str) -> None:
        dist = self.blocked_entries.get(key)
        if dist is not None:
            raise PluginError(
                f"{label} {key!r} comes from {dist}, which {BLOCK_ENV} blocks; remove {dist} from {BLOCK_ENV} to use it"
            )

    def load_job(self, name: str) -> type:
        return self.job(name).load()  # type: ignore[no-any-return]

    def component(self, kind: str, name: str) -> Entry:
        if kind not in COMPONENT_KINDS:
            close = difflib.get_close_matches(kind, list(COMPONENT_KINDS), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else f"; kinds are: {', '.join(COMPONENT_KINDS)}"
            raise PluginError(f"unknown component kind {kind!r}{hint}")
        if (kind, name) not in self.components:
            self._check_blocked("component", f"{kind}/{name}")
            names = [n for (k, n) in self.components if k == kind]
            close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; installed: {', '.join(sorted(names)) or 'none'}"
            raise PluginError(f"unknown {kind} {name!r}{hint}")
        return self.components[(kind, name)]

    def load_component(self, kind: str, name: str) -> Any:
        return self.component(kind, name).load()

    def components_of(self, kind: str | None = None) -> list[Entry]:
        return [e for (k, _), e in sorted(self.components.items()) if kind is None or k == kind]


def _has_winner(providers: list[Entry]) -> bool:
    """Whether a name several distributions provide keeps one of them: always for a component; for a job,
    when theseus provides it (a plugin cannot take a built-in job's name), else none is run."""
    return providers[0].kind != "job" or any(precedence(p)[0] == 0 for p in providers)


def precedence(entry: Entry) -> tuple[int, str]:
    """Which provider of a component name wins (lowest first): theseus's own distributions, then
    other distributions by name, then in-process registrations (``@component``, ``--load``)."""
    dist = _normalize(entry.distribution)
    if dist in OWN_DISTRIBUTIONS:
        return 0, dist
    return (2, dist) if entry.distribution == LOCAL else (1, dist)


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _unshadow(others: list[str]) -> str:
    """How to stop ``others`` from providing a name another distribution wins."""
    dists = [d for d in others if d != LOCAL]
    them = "it" if len(dists) == 1 else "them"
    advice = [f"uninstall {_and(dists)} or block {them} with {BLOCK_ENV}={','.join(dists)}"] if dists else []
    if LOCAL in others:
        advice.append(f"rename the {LOCAL} registration")
    return "; ".join(advice) or "register the name once"


class _Attribution:
    def __init__(self, registry: Registry, distribution: str, version: str) -> None:
        self.registry, self.value = registry, (distribution, version)

    def __enter__(self) -> Registry:
        self.previous = self.registry._current_distribution
        self.registry._current_distribution = self.value
        return self.registry

    def __exit__(self, *exc: object) -> None:
        self.registry._current_distribution = self.previous
