"""Registry entries: a named job or component, loaded from its target on first use."""

from __future__ import annotations

import functools
import importlib
import math
import os
import sys
import time
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
    "init_source": "the reader of training/init_from=<name>:<target> (theseus-models' init_source/hf reads hf:)",
    "environment": "a reinforcement-learning environment (Environment subclass): prompts and their rewards",
    "reward": "a reward: reward(prompts, completions, metadata) -> scores (a function or Reward class)",
    "objective": "a training objective (Objective subclass): what a trainer's step optimises",
    "rl_loss": "a reinforcement-learning policy loss (PolicyLoss subclass) that rl/loss selects",
    "plugin": "pluggy hook implementations",
}

LOCAL = "<local>"

#: Seconds a ``plugin`` entry may take to import before a notice names it (0 turns notices off).
NOTICE_ENV = "THESEUS_PLUGIN_IMPORT_NOTICE_S"
NOTICE_DEFAULT_S = 2.0
#: Kinds whose import is timed for the notice: hook modules, imported by every command. A job or
#: component is imported when a command uses it, together with the libraries it shares with the
#: rest of theseus (jax), so its time is what the user asked for and names no culprit.
NOTICED_KINDS = frozenset({"plugin"})


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


@functools.cache
def _bound(raw: str) -> float:
    """The notice bound ``raw`` (the environment's text) stands for; a bad value warns once."""
    try:
        bound = float(raw) if raw.strip() else NOTICE_DEFAULT_S
        if math.isnan(bound):
            raise ValueError(raw)
        return bound
    except ValueError:
        print(
            f"warning: {NOTICE_ENV}={raw!r} is not a number of seconds; using {NOTICE_DEFAULT_S:g}",
            file=sys.stderr,
        )
        return NOTICE_DEFAULT_S


def notice_bound() -> float:
    """Seconds after which importing a ``plugin`` entry is named on stderr (``<= 0``: never)."""
    return _bound(os.environ.get(NOTICE_ENV, ""))


def notice_slow(entry: Entry, seconds: float) -> None:
    """Print one line naming ``entry`` if importing it took longer than the bound."""
    bound = notice_bound()
    if entry.kind not in NOTICED_KINDS or entry.distribution == LOCAL or bound <= 0 or seconds <= bound:
        return
    print(
        f"notice: plugin {entry.key!r} from {entry.distribution} took {seconds:.1f} s to import "
        f"(bound {bound:g} s, {NOTICE_ENV}); every command imports it: keep the module light, "
        f"or block it with THESEUS_BLOCK_PLUGINS={entry.distribution}",
        file=sys.stderr,
    )


def import_target(target: str, entry: Entry) -> Any:
    """The object ``module:attribute`` names; a slow import of a hook module is named on stderr."""
    module_name, _, attribute = target.partition(":")
    where = f"{entry.key!r} from {entry.distribution}"
    started = time.perf_counter()
    try:
        obj: Any = importlib.import_module(module_name)
    except (Exception, SystemExit, KeyboardInterrupt) as exc:  # a plugin ending the process at import included
        raise PluginError(
            f"plugin {where} failed to import {module_name!r}: {type(exc).__name__}: {exc}; "
            f"fix or reinstall {entry.distribution}, or block it with THESEUS_BLOCK_PLUGINS={entry.distribution}"
        ) from exc
    finally:
        notice_slow(entry, time.perf_counter() - started)
    for part in filter(None, attribute.split(".")):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise PluginError(
                f"plugin {where} points at {target!r}, but {module_name!r} has no attribute "
                f"{attribute!r}; fix the entry point in {entry.distribution}'s pyproject.toml"
            ) from exc
    return obj
