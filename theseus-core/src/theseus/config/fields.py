"""``field()``: attach a configuration key to a dataclass or Flax module attribute."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from theseus.config.types import shown
from theseus.errors import ConfigError

KEY_METADATA = "theseus_key"
HELP_METADATA = "theseus_help"
CONSTRAINT_METADATA = "theseus_constraints"
PATH_METADATA = "theseus_path"
#: What a ``path=`` field holds: ``"file"`` a local file or folder; ``"source"`` a local folder or a
#: hub id; ``"spec"`` a ``kind:target`` value whose ``hf:`` target is a source (``hf:./gpt2``, ``run:x``).
PATH_KINDS = ("file", "source", "spec")
MISSING: Any = dataclasses.MISSING

_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*$")

#: The integers a configuration value may hold: what a 64-bit signed integer (NumPy's and JAX's int64,
#: a checkpoint's step) holds, whether or not the key declares bounds.
INT_MIN = -(2**63)
INT_MAX = 2**63 - 1


def field(
    key: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    help: str = "",
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: Sequence[Any] | None = None,
    path: str | None = None,
) -> Any:
    """Declare an attribute whose value comes from the configuration key ``key``.

    ``key`` is a slash path such as ``"architecture/scale"``. Without ``default`` or
    ``default_factory`` the key is required: configuring the class fails with a clear
    message unless a value is supplied.

    Constraints are checked when a configuration is loaded: ``min``/``max`` bound a number
    inclusively, ``above``/``below`` exclusively, and ``choices`` lists the accepted values
    (``None`` passes when the type allows it). An integer value, bounded or not, is one a 64-bit
    integer holds (``INT_MIN`` to ``INT_MAX``).

    ``path`` marks a value that names something on disk (one of ``PATH_KINDS``): ``theseus run``
    makes it absolute against the working directory before the job starts.
    """
    if not isinstance(key, str) or not _KEY_PATTERN.match(key):
        raise ConfigError(
            f"invalid configuration key {key!r}: use slash-separated names such as 'architecture/n_layers'"
        )
    if default is not MISSING and default_factory is not MISSING:
        raise ConfigError(f"field {key!r}: give either default or default_factory, not both")
    if path is not None and path not in PATH_KINDS:
        raise ConfigError(f"field {key!r}: path={path!r} is not a path kind; use one of {', '.join(PATH_KINDS)}")
    if isinstance(default, (list, dict, set)):
        raise ConfigError(f"field {key!r}: a mutable default must be given as default_factory=lambda: ...")
    constraints = Constraints(
        min=min, max=max, above=above, below=below, choices=tuple(choices) if choices is not None else None
    )
    metadata: dict[str, Any] = {KEY_METADATA: key, HELP_METADATA: help}
    if constraints.any:
        metadata[CONSTRAINT_METADATA] = constraints
    if path is not None:
        metadata[PATH_METADATA] = path
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata, kw_only=True)
    return dataclasses.field(default=default, metadata=metadata, kw_only=True)


@dataclass(frozen=True)
class Constraints:
    """Bounds and choices of one configuration key; ``violation()`` describes a value that breaks them."""

    min: float | None = None
    max: float | None = None
    above: float | None = None
    below: float | None = None
    choices: tuple[Any, ...] | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.min, self.max, self.above, self.below, self.choices))

    def describe(self) -> str:
        """``"> 0"``, ``">= 0 and < 1"``, ``"one of 'a', 'b'"`` ("" without constraints)."""
        parts = []
        for bound, sign in ((self.min, ">="), (self.above, ">"), (self.max, "<="), (self.below, "<")):
            if bound is not None:
                parts.append(f"{sign} {bound:g}")
        if self.choices is not None:
            parts.append("one of " + ", ".join(repr(c) for c in self.choices))
        return " and ".join(parts)

    def integer_range(self) -> tuple[int, int]:
        """The lowest and highest integer the bounds accept, within what a 64-bit integer holds."""
        low, high = INT_MIN, INT_MAX
        if self.min is not None and math.isfinite(self.min):
            low = max(low, math.ceil(self.min))
        if self.above is not None and math.isfinite(self.above):
            low = max(low, math.floor(self.above) + 1)
        if self.max is not None and math.isfinite(self.max):
            high = min(high, math.floor(self.max))
        if self.below is not None and math.isfinite(self.below):
            high = min(high, math.ceil(self.below) - 1)
        return low, high

    def violation(self, key: str, value: Any) -> str | None:
        """One line naming ``key``, the bad ``value`` and what is accepted; None when it is fine."""
        if value is None or value is MISSING:
            return None
        if isinstance(value, int) and not INT_MIN <= value <= INT_MAX:  # every integer key, bounded or not
            low, high = self.integer_range()
            return f"{key}={shown(value)} is out of range; it must be an integer from {low} to {high}"
        if self.choices is not None and value not in self.choices:
            return f"{key}={value!r} is not accepted; use one of: {', '.join(str(c) for c in self.choices)}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return None
        if value != value:  # NaN: never a setting, bounded or not
            bounds = f" {self.describe()}" if self.describe() else ""
            return f"{key}=nan is not a number; it must be a finite number{bounds}"
        broken = (
            (self.min is not None and not value >= self.min)
            or (self.max is not None and not value <= self.max)
            or (self.above is not None and not value > self.above)
            or (self.below is not None and not value < self.below)
        )
        if broken:
            return f"{key}={value!r} is out of range; it must be {self.describe()}"
        if (
            isinstance(value, float)
            and math.isinf(value)
            and any(bound is not None for bound in (self.min, self.max, self.above, self.below))
        ):
            return f"{key}={value!r} is out of range; it must be a finite number {self.describe()}"
        return None


NO_CONSTRAINTS = Constraints()


@dataclass(frozen=True)
class FieldSpec:
    """One configuration key as declared by one class."""

    key: str
    type: Any
    default: Any
    owner: type
    attribute: str
    help: str = ""
    constraints: Constraints = NO_CONSTRAINTS
    path: str | None = None

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def owner_name(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}"


#: The resolved annotations of each class, once: ``typing.get_type_hints`` evaluates every string
#: annotation anew on each call, and a job's schema is built on each configuration it resolves.
_HINTS: weakref.WeakKeyDictionary[type, dict[str, Any]] = weakref.WeakKeyDictionary()


def _type_hints(cls: type) -> dict[str, Any]:
    cached = _HINTS.get(cls)
    if cached is not None:
        return cached
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # unresolved forward references: fall back to raw annotations (not kept: they may resolve later)
        hints = {}
        for klass in reversed(cls.__mro__):
            hints.update(getattr(klass, "__annotations__", {}))
        return hints
    _HINTS[cls] = hints
    return hints


def declared_fields(cls: type) -> list[FieldSpec]:
    """The configuration fields a class declares (its own and inherited); a ``default_factory`` is called
    anew on each call, so no two schemas share a mutable default."""
    if not dataclasses.is_dataclass(cls):
        return []
    declared = _DECLARED.get(cls)
    if declared is None:
        declared = _declare(cls)
        if cls in _HINTS:  # annotations resolved: the declarations cannot change
            _DECLARED[cls] = declared
    return [spec if factory is MISSING else dataclasses.replace(spec, default=factory()) for spec, factory in declared]


#: Each class's fields with their ``default_factory`` (``MISSING`` where there is none), once.
_DECLARED: weakref.WeakKeyDictionary[type, list[tuple[FieldSpec, Any]]] = weakref.WeakKeyDictionary()


def _declare(cls: type) -> list[tuple[FieldSpec, Any]]:
    hints = _type_hints(cls)
    declared = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get(KEY_METADATA)
        if key is None:
            continue
        default = f.default if f.default is not MISSING or f.default_factory is MISSING else None
        spec = FieldSpec(
            key=key,
            type=hints.get(f.name, f.type),
            default=default,
            owner=cls,
            attribute=f.name,
            help=f.metadata.get(HELP_METADATA, ""),
            constraints=f.metadata.get(CONSTRAINT_METADATA, NO_CONSTRAINTS),
            path=f.metadata.get(PATH_METADATA),
        )
        declared.append((spec, f.default_factory))
    return declared
