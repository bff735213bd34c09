"""Discovery: the entry-point scanner and the process-wide plugin manager."""

from __future__ import annotations

import importlib.metadata as metadata
import threading
from typing import Any

import pluggy

from theseus.errors import PluginError
from theseus.plugins import hookspecs
from theseus.plugins.compat import CORE, Target, core_version, targets
from theseus.plugins.hookspecs import PROJECT, hookimpl
from theseus.registry.entries import LOCAL
from theseus.registry.registry import Registry, blocked_distributions, strict_plugins

JOBS_GROUP = "theseus.jobs"
COMPONENTS_GROUP = "theseus.components"


class EntryPointScanner:
    """Built-in plugin: registers every ``theseus.jobs`` / ``theseus.components`` entry point.

    Only distribution metadata is read; targets are imported when first used.
    """

    @hookimpl(tryfirst=True)
    def theseus_register(self, registry: Registry) -> None:
        blocked = blocked_distributions()
        for group in (JOBS_GROUP, COMPONENTS_GROUP):
            for ep in metadata.entry_points(group=group):
                dist = ep.dist.name if ep.dist is not None else LOCAL
                version = ep.dist.version if ep.dist is not None else ""
                if dist.lower().replace("_", "-") in blocked:
                    registry.blocked.add(dist)
                    registry.blocked_entries[ep.name] = dist
                    continue
                if group == JOBS_GROUP:
                    registry.add_job(ep.name, ep.value, distribution=dist, version=version)
                else:
                    registry.add_component(ep.name, ep.value, distribution=dist, version=version)


class Plugins:
    """The registry plus the pluggy manager holding every hook implementation."""

    def __init__(self) -> None:
        self.manager = pluggy.PluginManager(PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.registry = Registry()
        self.hook_owners: dict[str, str] = {}  # plugin name -> distribution
        scanner = EntryPointScanner()
        self.manager.register(scanner, name="theseus-core:entry-points")
        self.hook_owners["theseus-core:entry-points"] = "theseus-core"
        scanner.theseus_register(self.registry)
        self.targets = check_targets(self.registry)
        for entry in self.registry.components_of("plugin"):
            try:
                obj = entry.load()
            except PluginError as exc:
                self.registry.report(entry.distribution, entry.key, str(exc))
                continue
            name = f"{entry.distribution}:{entry.name}"
            self.manager.register(obj, name=name)
            self.hook_owners[name] = entry.distribution
        for name, impl in self._impls("theseus_register"):
            if name == "theseus-core:entry-points":
                continue
            dist = self.hook_owners.get(name, LOCAL)
            with self.registry.attributed(dist, self.registry.distributions.get(dist, "")):
                self._call(name, impl, {"registry": self.registry})

    def _impls(self, hook: str) -> list[tuple[str, Any]]:
        caller = getattr(self.manager.hook, hook)
        impls = []
        for impl in reversed(caller.get_hookimpls()):  # pluggy calls in reverse registration order
            impls.append((impl.plugin_name, impl))
        return impls

    def _call(self, name: str, impl: Any, kwargs: dict[str, Any]) -> Any:
        args = {k: v for k, v in kwargs.items() if k in impl.argnames}
        try:
            return impl.function(**args)
        except PluginError:
            raise
        except Exception as exc:
            dist = self.hook_owners.get(name, name)
            message = (
                f"plugin hook {impl.function.__name__} of {dist} raised {type(exc).__name__}: {exc}; "
                f"fix the plugin or block it with THESEUS_BLOCK_PLUGINS={dist}"
            )
            raise PluginError(message) from exc

    def call(self, hook: str, **kwargs: Any) -> list[tuple[str, Any]]:
        """Call every implementation of ``hook``; returns ``(distribution, result)`` pairs.

        A raising implementation becomes a PluginError naming its distribution.
        """
        results = []
        for name, impl in self._impls(hook):
            result = self._call(name, impl, kwargs)
            if result is not None:
                results.append((self.hook_owners.get(name, name), result))
        return results

    def hooks_of(self, distribution: str) -> list[str]:
        names = []
        for plugin_name, dist in self.hook_owners.items():
            if dist != distribution:
                continue
            for caller in self.manager.get_hookcallers(self.manager.get_plugin(plugin_name)) or []:
                names.append(caller.name)
        return sorted(set(names))


def check_targets(registry: Registry) -> dict[str, Target]:
    """Each plugin distribution's theseus-core target; an incompatible one is reported (fatal if strict)."""
    core = core_version()
    found = targets(registry.distributions, core)
    for name, target in found.items():
        if not target.compatible:
            registry.report(name, CORE, target.problem(core))
    return found


_PLUGINS: Plugins | None = None
_LOCK = threading.Lock()


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


def register_hooks(obj: Any, name: str, distribution: str = LOCAL) -> None:
    """Register an in-process object holding hook implementations (e.g. from a --load file)."""
    p = plugins()
    if p.manager.get_plugin(name) is None:
        p.manager.register(obj, name=name)
        p.hook_owners[name] = distribution


def strict() -> bool:
    return strict_plugins()
