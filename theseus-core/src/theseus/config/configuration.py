"""The active configuration: loading, validation, overrides, YAML, and ``configure()``."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import io
from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

from theseus.config.fields import CONSTRAINT_METADATA, KEY_METADATA, MISSING, NO_CONSTRAINTS
from theseus.config.schema import Schema
from theseus.config.types import coerce, parse_override_value, type_name
from theseus.config.yaml_limits import bounded_yaml_text
from theseus.errors import ConfigError
from theseus.files import replace_file

T = TypeVar("T")


class Configuration(Mapping[str, Any]):
    """A validated flat mapping of slash keys to values."""

    def __init__(self, values: Mapping[str, Any], schema: Schema | None = None) -> None:
        self._values = dict(values)
        self.schema = schema

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Configuration({self._values!r})"

    def __hash__(self) -> int:
        return hash(tuple(sorted((k, _freeze(v)) for k, v in self._values.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self._values) == dict(other)

    def replace(self, **values: Any) -> Configuration:
        """A copy with some values changed (keys given with ``/`` replaced by ``__``)."""
        updated = dict(self._values)
        updated.update({k.replace("__", "/"): v for k, v in values.items()})
        return Configuration(updated, self.schema)

    def with_values(self, values: Mapping[str, Any]) -> Configuration:
        updated = dict(self._values)
        updated.update(values)
        return Configuration(updated, self.schema)

    def to_nested(self) -> dict[str, Any]:
        return nest(self._values)


def _freeze(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    return value


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """``{"a/b": 1}`` -> ``{"a": {"b": 1}}``."""
    nested: dict[str, Any] = {}
    for key in sorted(flat):
        node = nested
        *parents, leaf = key.split("/")
        for part in parents:
            node = node.setdefault(part, {})
        value = flat[key]
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return nested


def flatten(nested: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``."""
    flat: dict[str, Any] = {}
    for key, value in nested.items():
        path = f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, path))
        else:
            flat[path] = value
    return flat


def read_yaml(path: str | Path) -> dict[str, Any]:
    """Read a configuration YAML file into a flat ``{key: value}`` mapping (within the bounds of
    :mod:`theseus.config.yaml_limits`)."""
    import yaml  # imported on use: listing commands never read YAML
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist; write one with 'theseus configure JOB {path}'")
    try:
        loaded = OmegaConf.load(io.StringIO(bounded_yaml_text(path)))
        container = OmegaConf.to_container(loaded, resolve=True)
    except OSError as exc:
        if exc.errno is not None:  # the file cannot be read: the machine's refusal, reported as such
            raise
        # OmegaConf refuses a file holding one scalar ("Invalid loaded object type: float")
        kind = str(exc).rpartition(": ")[2] or "scalar"
        raise ConfigError(f"config file {str(path)!r} must hold a mapping of keys to values, not a {kind}") from exc
    except MemoryError:
        raise
    except (
        yaml.YAMLError,
        OmegaConfBaseException,
        ValueError,
        RecursionError,
        LookupError,
        TypeError,
        AttributeError,
    ) as exc:
        # ValueError, LookupError, TypeError, AttributeError: the parser's constructors on bad tagged
        # scalars (``!!int ''``, ``!!timestamp x``)
        raise ConfigError(
            f"config file {str(path)!r} is not valid YAML ({_yaml_problem(exc, path)}); "
            "fix the file or regenerate it with 'theseus configure'"
        ) from exc
    if container is None:
        return {}
    if not isinstance(container, dict):
        raise ConfigError(
            f"config file {str(path)!r} must hold a mapping of keys to values, not a {type(container).__name__}"
        )
    return flatten({str(k): v for k, v in container.items()})


def _yaml_problem(exc: BaseException, path: Path) -> str:
    """What is wrong with a YAML file, and where: ``key 'training/steps' given twice, at lines 2 and 4``,
    ``a tab character at line 2, column 1; ...``, else the parser's own words and position."""
    import yaml

    if isinstance(exc, RecursionError):
        return "collections nested too deeply"
    text = path.read_text(encoding="utf-8", errors="replace")
    duplicate = _duplicate_key(text)
    if duplicate is not None:
        return duplicate
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if isinstance(exc, yaml.MarkedYAMLError) and mark is not None:
        where = f"line {mark.line + 1}, column {mark.column + 1}"
        line = text.splitlines()[mark.line] if mark.line < len(text.splitlines()) else ""
        indent = line[: len(line) - len(line.lstrip())]
        if "\t" in indent or line[mark.column : mark.column + 1] == "\t":
            return f"a tab character at {where}; YAML indents with spaces"
        return f"{problem or exc.context or type(exc).__name__} at {where}"
    first = str(exc).strip().splitlines()
    if isinstance(
        exc, (LookupError, TypeError, AttributeError)
    ):  # a constructor's own words, e.g. "string index out of range"
        return f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
    return first[0] if first else type(exc).__name__


