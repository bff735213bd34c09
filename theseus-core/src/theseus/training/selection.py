"""Choosing a run's model, optimizer, schedule, data, evaluations, analyses and objective by registered name.

A trainer's declarations (``MODEL``, ``OPTIMIZER``, ...) are the defaults. A run selects other
registered components with ``model=llama``, ``optimizer=lion``, ``schedule=cosine``,
``dataset=fineweb:0.8,python-stdlib:0.2[:style]``, ``evaluation=a,b`` and ``analysis=a,b``
(empty to disable), ``environment=countdown`` (trainers that declare an ``ENVIRONMENT``),
``objective=cross_entropy`` (trainers whose ``OBJECTIVE`` is selectable), or in YAML
under ``select:``. The run then uses a subclass of the trainer
with those declarations replaced, so the schema follows the selection.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.config import Schema, field
from theseus.errors import ConfigError, TheseusError
from theseus.training import declarations
from theseus.training.sources import INIT_FROM, source_model_class

SECTION = "select"
#: Selection kinds and the trainer declaration each replaces.
DECLARATIONS: dict[str, str] = {
    "model": "MODEL",
    "optimizer": "OPTIMIZER",
    "schedule": "SCHEDULE",
    "dataset": "DATASET",
    "evaluation": "EVALUATION",
    "analysis": "ANALYSIS",
    "environment": "ENVIRONMENT",  # reinforcement-learning trainers only: those that declare it
    "objective": "OBJECTIVE",  # trainers whose OBJECTIVE is selectable
}
KINDS = tuple(DECLARATIONS)
#: Kinds that take a comma-separated list of names.
MULTIPLE = ("dataset", "evaluation", "analysis")
#: Kinds whose component keys live under ``<section>/<name>/``.
KEY_SECTIONS = {"optimizer": "optimizer", "schedule": "schedule", "evaluation": "evaluation", "analysis": "analysis"}
KEY_SECTIONS["dataset"] = "data"
KEY_SECTIONS["environment"] = "environment"
KEY_SECTIONS["objective"] = "objective"
#: Kinds a trainer declares only when its declaration is not None.
OPTIONAL = ("objective",)
PLURAL = {"analysis": "analyses"}


def key(kind: str) -> str:
    """The configuration key of a selection (``select/optimizer``)."""
    return f"{SECTION}/{kind}"


@dataclass
class Selection:
    """The selection keys of every trainer (their defaults are the trainer's declarations)."""

    model: str = field("select/model", default="", help="model by registered name (model=llama)")
    optimizer: str = field("select/optimizer", default="", help="optimizer by registered name (optimizer=lion)")
    schedule: str = field(
        "select/schedule", default="", help="learning-rate schedule by registered name ('' = constant lr)"
    )
    dataset: str = field(
        "select/dataset",
        default="",
        help="training data: name[:rate[:style]], comma-separated for a mixture (fineweb:0.8,python-stdlib:0.2)",
    )
    evaluation: str = field("select/evaluation", default="", help="evaluations by name, comma-separated ('' = none)")
    analysis: str = field("select/analysis", default="", help="analyses by name, comma-separated ('' = none)")


@dataclass
class ObjectiveSelection:
    """The selection key of a trainer whose ``OBJECTIVE`` is selectable."""

    objective: str = field(
        "select/objective", default="", help="training objective by registered name (objective=cross_entropy)"
    )


# -- names of declarations -----------------------------------------------------------------


def _registry() -> Any:
    from theseus.registry import get_registry

    return get_registry()


def registered_name(kind: str, obj: Any) -> str:
    """The registered name of a declared object, else its qualified name (a string stays as it is)."""
    if isinstance(obj, str):
        return obj.removeprefix(kind + "/")
    target = f"{getattr(obj, '__module__', '')}:{getattr(obj, '__qualname__', '')}"
    name = getattr(obj, "name", None)
    for entry in _registry().components_of(kind):
        if entry.target == target or (entry.obj if entry.obj is not None else _imported(entry.target)) is obj:
            return str(entry.name)
        if isinstance(name, str) and entry.name == name and not isinstance(obj, type):
            return name  # an Optimizer/Schedule container registered under its own name
    if isinstance(obj, type):
        return f"{obj.__module__}.{obj.__qualname__}"
    return name if isinstance(name, str) else repr(obj)


def _imported(target: str) -> Any:
    """The object ``module:attribute`` names if its module is already imported (never imports)."""
    module_name, _, attribute = target.partition(":")
    obj: Any = sys.modules.get(module_name)
    for part in filter(None, attribute.split(".")):
        obj = getattr(obj, part, None)
    return obj


def describe(kind: str, declaration: Any) -> str:
    """A declaration as the text a user would select it with."""
    if kind == "dataset":
        if not declarations.as_list(declaration):
            return ""
        from theseus.training.flywheel.strategy import strategy_of

        parts = []
        for sampling in strategy_of(declaration):
            name = registered_name("dataset", sampling.dataset)
            style = f":{sampling.style}" if sampling.style else ""
            parts.append(f"{name}:{sampling.rate:g}{style}")
        return ",".join(parts)
    if kind in MULTIPLE:
        return ",".join(registered_name(kind, entry) for entry in declarations.as_list(declaration))
    if kind == "optimizer" and declaration is None:
        return "adamw"
    return "" if declaration is None else registered_name(kind, declaration)


def declared(cls: type) -> dict[str, str]:
    """``{select/<kind>: text}`` of a trainer's declarations (the kinds it declares)."""
    return {key(kind): describe(kind, getattr(cls, attr)) for kind, attr in DECLARATIONS.items() if declares(cls, kind)}


def declares(cls: type, kind: str) -> bool:
    """Whether a trainer declares ``kind`` (has its attribute; not None for :data:`OPTIONAL` kinds)."""
    attr = DECLARATIONS[kind]
    if not hasattr(cls, attr) or (kind in OPTIONAL and getattr(cls, attr) is None):
        return False
    if kind == "objective":  # an objective bound to its trainer takes no objective= (Objective.selectable)
        from theseus.training.declarations import resolve

        return bool(getattr(resolve(kind, getattr(cls, attr)), "selectable", True))
    return True


def schema_of(cls: Any) -> Schema:
    """A trainer's schema: its selection keys (defaults = its declarations) and ``config()``."""
    schema = Schema.build([Selection, *cls.config()]).with_defaults(declared(cls), owner=cls)
    return schema.with_defaults(cls.DEFAULTS, owner=cls)


# -- reading selections ------------------------------------------------------------------


def normalize(values: Mapping[str, Any]) -> dict[str, Any]:
    """Bare ``optimizer=...`` keys become ``select/optimizer``; lists become comma-separated text."""
    normalized: dict[str, Any] = {}
    for name, value in values.items():
        target = key(name) if name in DECLARATIONS else name
        if target.startswith(SECTION + "/") and target.removeprefix(SECTION + "/") in DECLARATIONS:
            value = _as_text(target, value)
            if target in normalized and normalized[target] != value:
                raise ConfigError(f"{target} is given twice ({normalized[target]!r} and {value!r}); keep one")
        normalized[target] = value
    return normalized


def _as_text(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return ",".join(_as_text(name, v) for v in value)
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value).strip()
    raise ConfigError(f"{name}: expected a name (or comma-separated names), got {value!r}")


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def unknown_name(kind: str, name: str, how: str) -> ConfigError:
    """'unknown optimizer ...; did you mean ...? registered optimizers: ... (distribution)'."""
    entries = _registry().components_of(kind)
    names = [e.name for e in entries]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"did you mean {close[0]!r}? " if close else ""
    by_provider: dict[str, list[str]] = {}
    for entry in entries:
        by_provider.setdefault(entry.distribution, []).append(entry.name)
    listed = "; ".join(f"{', '.join(sorted(n))} ({dist})" for dist, n in sorted(by_provider.items())) or "none"
    return ConfigError(f"unknown {kind} {name!r} ({how}); {hint}registered {PLURAL.get(kind, kind + 's')}: {listed}")


def load(kind: str, name: str, how: str) -> Any:
    """The component registered as ``kind/name``; an unknown name lists what is registered."""
    registry = _registry()
    if (kind, name) not in registry.components and f"{kind}/{name}" not in registry.blocked_entries:
        raise unknown_name(kind, name, how)
    return registry.load_component(kind, name)  # conflicts and blocked providers are PluginErrors


def parse(kind: str, text: str) -> Any:
    """The declaration a selection text stands for (components loaded from the registry)."""
    how = f"{kind}={text}"
    if kind == "dataset":
        return _parse_dataset(text, how)
    if kind in MULTIPLE:
        return [load(kind, name, how) for name in _names(text)]
    if not text:
        if kind == "schedule":
            return None
        raise ConfigError(f"{kind}= needs a registered name; list them with 'theseus components --kind {kind}'")
    return load(kind, text, how)


def _parse_dataset(text: str, how: str) -> list[Any]:
    from theseus.training.flywheel.strategy import Sampling, strategy_of

    entries = _names(text)
    if not entries:
        return []
    items: list[Any] = []
    for entry in entries:
        name, *rest = entry.split(":")
        if len(rest) > 2:
            raise ConfigError(f"dataset entry {entry!r} ({how}) is not name[:rate[:style]], e.g. fineweb:0.8:pmd")
        _check_dataset(name, how)
        if not rest:
            items.append(name)
            continue
        try:
            rate = float(rest[0])
        except ValueError:
            raise ConfigError(f"dataset entry {entry!r} ({how}): the rate {rest[0]!r} is not a number") from None
        style = rest[1] if len(rest) == 2 and rest[1] else None
        try:
            items.append(Sampling(name, rate, style))
        except TheseusError as exc:
            raise ConfigError(f"{exc} ({how})") from None
    try:
        strategy_of(items)  # rates above 0 that sum to 1
    except TheseusError as exc:
        raise ConfigError(f"{exc} ({how})") from None
    return items


def _check_dataset(name: str, how: str) -> None:
    """A registered dataset, or a folder prepared under another name (``data/name=``) that is not a
    near miss of a registered one (a typo gets "did you mean")."""
    registry = _registry()
    if ("dataset", name) in registry.components or f"dataset/{name}" in registry.blocked_entries:
        registry.load_component("dataset", name)
        return
    names = [e.name for e in registry.components_of("dataset")]
    if not name or difflib.get_close_matches(name, names, n=1, cutoff=0.75):
        raise unknown_name("dataset", name, how)


# -- applying them -----------------------------------------------------------------------


def select(
    cls: Any, file_values: Mapping[str, Any], overrides: Mapping[str, Any], root: Path | None = None
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """The trainer class a run's values select, with the values' selection keys normalized.

    Returns ``cls`` itself when nothing differs from its declarations; otherwise a subclass
    (same name and module) whose declarations are the selected components. Keys of components
    that are not selected are reported here, one line each naming the owner and the selection.
    A run that selects no model and starts from ``training/init_from`` trains the model its source
    holds (runs are found under ``root``).
    """
    file_values, overrides = normalize(file_values), normalize(overrides)
    defaults = declared(cls)
    inferred = model_of_source(cls, {**file_values, **overrides}, defaults, root)
    if inferred is not None:
        overrides = {**overrides, key("model"): inferred}
    given = {**file_values, **overrides}
    texts = {kind: defaults.get(key(kind), "") for kind in KINDS}
    replaced: dict[str, Any] = {}
    for kind in KINDS:
        text = given.get(key(kind))
        if key(kind) not in defaults and text is not None:
            job = getattr(cls, "JOB_KEY", None) or cls.__name__
            raise ConfigError(f"{job} has no {kind} to select; {kind}= applies to the jobs that declare one")
        if text is None or text == "???" or text == defaults[key(kind)]:
            continue
        check_allowed(cls, kind, text)
        replaced[DECLARATIONS[kind]] = parse(kind, text)
        texts[kind] = text
    chosen = with_declarations(cls, replaced) if replaced else cls
    schema = Schema.build([Selection, *chosen.config()])
    for name in given:
        if name not in schema:
            owner = owner_of(name, cls, texts)
            if owner is not None:
                raise ConfigError(owner)
    return chosen, file_values, overrides


def model_of_source(cls: Any, given: Mapping[str, Any], defaults: Mapping[str, str], root: Path | None) -> str | None:
    """The registered name of the model that ``training/init_from``'s source holds, when a run of a
    trainer that declares a model selects none and the declared model is not that model (or a
    subclass of it, which the source initialises as it is); None otherwise, or when the source cannot
    tell (opening it later says why)."""
    spec = given.get(INIT_FROM)
    if root is None or key("model") in given or key("model") not in defaults or not isinstance(spec, str) or not spec:
        return None
    target = source_model_class(spec, Path(root))
    if not target:
        return None
    entries = _registry().components_of("model")
    for entry in entries:  # a model registered under the very class the source records (a plugin's too)
        if entry.target == target:
            return None if entry.name == defaults[key("model")] else str(entry.name)
    module, _, attribute = target.partition(":")
    if not module.startswith("theseus."):
        return None  # a class a record names is imported only from theseus' own packages
    try:
        source_cls = getattr(importlib.import_module(module), attribute)
        declared_cls = declarations.resolve("model", cls.MODEL)
    except (ImportError, AttributeError, TheseusError):
        return None
    if isinstance(declared_cls, type) and isinstance(source_cls, type) and issubclass(declared_cls, source_cls):
        return None
    name = registered_name("model", source_cls)
    return name if name in {entry.name for entry in entries} else None


def with_declarations(cls: Any, replaced: Mapping[str, Any]) -> Any:
    """A subclass of ``cls`` with some declarations replaced (same name, module and job key)."""
    attributes: dict[str, Any] = {
        **replaced,
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
    }
    if "JOB_KEY" in cls.__dict__:
        attributes["JOB_KEY"] = cls.__dict__["JOB_KEY"]
    chosen: Any = type(cls.__name__, (cls,), attributes)
    keys = Schema.build(chosen.config())
    chosen.DEFAULTS = {k: v for k, v in cls.DEFAULTS.items() if k in keys}  # type: ignore[attr-defined]
    return chosen


def check_allowed(cls: Any, kind: str, text: str) -> None:
    """A trainer's ``ACCEPTS = {"model": ["gpt", "llama"]}`` limits what a run may select."""
    accepted = dict(getattr(cls, "ACCEPTS", {}) or {}).get(kind)
    if accepted is None:
        return
    allowed = [str(a) for a in accepted]
    names = [n.split(":", 1)[0] for n in _names(text)] if kind in MULTIPLE else [text]
    for name in names:
        if name not in allowed:
            job = getattr(cls, "JOB_KEY", None) or cls.__name__
            raise ConfigError(
                f"{job} does not accept {kind} {name!r}; it accepts: {', '.join(allowed) or 'none'} "
                f"(its ACCEPTS declaration)"
            )


def owner_of(name: str, cls: Any, texts: Mapping[str, str]) -> str | None:
    """'<key> belongs to optimizer 'adamw'; this run selects 'lion'' for a key of an unselected component."""
    found = _owner_by_section(name) or _owner_by_declaration(name, cls) or _owner_among_models(name, texts)
    if found is None:
        return None
    kind, owner = found
    if kind == "models":  # several models declare the key, none of them selected
        selected = texts.get("model", "")
        return f"{name} belongs to models {owner}; this run selects {selected!r} (model={selected})"
    selected = texts.get(kind, "")
    if kind in MULTIPLE:
        chosen = [n.split(":", 1)[0] for n in _names(selected)]
        if owner in chosen:
            return None
        shown = ", ".join(repr(n) for n in chosen) or "none"
    else:
        if owner == selected:
            return None
        shown = repr(selected) if selected else "none"
    return f"{name} belongs to {kind} {owner!r}; this run selects {shown} ({kind}={selected})"


def _owner_by_section(name: str) -> tuple[str, str] | None:
    parts = name.split("/")
    if len(parts) < 3:
        return None
    registry = _registry()
    for kind, section in KEY_SECTIONS.items():
        if parts[0] == section and (kind, parts[1]) in registry.components:
            return kind, parts[1]
    return None


def _owner_by_declaration(name: str, cls: Any) -> tuple[str, str] | None:
    for kind, attr in DECLARATIONS.items():
        if kind == "dataset":
            owners = [(s.dataset, _dataset_classes(s.dataset_class())) for s in _samplings(getattr(cls, attr, None))]
        else:
            owners = []
            for entry in declarations.as_list(getattr(cls, attr, None)):
                try:
                    owners.append((entry, declarations.contributed_classes(declarations.resolve(kind, entry))))
                except TheseusError:
                    continue  # an unusable declaration is reported when the job is set up
        for entry, classes in owners:
            if any(spec.key == name for klass in classes for spec in _fields(klass)):
                return kind, registered_name(kind, entry)
    return None


#: How many of the models declaring a key an error names before "and N more".
SHOWN_OWNERS = 4


def _owner_among_models(name: str, texts: Mapping[str, str]) -> tuple[str, str] | None:
    """The other registered models declaring ``name``, sorted (loaded only on this error path): one
    name, or ``'a', 'b' and 3 more`` when several models share the key."""
    if not name.startswith(("architecture/", "model/")):
        return None
    owners = []
    for entry in _registry().components_of("model"):
        if entry.name == texts.get("model"):
            continue
        try:
            classes = declarations.contributed_classes(entry.load())
        except TheseusError:
            continue  # a broken plugin is reported elsewhere
        if any(spec.key == name for klass in classes for spec in _fields(klass)):
            owners.append(str(entry.name))
    if not owners:
        return None
    owners.sort()
    if len(owners) == 1:
        return "model", owners[0]
    shown = ", ".join(repr(owner) for owner in owners[:SHOWN_OWNERS])
    more = len(owners) - SHOWN_OWNERS
    return "models", shown + (f" and {more} more" if more > 0 else "")


def _samplings(declaration: Any) -> list[Any]:
    if not declarations.as_list(declaration):
        return []
    from theseus.training.flywheel.strategy import strategy_of

    return list(strategy_of(declaration))


def _dataset_classes(obj: Any) -> list[type]:
    return [obj] if isinstance(obj, type) and dataclasses.is_dataclass(obj) else []


def _fields(klass: type) -> list[Any]:
    from theseus.config import declared_fields

    return declared_fields(klass)


# -- records -----------------------------------------------------------------------------


def of_configuration(values: Mapping[str, Any]) -> dict[str, str]:
    """``{kind: text}`` of the selection keys in a (flat) configuration."""
    return {kind: str(values[key(kind)]) for kind in KINDS if key(kind) in values}


#: Keys that lay the optimizer state out (its checkpointed tree), with the value a run that predates them had.
STATE_LAYOUT_KEYS = {"optimizer/state_dtype": "float32", "optimizer/offload": False}


def check_resume(previous: Mapping[str, Any] | None, current: Mapping[str, Any], run: str) -> None:
    """A run resumes only with the selection and the optimizer-state layout it started with; a change is one
    line naming both."""
    if not previous:
        return
    before, now = of_configuration(previous), of_configuration(current)
    for kind in KINDS:
        if kind in before and kind in now and before[kind] != now[kind]:
            raise ConfigError(
                f"run {run!r} was started with {kind}={before[kind]!r}; this run selects {kind}={now[kind]!r}; "
                f"resume with {kind}={before[kind]}, or start a new run with run/name=<new name>"
            )
    for name, default in STATE_LAYOUT_KEYS.items():
        was, is_now = previous.get(name, default), current.get(name, default)
        if name in current and was != is_now:
            raise ConfigError(
                f"run {run!r} was started with {name}={was}; its checkpoints hold the optimizer state that way, "
                f"and this run sets {name}={is_now}; resume with {name}={was}, or start a new run with "
                "run/name=<new name>"
            )
