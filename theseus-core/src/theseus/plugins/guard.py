"""A plugin as the plugin manager sees it: its own hook implementations, each reporting its failure.

``guard(plugin, ...)`` returns a stand-in object holding one function per hook implementation of
``plugin``. Each has the name, signature (``__wrapped__``) and hookimpl options of the plugin's
function, so pluggy validates it against the hook specification, orders it (``tryfirst``,
``trylast``, wrappers) and calls it exactly as it would call the plugin's own. Around the call it
attributes what the plugin registers, and turns an exception into a report: the implementation
counts as having returned nothing and the other implementations still run. ``PluginError`` (a
message already meant for the user, or ``THESEUS_STRICT_PLUGINS``) passes through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

from theseus.errors import PluginError

#: Called with the hook name and the exception when an implementation fails.
OnFailure = Callable[[str, Exception], None]
#: Entered around every call into the plugin (``Registry.attributed`` for its distribution).
Around = Callable[[], AbstractContextManager[Any]]

#: While ``Plugins.call`` runs a hook: ``(plugin name, value)`` of every value an implementation gave.
RESULTS: ContextVar[list[tuple[str, Any]] | None] = ContextVar("theseus_hook_results", default=None)


class Guarded:
    """Stands in for one plugin in the plugin manager (its hook functions are instance attributes)."""

    def __init__(self, plugin: Any, functions: dict[str, Callable[..., Any]]) -> None:
        self.__dict__.update(functions)
        self.theseus_plugin = plugin

    def __repr__(self) -> str:
        return f"<hooks of {self.theseus_plugin!r}>"


def _record(plugin_name: str, value: Any) -> None:
    record = RESULTS.get()
    if record is not None and value is not None and all(value is not seen for _, seen in record):
        record.append((plugin_name, value))


def _plain(function: Callable[..., Any], hook: str, plugin_name: str, failed: OnFailure, around: Around) -> Any:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            with around():
                result = function(*args, **kwargs)
        except PluginError:
            raise
        except Exception as exc:
            failed(hook, exc)
            return None
        _record(plugin_name, result)
        return result

    return call


def _wrapper(
    function: Callable[..., Any], hook: str, plugin_name: str, failed: OnFailure, around: Around, firstresult: bool
) -> Any:
    """A ``wrapper=True`` implementation: a failing setup or teardown leaves the result unchanged."""

    def adopt(result: Any) -> Any:
        for item in result if isinstance(result, list) and not firstresult else [result]:
            _record(plugin_name, item)  # what the wrapper added is the plugin's
        return result

    def resume(step: Callable[[], Any], inner: BaseException | None = None) -> tuple[str, Any]:
        """Run the teardown's ``step``: ``("returned", its value)``, ``("failed", None)`` (reported, unless
        it raised ``inner``, the exception it was given) or ``("yielded", None)``."""
        try:
            with around():
                step()
        except StopIteration as stop:
            return "returned", adopt(stop.value)
        except PluginError:
            raise
        except Exception as exc:
            if exc is not inner:
                failed(hook, exc)
            return "failed", None
        return "yielded", None

    @functools.wraps(function)
    def wrap(*args: Any, **kwargs: Any) -> Generator[None, Any, Any]:
        try:
            with around():
                teardown = function(*args, **kwargs)
                next(teardown)
        except PluginError:
            raise
        except Exception as exc:  # StopIteration included: the wrapper did not yield
            failed(hook, exc)
            return (yield)
        try:
            result = yield
        except BaseException as inner:  # a PluginError or an interrupt: the wrapper may see it
            outcome, value = resume(functools.partial(teardown.throw, inner), inner)
            if outcome == "returned":
                return value
            raise inner
        outcome, value = resume(functools.partial(teardown.send, result))
        if outcome == "returned":
            return value
        if outcome == "yielded":
            teardown.close()
            failed(hook, RuntimeError("the wrapper yielded more than once"))
        return result

    return wrap


def guard(
    plugin: Any,
    hooks: dict[str, dict[str, Any]],
    plugin_name: str,
    failed: OnFailure,
    around: Around,
    firstresult: Callable[[str], bool],
    marker: str,
) -> Guarded:
    """The stand-in for ``plugin``; ``hooks`` maps its hook attributes to their hookimpl options.

    ``marker`` is the attribute pluggy reads the options from (``"theseus_impl"``).
    """
    functions: dict[str, Callable[..., Any]] = {}
    for attribute, opts in hooks.items():
        function = getattr(plugin, attribute)
        hook = opts.get("specname") or attribute
        if opts.get("wrapper"):
            guarded = _wrapper(function, hook, plugin_name, failed, around, firstresult(hook))
        else:
            guarded = _plain(function, hook, plugin_name, failed, around)
        setattr(guarded, marker, dict(opts))
        functions[attribute] = guarded
    return Guarded(plugin, functions)