def _duplicate_key(text: str) -> str | None:
    """``key 'a/b' given twice, at lines M and N`` for the first key repeated in one mapping."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)  # nodes only: no value is constructed
    except (yaml.YAMLError, RecursionError):
        return None
    pending: deque[tuple[yaml.Node, str]] = deque([(node, "")] if node is not None else [])
    seen_nodes: set[int] = set()  # a node that aliases share is looked at once
    while pending:
        current, prefix = pending.popleft()
        if id(current) in seen_nodes:
            continue
        seen_nodes.add(id(current))
        if isinstance(current, yaml.SequenceNode):
            pending += [(child, prefix) for child in current.value]
        if not isinstance(current, yaml.MappingNode):
            continue
        seen: dict[str, int] = {}
        for key, value in current.value:
            name = f"{prefix}{key.value}" if isinstance(key, yaml.ScalarNode) else None
            if name is not None and name in seen:
                return f"key {name!r} given twice, at lines {seen[name]} and {key.start_mark.line + 1}"
            if name is not None:
                seen[name] = key.start_mark.line + 1
                pending.append((value, f"{name}/"))
    return None


def write_yaml(values: Mapping[str, Any], path: str | Path, schema: Schema | None = None) -> Path:
    """Write a flat mapping as nested YAML (required keys without a value as ``???``)."""
    from omegaconf import OmegaConf

    path = Path(path)
    if path.parent and not path.parent.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
    flat = {k: ("???" if v is MISSING else v) for k, v in values.items()}
    text = OmegaConf.to_yaml(OmegaConf.create(nest(flat)))
    header = "# theseus configuration; edit values and pass with --config\n"
    if schema is not None:
        required = [s.key for s in schema if s.required and values.get(s.key, MISSING) is MISSING]
        if required:
            header += "# required (replace ???): " + ", ".join(required) + "\n"
    replace_file(path, header + text)
    return path


def parse_overrides(overrides: Iterable[str]) -> dict[str, Any]:
    """Parse ``key=value`` arguments (keys with ``/`` or ``.`` separators)."""
    parsed: dict[str, Any] = {}
    for item in overrides:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form key=value (e.g. training/lr=3e-4)")
        parsed[key.replace(".", "/")] = parse_override_value(value)
    return parsed


def resolve(
    schema: Schema,
    file_values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Configuration:
    """Validate values against ``schema``: defaults < file < overrides.

    Unknown keys (with a suggestion), wrong types and missing required values are
    reported as ConfigError.
    """
    values = schema.defaults()
    for source, given in (("config file", file_values or {}), ("override", overrides or {})):
        for key, value in given.items():
            if key not in schema:
                raise ConfigError(f"unknown configuration key {key!r} ({source}){schema.suggest(key)}")
            if value == "???":
                continue
            values[key] = coerce(value, schema[key].type, key)
    check_constraints(schema, values)
    missing = [k for k, v in values.items() if v is MISSING]
    if missing:
        key = missing[0]
        raise ConfigError(
            f"missing required configuration value {key!r} ({type_name(schema[key].type)}); "
            f"pass {key}=<value> or set it in the --config file"
        )
    return Configuration(values, schema)


def check_constraints(schema: Schema, values: Mapping[str, Any]) -> None:
    """Raise one ConfigError listing every value that breaks its constraints, one line each."""
    problems = schema.violations(values)
    if problems:
        raise ConfigError("\nerror: ".join(problems))


def load(
    schema: Schema,
    config_file: str | Path | None = None,
    overrides: Iterable[str] = (),
) -> Configuration:
    """Resolve a configuration from an optional YAML file and ``key=value`` overrides."""
    file_values = read_yaml(config_file) if config_file is not None else {}
    return resolve(schema, file_values, parse_overrides(overrides))


#: Modules keep the configuration they were built under in this attribute, so that
#: ``configure(Child)`` inside a lazily run Flax ``setup()`` sees the same values.
CONFIG_ATTRIBUTE = "theseus_config"

_ACTIVE: contextvars.ContextVar[Configuration | None] = contextvars.ContextVar("theseus_configuration", default=None)


def flat_values(cfg: Any, what: str = "configuration()") -> dict[str, Any]:
    """Flat ``{"a/b": value}`` from a flat mapping, a nested one shaped like the YAML, or both mixed.

    OmegaConf ``DictConfig`` objects are resolved first. Anything that cannot be read this way
    (not a mapping, a key that is not text, one key given twice) is a ConfigError.
    """
    if _is_omegaconf(cfg):
        cfg = _omegaconf_container(cfg, what)
    if not isinstance(cfg, Mapping):
        raise ConfigError(
            f"{what} needs a mapping of configuration keys to values (flat 'architecture/scale' keys or nested "
            f"like the YAML), got {type(cfg).__name__}"
        )
    flat: dict[str, Any] = {}
    _flatten_into(flat, cfg, "", what)
    return flat


def _flatten_into(flat: dict[str, Any], node: Mapping[Any, Any], prefix: str, what: str) -> None:
    for key, value in node.items():
        if not isinstance(key, str) or not key.strip("/"):
            where = f" under {prefix!r}" if prefix else ""
            raise ConfigError(
                f"{what}: key {key!r} ({type(key).__name__}){where} is not a configuration name; "
                "use names such as 'architecture' or slash paths such as 'architecture/scale'"
            )
        path = f"{prefix}/{key.strip('/')}" if prefix else key.strip("/")
        if _is_omegaconf(value):
            value = _omegaconf_container(value, what)
        if isinstance(value, Mapping) and value:
            _flatten_into(flat, value, path, what)
            continue
        if path in flat and flat[path] != value:
            raise ConfigError(f"{what}: {path!r} is given twice ({flat[path]!r} and {value!r}); keep one of them")
        flat[path] = value


def _is_omegaconf(value: Any) -> bool:
    return type(value).__module__.startswith("omegaconf")


def _omegaconf_container(value: Any, what: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        return OmegaConf.to_container(value, resolve=True)
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{what}: cannot read the OmegaConf configuration ({first}); fix the interpolation") from exc


@contextlib.contextmanager
def configuration(cfg: Configuration | Mapping[str, Any]) -> Iterator[Configuration]:
    """Make ``cfg`` the active configuration for ``configure()`` inside the block.

    ``cfg`` is a ``Configuration``, a flat mapping of slash keys (``{"architecture/scale": 3.0}``),
    or a nested mapping or OmegaConf ``DictConfig`` shaped like the YAML
    (``{"architecture": {"scale": 3.0}}``); both forms mean the same.
    """
    if not isinstance(cfg, Configuration):
        cfg = Configuration(flat_values(cfg))
    token = _ACTIVE.set(cfg)
    try:
        yield cfg
    finally:
        _ACTIVE.reset(token)


def current_configuration() -> Configuration | None:
    """The active configuration, or None outside ``with configuration(...)``."""
    return _ACTIVE.get()


def configure(cls: type[T], **overrides: Any) -> T:
    """Build ``cls`` with its ``field()`` values taken from the active configuration.

    Keys absent from the active configuration use their defaults; keyword ``overrides``
    win over both. Works for dataclasses and Flax modules (also inside ``setup()``).
    """
    if not dataclasses.is_dataclass(cls):
        raise ConfigError(f"configure() needs a dataclass or Module class, got {cls!r}")
    active: Mapping[str, Any] = current_configuration() or {}
    kwargs: dict[str, Any] = {}
    problems: list[str] = []
    for f in dataclasses.fields(cls):
        key = f.metadata.get(KEY_METADATA)
        if key is None or f.name in overrides or not f.init:
            continue
        if key in active:
            kwargs[f.name] = active[key]
            problem = f.metadata.get(CONSTRAINT_METADATA, NO_CONSTRAINTS).violation(key, active[key])
            if problem:
                problems.append(problem)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise ConfigError(
                f"missing required configuration value {key!r} for {cls.__qualname__}; pass {key}=<value>"
            )
    if problems:
        raise ConfigError("\nerror: ".join(problems))
    if CONFIG_ATTRIBUTE in {f.name for f in dataclasses.fields(cls)} and CONFIG_ATTRIBUTE not in overrides:
        kwargs[CONFIG_ATTRIBUTE] = current_configuration()
    kwargs.update(overrides)
    return cls(**kwargs)
