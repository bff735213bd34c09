"""Discovery: the entry-point scanner and the process-wide plugin manager.

Every hook is called through pluggy (``manager.hook.<name>``), so ordering (``tryfirst``,
``trylast``), ``firstresult``, wrappers and ``PluginValidationError`` behave as pluggy documents.
Each plugin is registered as a stand-in (``guard``) whose implementations report their own
failure with the plugin's distribution, so a broken plugin is skipped and the rest keep working.
"""

from __future__ import annotations

import difflib
import sys
import threading
from contextlib import AbstractContextManager
from typing import Any

import pluggy

from theseus.errors import PluginError
from theseus.plugins import hookspecs
from theseus.plugins.compat import CORE, Target, core_version, targets
from theseus.plugins.entries import LOCAL
from theseus.plugins.guard import RESULTS, guard
from theseus.plugins.hookspecs import PROJECT, hookimpl
from theseus.plugins.installed import COMPONENTS_GROUP, JOBS_GROUP, Provider, canonical, providers
from theseus.plugins.registry import BLOCK_ENV, BaseTypes, Registry, blocked_distributions, strict_plugins

#: What each kind's objects must subclass, imported only when an entry is loaded.
BASE_TYPES: BaseTypes = {
    "job": "theseus.base.job:Job",
    "model": "theseus.model.module:Module",
    "layer": "theseus.model.module:Module",
    "hf": "theseus.model.huggingface.family:HFFamily",  # theseus-models; resolved only when one loads
    "environment": "theseus.rl.environment:Environment",
    "objective": "theseus.training.objective:Objective",
    "rl_loss": "theseus.model.rl.policy_losses:PolicyLoss",  # theseus-models; resolved only when one loads
}
SCANNER = "theseus-core:entry-points"


def one_line(text: str) -> str:
    """``text`` with its lines joined by ``"; "`` (pluggy's messages span several lines)."""
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


class EntryPointScanner:
    """Built-in plugin: registers every ``theseus.jobs`` / ``theseus.components`` entry point.

    Only distribution metadata is read; targets are imported when first used.
    """

    def __init__(self) -> None:
        self.providers: list[Provider] = []

    @hookimpl(tryfirst=True)
    def theseus_register(self, registry: Registry) -> None:
        blocked = blocked_distributions()
        self.providers = providers()
        for provider in self.providers:
            dist, version = provider.name, provider.version
            if canonical(dist) in blocked:
                registry.blocked.add(dist)
                registry.blocked_entries.update({name: dist for _, name, _ in provider.entry_points})
                continue
            for group, name, value in provider.entry_points:
                if group == JOBS_GROUP:
                    registry.add_job(name, value, distribution=dist, version=version)
                else:
                    registry.add_component(name, value, distribution=dist, version=version)


class Declared:
    """One ``@job`` / ``@component`` registration: a plugin of ``<local>`` adding one entry."""

    def __init__(self, kind: str, key: str, obj: Any) -> None:
        self.kind, self.key, self.obj = kind, key, obj

    @hookimpl
    def theseus_register(self, registry: Registry) -> None:
        if self.kind == "job":
            registry.add_job(self.key, self.obj)
        else:
            registry.add_component(self.key, self.obj)


