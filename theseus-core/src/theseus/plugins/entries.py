"""Registry entries: a named job or component, loaded from its target on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from theseus.errors import PluginError

#: Component kinds and what each is. ``plugin`` entries are pluggy hook implementations.
COMPONENT_KINDS: dict[str, str] = {
    "model": "a language model (Module subclass)",
    "layer": "a model building block (Module subclass)",
    "dataset": "a source of documents",
    "tokenizer": "a tokenizer",
    "optimizer": "an Optimizer factory container",
    "schedule": "a Schedule factory container",
    "evaluation": "an evaluation class",
    "analysis": "an analysis class",
    "hf": "a Hugging Face checkpoint family (config.json and tensor names, both ways)",
    "plugin": "pluggy hook implementations",
}

LOCAL = "<local>"


@dataclass
class Entry:
    """A job or component: where it comes from and how to import it."""

    kind: str
    name: str
    target: str
    distribution: str = LOCAL
    version: str = ""
    obj: Any = None
    validate: Callable[[Entry, Any], None] | None = field(default=None, repr=False)

    @property
    def key(self) -> str:
        return self.name if self.kind == "job" else f"{self.kind}/{self.name}"

    @property
    def provider(self) -> str:
        return self.distribution if self.distribution == LOCAL else f"{self.distribution} {self.version}".strip()

    def load(self) -> Any:
        """Import and validate the target; a failure is a PluginError naming the distribution."""
        if self.obj is None:
            obj = import_target(self.target, self)
            if self.validate is not None:
                self.validate(self, obj)
            self.obj = obj
        return self.obj


def import_target(target: str, entry: Entry) -> Any:
    module_name, _, attribute = target.partition(":")
    where = f"{entry.key!r} from {entry.distribution}"
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # a plugin ending the process at import included
        raise PluginError(
            f"plugin {where} failed to import {module_name!r}: {type(exc).__name__}: {exc}; "
            f"fix or reinstall {entry.distribution}, or block it with THESEUS_BLOCK_PLUGINS={entry.distribution}"
        ) from exc
    for part in filter(None, attribute.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginError(
                f"plugin {where} points at {target!r}, but {module_name!r} has no attribute "
                f"{attribute!r}; fix the entry point in {entry.distribution}'s pyproject.toml"
            ) from exc
    return obj
