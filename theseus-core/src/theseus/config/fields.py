"""``field()``: attach a configuration key to a dataclass or Flax module attribute."""

from __future__ import annotations

import dataclasses
import re
import typing
from dataclasses import dataclass
from typing import Any

from theseus.errors import ConfigError

KEY_METADATA = "theseus_key"
HELP_METADATA = "theseus_help"
MISSING: Any = dataclasses.MISSING

_KEY_PATTERN = re.compile(r"^[A-Za-z0-9_\-]+(/[A-Za-z0-9_\-]+)*$")


def field(
    key: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    help: str = "",
) -> Any:
    """Declare an attribute whose value comes from the configuration key ``key``.

    ``key`` is a slash path such as ``"architecture/scale"``. Without ``default`` or
    ``default_factory`` the key is required: configuring the class fails with a clear
    message unless a value is supplied.
    """
    if not isinstance(key, str) or not _KEY_PATTERN.match(key):
        raise ConfigError(
            f"invalid configuration key {key!r}: use slash-separated names such as 'architecture/n_layers'"
        )
    if default is not MISSING and default_factory is not MISSING:
        raise ConfigError(f"field {key!r}: give either default or default_factory, not both")
    if isinstance(default, (list, dict, set)):
        raise ConfigError(f"field {key!r}: a mutable default must be given as default_factory=lambda: ...")
    metadata = {KEY_METADATA: key, HELP_METADATA: help}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata, kw_only=True)
    return dataclasses.field(default=default, metadata=metadata, kw_only=True)


@dataclass(frozen=True)
class FieldSpec:
    """One configuration key as declared by one class."""

    key: str
    type: Any
    default: Any
    owner: type
    attribute: str
    help: str = ""

    @property
    def required(self) -> bool:
        return self.default is MISSING

    @property
    def owner_name(self) -> str:
        return f"{self.owner.__module__}.{self.owner.__qualname__}"


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls)
    except Exception:  # unresolved forward references: fall back to raw annotations
        hints: dict[str, Any] = {}
        for klass in reversed(cls.__mro__):
            hints.update(getattr(klass, "__annotations__", {}))
        return hints


def declared_fields(cls: type) -> list[FieldSpec]:
    """The configuration fields a class declares (its own and inherited)."""
    if not dataclasses.is_dataclass(cls):
        return []
    hints = _type_hints(cls)
    specs = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get(KEY_METADATA)
        if key is None:
            continue
        if f.default is not MISSING:
            default = f.default
        elif f.default_factory is not MISSING:
            default = f.default_factory()  # type: ignore[misc,operator]
        else:
            default = MISSING
        specs.append(
            FieldSpec(
                key=key,
                type=hints.get(f.name, f.type),
                default=default,
                owner=cls,
                attribute=f.name,
                help=f.metadata.get(HELP_METADATA, ""),
            )
        )
    return specs
