"""Choosing environments and rewards by registered name: ``environment/<name>``, ``reward/<name>``,
and the weighted reward selection ``rl/rewards=correct:1.0,format:0.2``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from theseus.config import configure, field
from theseus.errors import ConfigError, PluginError

if TYPE_CHECKING:  # environment.py imports this module to load its rewards
    from theseus.rl.environment import Environment, RewardFn

REWARDS_KEY = "rl/rewards"


@dataclass
class EnvironmentSelection:
    """The selection key of a job that declares an ``ENVIRONMENT``."""

    environment: str = field(
        "select/environment", default="", help="environment by registered name (environment=countdown)"
    )


def parse_weights(text: str, check: bool = True) -> dict[str, float]:
    """``{name: weight}`` of ``"name[:weight],..."`` (a weight defaults to 1.0); with ``check``,
    every name must be a registered reward (one ConfigError line suggesting a close name)."""
    how = f"{REWARDS_KEY}={text}"
    weights: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, raw = (s.strip() for s in part.partition(":"))
        if not name:
            raise ConfigError(f"{how}: {part!r} has no reward name; write name:weight")
        try:
            weight = float(raw) if sep else 1.0
        except ValueError:
            raise ConfigError(f"{how}: the weight of {name!r} is {raw!r}, not a number") from None
        if not math.isfinite(weight):
            raise ConfigError(f"{how}: the weight of {name!r} must be finite, got {raw!r}")
        if name in weights:
            raise ConfigError(f"{how}: {name!r} is given twice; keep one")
        weights[name] = weight
    if check:
        from theseus.registry import get_registry
        from theseus.training.selection import unknown_name

        registry = get_registry()
        for name in weights:
            if ("reward", name) not in registry.components and f"reward/{name}" not in registry.blocked_entries:
                raise unknown_name("reward", name, how)
    return weights


def _load(kind: str, name: str) -> Any:
    from theseus.training.selection import load

    return load(kind, name.removeprefix(f"{kind}/"), f"theseus components {kind}/{name}")


def environment_class(name: str) -> type[Environment]:
    """The environment class registered as ``environment/<name>``."""
    cls: type[Environment] = _load("environment", name)
    return cls


def declared_environment(job: type) -> type[Environment]:
    """The environment class a job declares (``ENVIRONMENT``, which ``environment=`` replaces)."""
    from theseus.training import declarations

    found: type[Environment] = declarations.resolve("environment", job.ENVIRONMENT)  # type: ignore[attr-defined]
    return found


def load_environment(name: str, **overrides: Any) -> Environment:
    """The environment ``name`` built from the active configuration (``configure``)."""
    return configure(environment_class(name), **overrides)


def load_reward(name: str) -> RewardFn:
    """The reward ``name``: a registered function as it is, a registered class configured."""
    obj = _load("reward", name)
    if isinstance(obj, type):
        obj = configure(obj) if dataclasses.is_dataclass(obj) else obj()
    if not callable(obj):
        raise PluginError(
            f"reward {name!r} is not callable; a reward is called as reward(prompts, completions, metadata)"
        )
    reward: RewardFn = obj
    return reward


def reward_config(weights: Mapping[str, float] | None = None) -> list[type]:
    """The configuration classes of the rewards named in ``weights``, or of every registered reward
    (the keys a job accepts whichever rewards ``rl/rewards`` names)."""
    if weights is None:
        from theseus.registry import get_registry

        weights = {key[1]: 1.0 for key in get_registry().components if key[0] == "reward"}
    classes: list[type] = []
    for name in weights:
        obj = _load("reward", name)
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            classes.append(obj)
    return classes