class Plugins:
    """The registry plus the pluggy manager holding every hook implementation."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.registry = Registry(BASE_TYPES)
        self.hook_owners: dict[str, str] = {}  # plugin name -> distribution
        self._reported: set[tuple[str, str]] = set()
        self.scanner = EntryPointScanner()
        self.add(self.scanner, SCANNER, CORE)
        # Historic: the scanner runs now, and each plugin registered from here on as it is registered.
        self.manager.hook.theseus_register.call_historic(kwargs={"registry": self.registry})
        self.targets = check_targets(self.registry, self.scanner.providers)
        for entry in self.registry.components_of("plugin"):
            try:
                obj = entry.load()
            except PluginError as exc:
                self.registry.report(entry.distribution, entry.key, str(exc))
                continue
            problem = self.add(obj, f"{entry.distribution}:{entry.name}", entry.distribution)
            if problem is not None:
                self.registry.report(entry.distribution, entry.key, f"plugin {entry.key!r} from {problem}")
        for name, declared in _declared_now():
            self.add(declared, name, LOCAL)

    # -- registering --------------------------------------------------------------
    def add(self, plugin: Any, name: str, distribution: str) -> str | None:
        """Register ``plugin``'s hook implementations as ``name``; the problem if pluggy refuses them.

        The problem reads "<distribution> ..." so that callers can prefix what the plugin is.
        """
        hooks = self._hooks_of(plugin)
        problem = self._misfit(hooks, distribution)
        if problem is not None:
            return problem
        stand_in = guard(
            plugin,
            hooks,
            name,
            failed=lambda hook, exc: self._failed(name, hook, exc),
            around=lambda: self._attributed(name),
            firstresult=self._firstresult,
            marker=f"{PROJECT}_impl",
        )
        self.hook_owners[name] = distribution
        try:
            self.manager.register(stand_in, name=name)
        except pluggy.PluginValidationError as exc:
            del self.hook_owners[name]
            return f"{distribution} does not match the theseus hooks: {one_line(str(exc))}; {_fix(distribution)}"
        return None

    def replace(self, plugin: Any, name: str, distribution: str) -> str | None:
        """``add``, after unregistering whatever was registered as ``name``."""
        if self.manager.get_plugin(name) is not None:
            self.manager.unregister(name=name)
        return self.add(plugin, name, distribution)

    def _hooks_of(self, plugin: Any) -> dict[str, dict[str, Any]]:
        found = {}
        for attribute in dir(plugin):
            opts = self.manager.parse_hookimpl_opts(plugin, attribute)
            if opts is not None:
                found[attribute] = dict(opts)
        return found

    def _misfit(self, hooks: dict[str, dict[str, Any]], distribution: str) -> str | None:
        """What pluggy would accept but theseus does not: an unknown hook, an old-style hookwrapper."""
        known = [name for name in vars(self.manager.hook) if not name.startswith("_")]
        for attribute, opts in hooks.items():
            hook = opts.get("specname") or attribute
            caller = getattr(self.manager.hook, hook, None)
            if (caller is None or not caller.has_spec()) and not opts.get("optionalhook"):
                close = difflib.get_close_matches(hook, known, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"hooks are: {', '.join(sorted(known))}"
                return f"{distribution} implements {hook!r}, which is not a theseus hook ({hint}); {_fix(distribution)}"
            if opts.get("hookwrapper"):
                return (
                    f"{distribution} declares {hook} with hookwrapper=True, which theseus does not support; "
                    f"use @hookimpl(wrapper=True)"
                )
        return None

    def _firstresult(self, hook: str) -> bool:
        caller = getattr(self.manager.hook, hook, None)
        return bool(caller is not None and caller.spec is not None and caller.spec.opts.get("firstresult"))

    def _attributed(self, name: str) -> AbstractContextManager[Any]:
        dist = self.hook_owners.get(name, LOCAL)
        return self.registry.attributed(dist, self.registry.distributions.get(dist, ""))

    def _failed(self, name: str, hook: str, exc: Exception) -> None:
        """A hook implementation raised: report it once (fatal when strict) and go on without it."""
        if (name, hook) in self._reported:
            return
        self._reported.add((name, hook))
        dist = self.hook_owners.get(name, LOCAL)
        message = (
            f"plugin hook {hook} of {dist} raised {type(exc).__name__}: {one_line(str(exc))}; "
            f"it was skipped; {_fix(dist)}"
        )
        self.registry.report(dist, hook, message)
        self.registry.failures[-1].announced = True
        print(f"warning: {message}", file=sys.stderr)

    # -- calling --------------------------------------------------------------------
    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """``manager.hook.<hook>(**kwargs)``, each value paired with the distribution that gave it.

        The values are pluggy's result (one value for a ``firstresult`` hook, ``None`` left out).
        A raising implementation is reported by its distribution and skipped.
        """
        record: list[tuple[str, Any]] = []
        token = RESULTS.set(record)
        try:
            result = getattr(self.manager.hook, hook)(**kwargs)
        finally:
            RESULTS.reset(token)
        values = ([] if result is None else [result]) if self._firstresult(hook) else list(result)
        origin = {id(value): name for name, value in record}
        return [(self.hook_owners.get(origin.get(id(value), ""), LOCAL), value) for value in values]

    def hooks_of(self, distribution: str) -> list[str]:
        """The hooks the plugins of ``distribution`` implement."""
        names = []
        for plugin_name, dist in self.hook_owners.items():
            if dist != distribution:
                continue
            for caller in self.manager.get_hookcallers(self.manager.get_plugin(plugin_name)) or []:
                names.append(caller.name)
        return sorted(set(names))


def _fix(distribution: str) -> str:
    if distribution == LOCAL:
        return "fix the hook implementation"
    return f"fix the plugin or block it with {BLOCK_ENV}={distribution}"


def check_targets(registry: Registry, found: list[Provider]) -> dict[str, Target]:
    """Each plugin distribution's theseus-core target; an incompatible one is reported (fatal if strict)."""
    core = next((p.version for p in found if canonical(p.name) == CORE), None) or core_version()
    listed = targets((p for p in found if p.name in registry.distributions), core)
    for name, target in listed.items():
        if not target.compatible:
            registry.report(name, CORE, target.problem(core))
    return listed


_PLUGINS: Plugins | None = None
_LOCK = threading.RLock()
#: Every ``@job`` / ``@component`` registration of this process, by plugin name (kept across ``reset``).
_DECLARED: dict[str, Declared] = {}


def plugins() -> Plugins:
    """The process-wide plugins (metadata scanned once per process)."""
    global _PLUGINS
    with _LOCK:
        if _PLUGINS is None:
            _PLUGINS = Plugins()
        return _PLUGINS


def reset() -> None:
    """Forget discovered plugins (tests, or after installing a distribution in-process)."""
    global _PLUGINS
    with _LOCK:
        _PLUGINS = None


def _declared_now() -> list[tuple[str, Declared]]:
    with _LOCK:
        return list(_DECLARED.items())


def declare(kind: str, key: str, obj: Any) -> None:
    """Register ``obj`` as job or component ``key`` of ``<local>`` (what ``@job`` / ``@component`` do).

    Before discovery it waits for it; afterwards it is registered at once.
    """
    name = f"{LOCAL}:{kind}:{key}"
    declared = Declared(kind, key, obj)
    with _LOCK:
        _DECLARED[name] = declared
        current = _PLUGINS
    if current is not None:
        current.replace(declared, name, LOCAL)


def register_hooks(obj: Any, name: str, distribution: str = LOCAL) -> None:
    """Register an in-process object holding hook implementations (e.g. from a --load file).

    An object pluggy refuses (an argument the hook does not have, an unknown hook) is a PluginError.
    """
    p = plugins()
    if p.manager.get_plugin(name) is None:
        problem = p.add(obj, name, distribution)
        if problem is not None:
            raise PluginError(f"hooks {name!r} of {problem}")


def strict() -> bool:
    return strict_plugins()


__all__ = [
    "BASE_TYPES",
    "COMPONENTS_GROUP",
    "JOBS_GROUP",
    "Declared",
    "EntryPointScanner",
    "Plugins",
    "check_targets",
    "declare",
    "one_line",
    "plugins",
    "register_hooks",
    "reset",
]
