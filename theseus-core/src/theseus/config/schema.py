"""Schemas: the union of configuration fields declared by a list of classes."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from theseus.config.fields import MISSING, FieldSpec, declared_fields
from theseus.config.types import coerce, same_type, type_name
from theseus.errors import ConfigError


class Schema:
    """Every configuration key a job uses, with its type, default and declaring classes."""

    def __init__(self) -> None:
        self._fields: dict[str, FieldSpec] = {}
        self._owners: dict[str, list[type]] = {}
        #: Every section (a proper prefix such as ``training`` of ``training/lr``) -> a key below it.
        self._sections: dict[str, str] = {}

    @classmethod
    def build(cls, classes: Iterable[type]) -> Schema:
        """Collect the fields of ``classes``.

        A key declared by several classes must agree on type and default; a conflict is
        an error naming both classes.
        """
        schema = cls()
        for klass in classes:
            schema.add_class(klass)
        return schema

    def add_class(self, klass: type) -> None:
        for spec in declared_fields(klass):
            self.add(spec)

    def add(self, spec: FieldSpec) -> None:
        existing = self._fields.get(spec.key)
        if existing is None:
            self._check_prefix_clash(spec.key)
            self._fields[spec.key] = spec
            cut = spec.key.rfind("/")
            while cut > 0:
                self._sections.setdefault(spec.key[:cut], spec.key)
                cut = spec.key.rfind("/", 0, cut)
            self._owners[spec.key] = [spec.owner]
            return
        if spec.owner not in self._owners[spec.key]:
            self._owners[spec.key].append(spec.owner)
        if not existing.constraints.any and spec.constraints.any:  # one declaration's bounds hold for the key
            existing = self._fields[spec.key] = dataclasses.replace(existing, constraints=spec.constraints)
        if existing.path is None and spec.path is not None:  # so does one declaration's path kind
            self._fields[spec.key] = dataclasses.replace(existing, path=spec.path)
        if not same_type(existing.type, spec.type):
            raise ConfigError(
                f"configuration key {spec.key!r} has type {type_name(existing.type)} in "
                f"{existing.owner_name} but {type_name(spec.type)} in {spec.owner_name}; "
                "give both fields the same type or different keys"
            )
        if not _same_default(existing.default, spec.default):
            raise ConfigError(
                f"configuration key {spec.key!r} has default {_show(existing.default)} in "
                f"{existing.owner_name} but {_show(spec.default)} in {spec.owner_name}; "
                "make the defaults agree or use different keys"
            )

    def _check_prefix_clash(self, key: str) -> None:
        other = self._sections.get(key)
        cut = key.rfind("/")
        while other is None and cut > 0:
            other = key[:cut] if key[:cut] in self._fields else None
            cut = key.rfind("/", 0, cut)
        if other is not None:
            raise ConfigError(
                f"configuration key {key!r} clashes with {other!r} "
                f"(declared by {self._fields[other].owner_name}): a key cannot be both "
                "a value and a section"
            )

    def __contains__(self, key: object) -> bool:
        return key in self._fields

    def __getitem__(self, key: str) -> FieldSpec:
        return self._fields[key]

    def __iter__(self) -> Iterator[FieldSpec]:
        return iter(sorted(self._fields.values(), key=lambda s: s.key))

    def __len__(self) -> int:
        return len(self._fields)

    def keys(self) -> list[str]:
        return sorted(self._fields)

    def owners(self, key: str) -> list[type]:
        return list(self._owners.get(key, []))

    def with_defaults(self, defaults: Mapping[str, Any], owner: type) -> Schema:
        """A copy in which ``owner`` (e.g. a job) replaces the defaults of some keys."""
        schema = Schema()
        schema._fields = dict(self._fields)
        schema._owners = {k: list(v) for k, v in self._owners.items()}
        schema._sections = dict(self._sections)
        for key, value in defaults.items():
            if key not in schema._fields:
                raise ConfigError(
                    f"{owner.__qualname__}.DEFAULTS sets {key!r}, which is not a configuration key of the job"
                    f"{self.suggest(key)}"
                )
            spec = schema._fields[key]
            schema._fields[key] = dataclasses.replace(spec, default=coerce(value, spec.type, key))
        return schema

    def defaults(self) -> dict[str, Any]:
        """Flat ``{key: default}``; required keys map to ``MISSING``."""
        return {spec.key: spec.default for spec in self}

    def violations(self, values: Mapping[str, Any]) -> list[str]:
        """One line per value that breaks its key's constraints (min/max/above/below/choices)."""
        found = []
        for key, value in values.items():
            spec = self._fields.get(key)
            problem = spec.constraints.violation(key, value) if spec is not None else None
            if problem:
                found.append(problem)
        return found

    def suggest(self, key: str) -> str:
        """A "did you mean" hint for an unknown key ("" if nothing is close)."""
        normalized = key.replace(".", "/")
        close = difflib.get_close_matches(normalized, self.keys(), n=1, cutoff=0.6)
        if not close:
            leaf = normalized.rsplit("/", 1)[-1]
            close = [k for k in self.keys() if k.rsplit("/", 1)[-1] == leaf][:1]
        return f"; did you mean {close[0]!r}?" if close else ""


def _same_default(a: Any, b: Any) -> bool:
    if a is MISSING or b is MISSING:
        return a is b
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _show(value: Any) -> str:
    return "<required>" if value is MISSING else repr(value)
