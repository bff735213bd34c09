"""``theseus components KIND/NAME``: a component's configuration keys, read from its source.

The source files are parsed, never imported, so this stays fast and does not load jax: the
``field()`` declarations of the component's configuration class (optimizers and schedules),
of the class itself and its bases (datasets, evaluations, analyses), and, for models, of the
child types listed by ``components()``, followed recursively; a declaration through a helper function
that returns ``field(...)`` (``optional_key(key, what)``) is read through it, its arguments bound. Keys,
defaults, choices, bounds and help given by module-level constants (``choices=("", *EXTRACT_MODES)``,
``default=DEFAULT_TAG``, imports followed) are shown as their values.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from theseus.registry import Registry


@dataclass
class KeyRow:
    key: str
    type: str
    default: str
    help: str


class SourceIndex:
    """Parsed modules found on ``sys.path`` without importing them (nor their packages)."""

    def __init__(self) -> None:
        self._trees: dict[str, ast.Module | None] = {}
        self._packages: set[str] = set()

    def module(self, name: str) -> ast.Module | None:
        if name not in self._trees:
            path = self._locate(name)
            try:
                self._trees[name] = ast.parse(path.read_text(encoding="utf-8")) if path is not None else None
            except (OSError, SyntaxError, ValueError):
                self._trees[name] = None
        return self._trees[name]

    def _locate(self, name: str) -> Path | None:
        top, *rest = name.split(".")
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None:
            return None
        if not rest:
            return Path(spec.origin) if spec.origin and spec.origin.endswith(".py") else None
        locations = [Path(p) for p in (spec.submodule_search_locations or [])]
        for index, part in enumerate(rest):
            last = index == len(rest) - 1
            found: list[Path] = []
            for location in locations:
                package = location / part
                if last and (location / f"{part}.py").is_file():
                    return location / f"{part}.py"
                if package.is_dir():
                    if last and (package / "__init__.py").is_file():
                        self._packages.add(name)
                        return package / "__init__.py"
                    found.append(package)
            locations = found
        return None

    def is_package(self, name: str) -> bool:
        self.module(name)
        return name in self._packages

    def resolve(self, module: str, attribute: str, depth: int = 0) -> tuple[str, ast.AST] | None:
        """The definition of ``module.attribute``, following ``from x import y`` re-exports."""
        tree = self.module(module)
        if tree is None or depth > 8:
            return None
        head, _, tail = attribute.partition(".")
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == head:
                return (module, node) if not tail else None
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == head:
                return (module, node) if not tail else None  # a function component (a reward) has no keys
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == head for t in node.targets):
                return module, node.value
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == head:
                return (module, node.value) if node.value is not None else None
        for node in _imports_of(tree):
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(module, node)
                for alias in node.names:
                    if (alias.asname or alias.name) == head:
                        target = f"{alias.name}.{tail}" if tail else alias.name
                        return self.resolve(source, target, depth + 1)
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname == head and tail:
                        return self.resolve(alias.name, tail, depth + 1)
        return None

    def _absolute(self, module: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = module.split(".")
        base = parts if self.is_package(module) else parts[:-1]
        base = base[: len(base) - (node.level - 1)]
        return ".".join([*base, node.module] if node.module else base)


def _imports_of(tree: ast.Module) -> list[ast.stmt]:
    """The module's top-level statements and those under ``if TYPE_CHECKING:``, where a package that
    imports its names lazily (a module ``__getattr__``) says where each comes from."""
    statements = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and _dotted(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
            statements += node.body
    return statements


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _constant(node: ast.AST | None) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return ast.unparse(node) if node is not None else ""


class Unresolved(Exception):
    """An expression whose value cannot be known without running code."""


#: Arithmetic that constant expressions may use (``2**31``, ``-1``, ``1 / 3``).
_OPERATORS: dict[type, Any] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
}


def literal(
    index: SourceIndex, module: str, node: ast.AST, depth: int = 0, local: Mapping[str, Any] | None = None
) -> Any:
    """The value of a constant expression in ``module``: literals, tuples, lists and dicts (``*`` unpacking
    included), names of module-level constants (imports followed) or of ``local`` values, subscripts,
    signs, arithmetic and f-strings of such values; ``Unresolved`` for anything else."""
    if depth > 16:
        raise Unresolved
    local = local or {}

    def value(of: ast.AST) -> Any:
        return literal(index, module, of, depth + 1, local)

    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                items.extend(value(element.value))
            else:
                items.append(value(element))
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Dict) and None not in node.keys:
        return {value(key): value(item) for key, item in zip(node.keys, node.values, strict=True) if key}
    if isinstance(node, ast.Subscript):
        try:
            return value(node.value)[value(node.slice)]
        except (KeyError, IndexError, TypeError):
            raise Unresolved from None
    if isinstance(node, ast.Name) and node.id in local:
        return local[node.id]
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords:
        return _call(index, module, node, depth, local)
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        found = index.resolve(module, name) if name else None
        if found is None or isinstance(found[1], (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            raise Unresolved
        return literal(index, found[0], found[1], depth + 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = value(node.operand)
        if not isinstance(operand, (int, float)):
            raise Unresolved
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Pow) and isinstance(right, int) and 0 <= right <= 256:
            return left**right
        operator = _OPERATORS.get(type(node.op))
        if operator is None:
            raise Unresolved
        try:
            return operator(left, right)
        except (TypeError, ArithmeticError):
            raise Unresolved from None
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                conversions: dict[int, Callable[[Any], Any]] = {ord("r"): repr, ord("a"): ascii, ord("s"): str}
                shown = conversions.get(part.conversion, lambda v: v)(value(part.value))
                parts.append(format(shown, value(part.format_spec) if part.format_spec else ""))
            else:
                parts.append(value(part))
        return "".join(parts)
    raise Unresolved


#: Calls of one iterable that constant expressions may use (``tuple(ACTIVATIONS)``; ``", ".join(NAMES)``).
_CALLS: dict[str, Callable[[Any], Any]] = {"tuple": tuple, "list": list, "sorted": sorted}


def _call(index: SourceIndex, module: str, node: ast.Call, depth: int, local: Mapping[str, Any]) -> Any:
    """``tuple(x)``, ``list(x)``, ``sorted(x)`` or ``"sep".join(x)`` of a constant iterable ``x``; a
    module-level dict literal iterates over its keys, whatever its values are."""
    function = node.func
    if isinstance(function, ast.Name) and function.id in _CALLS:
        apply = _CALLS[function.id]
    elif isinstance(function, ast.Attribute) and function.attr == "join" and _text(function.value) is not None:
        apply = str(_text(function.value)).join
    else:
        raise Unresolved
    name = _dotted(node.args[0])
    found = index.resolve(module, name) if name and name not in local else None
    if found is not None and isinstance(found[1], ast.Dict) and None not in found[1].keys:
        items = [literal(index, found[0], key, depth + 1) for key in found[1].keys if key is not None]
    else:
        items = literal(index, module, node.args[0], depth + 1, local)
    try:
        return apply(items)
    except TypeError:
        raise Unresolved from None


def _choice(value: Any) -> str:
    """A choice as the help shows it: a word as it is, the empty string as ``''``."""
    return value if isinstance(value, str) and value else repr(value)


class KeyCollector:
    """Collects the ``field()`` keys reachable from a component's definition."""

    def __init__(self, index: SourceIndex) -> None:
        self.index = index
        self.rows: dict[str, KeyRow] = {}
        self._seen: set[tuple[object, ...]] = set()

    def from_definition(self, module: str, node: ast.AST) -> None:
        if isinstance(node, ast.ClassDef):
            self.from_class(module, node)
        elif isinstance(node, ast.Call):  # Optimizer("name", Config, factory) and the like
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self._from_reference(module, arg)

    def _from_reference(self, module: str, node: ast.AST) -> None:
        name = _dotted(node)
        if name is None:
            return
        found = self.index.resolve(module, name)
        if found is not None and isinstance(found[1], ast.ClassDef):
            self.from_class(*found)  # type: ignore[arg-type]

    def from_class(
        self, module: str, node: ast.ClassDef, inherited: dict[str, tuple[str, ast.expr]] | None = None
    ) -> None:
        """Fields of ``node`` and its bases; ``inherited`` holds a subclass's class attributes
        (``BLOCK = ScaledBlock``), which a base's ``components()`` sees through ``cls``."""
        attributes = {**_class_attributes(module, node), **(inherited or {})}
        marker = (module, node.name, tuple(sorted((k, id(v[1])) for k, v in attributes.items())))
        if marker in self._seen:
            return
        self._seen.add(marker)
        for base in node.bases:
            name = _dotted(base)
            found = self.index.resolve(module, name) if name else None
            if found is not None and isinstance(found[1], ast.ClassDef):
                self.from_class(found[0], found[1], attributes)
        for statement in node.body:
            if isinstance(statement, ast.AnnAssign) and isinstance(statement.value, ast.Call):
                self._field(module, statement)
        for child in self._components(module, node, attributes):
            self._from_reference(*child)

    def _value(self, module: str, node: ast.AST, local: Mapping[str, Any] | None = None) -> Any:
        """The value of ``node`` (see :func:`literal`); ``Unresolved`` when it is not a constant."""
        return literal(self.index, module, node, local=local)

    def _shown(self, module: str, node: ast.AST, show: Any = repr, local: Mapping[str, Any] | None = None) -> str:
        """``node``'s value as ``show`` writes it, else its source text."""
        try:
            return str(show(self._value(module, node, local)))
        except Unresolved:
            return _constant(node)

    def _field(self, module: str, statement: ast.AnnAssign) -> None:
        assert isinstance(statement.value, ast.Call)
        found = self._field_call(module, statement.value, {}, 0)
        if found is None:
            return
        where, call, local = found
        try:
            key = self._value(where, call.args[0], local)
        except Unresolved:
            return
        if not isinstance(key, str):
            return
        keywords = self._keywords(where, call, local)

        def shown(name: str, show: Any = repr) -> str:
            place, node = keywords[name]
            return self._shown(place, node, show, local if place == where else None)

        if "default" in keywords:
            default = shown("default")
        elif "default_factory" in keywords:
            default = f"{_constant(keywords['default_factory'][1])}()"
        else:
            default = "<required>"
        bounds = [
            f"{sign} {shown(name)}"
            for name, sign in (("min", ">="), ("above", ">"), ("max", "<="), ("below", "<"))
            if name in keywords and shown(name) != "None"  # min=None: no bound
        ]
        if "choices" in keywords:
            place, node = keywords["choices"]
            try:
                choices = self._value(place, node, local if place == where else None)
                bounds.append("one of " + ", ".join(_choice(c) for c in choices))
            except (Unresolved, TypeError):
                bounds.append(f"one of {_constant(node)}")
        text = shown("help", str) if "help" in keywords else ""
        if bounds:
            text = f"{text} [{' and '.join(bounds)}]".strip()
        self.rows.setdefault(key, KeyRow(key, ast.unparse(statement.annotation), default, text))

    def _keywords(self, module: str, call: ast.Call, local: Mapping[str, Any]) -> dict[str, tuple[str, ast.AST]]:
        """``call``'s keywords as (module, expression), ``**TABLE[name]`` unpacked where ``TABLE`` is a
        module-level dict literal and ``name`` a constant (each entry read in the table's module)."""
        found: dict[str, tuple[str, ast.AST]] = {}
        for keyword in call.keywords:
            if keyword.arg is not None:
                found[keyword.arg] = (module, keyword.value)
                continue
            entry = self._dict_entry(module, keyword.value, local)
            if entry is not None:
                place, table = entry
                for name, value in zip(table.keys, table.values, strict=True):
                    text = _text(name)
                    if text is not None:
                        found[text] = (place, value)
        return found

    def _dict_entry(self, module: str, node: ast.AST, local: Mapping[str, Any]) -> tuple[str, ast.Dict] | None:
        """The dict literal ``node`` names: ``TABLE[key]`` of a module-level dict of dict literals."""
        if not isinstance(node, ast.Subscript):
            return None
        name = _dotted(node.value)
        found = self.index.resolve(module, name) if name else None
        try:
            key = self._value(module, node.slice, local)
        except Unresolved:
            return None
        if found is None or not isinstance(found[1], ast.Dict):
            return None
        for candidate, value in zip(found[1].keys, found[1].values, strict=True):
            if candidate is not None and _text(candidate) == key and isinstance(value, ast.Dict):
                return found[0], value
        return None

    def _field_call(
        self, module: str, call: ast.Call, local: dict[str, Any], depth: int
    ) -> tuple[str, ast.Call, dict[str, Any]] | None:
        """The ``field(key, ...)`` call that ``call`` makes, directly or through helper functions returning one
        (``optional_key(key, what)``, ``mamba_key(name)``), with the helper's arguments bound as local values:
        (its module, the call, the values). None for anything else."""
        name = _dotted(call.func)
        if name is None or depth > 4 or not call.args:
            return None
        if name.rsplit(".", 1)[-1] == "field":
            return module, call, local
        found = self.index.resolve(module, name)
        where, helper = found or ("", None)
        if not isinstance(helper, ast.FunctionDef):
            return None
        bound = self._bind(module, call, local, where, helper)
        if bound is None:
            return None
        for statement in helper.body:
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
                continue  # the docstring
            if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Call):
                return self._field_call(where, statement.value, bound, depth + 1)
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
                return None
            try:
                value = self._value(where, statement.value, bound)
            except Unresolved:
                return None
            if not _assign(statement.targets[0], value, bound):
                return None
        return None

    def _bind(
        self, module: str, call: ast.Call, local: dict[str, Any], where: str, helper: ast.FunctionDef
    ) -> dict[str, Any] | None:
        """``helper``'s parameters bound to ``call``'s constant arguments and its own constant defaults."""
        positional = [a.arg for a in [*helper.args.posonlyargs, *helper.args.args]]
        parameters = [*positional, *(a.arg for a in helper.args.kwonlyargs)]
        defaults = dict(
            zip(positional[len(positional) - len(helper.args.defaults) :], helper.args.defaults, strict=True)
        )
        keyword_defaults = zip(helper.args.kwonlyargs, helper.args.kw_defaults, strict=True)
        defaults.update({a.arg: d for a, d in keyword_defaults if d is not None})
        given: dict[str, ast.AST] = dict(zip(parameters, call.args, strict=False))
        given.update({k.arg: k.value for k in call.keywords if k.arg in parameters})
        bound: dict[str, Any] = {}
        try:
            for parameter in parameters:
                if parameter in given:
                    bound[parameter] = self._value(module, given[parameter], local)
                elif parameter in defaults:
                    bound[parameter] = self._value(where, defaults[parameter])
                else:
                    return None
        except Unresolved:
            return None
        return bound

    def _components(
        self, module: str, node: ast.ClassDef, attributes: dict[str, tuple[str, ast.expr]]
    ) -> list[tuple[str, ast.AST]]:
        """Names that ``components()`` returns (class attributes such as ``cls.BLOCK`` followed)."""
        method = next((s for s in node.body if isinstance(s, ast.FunctionDef) and s.name == "components"), None)
        if method is None:
            return []
        local: dict[str, ast.expr] = {}
        for statement in ast.walk(method):
            if isinstance(statement, ast.Assign):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        local[target.id] = statement.value
        found: list[tuple[str, ast.AST]] = []
        pending = [(module, r.value) for r in ast.walk(method) if isinstance(r, ast.Return) and r.value is not None]
        visited: set[int] = set()
        while pending:
            where, expression = pending.pop()
            if id(expression) in visited:
                continue
            visited.add(id(expression))
            for sub in ast.walk(expression):
                if isinstance(sub, ast.Attribute) and _dotted(sub.value) == "cls" and sub.attr in attributes:
                    pending.append(attributes[sub.attr])
                elif isinstance(sub, ast.Name) and sub.id in local and where == module:
                    pending.append((where, local.pop(sub.id)))
                elif isinstance(sub, ast.Name) and sub.id[:1].isupper():
                    found.append((where, sub))
        return found


def _text(node: ast.AST | None) -> str | None:
    """The string a constant node holds, else None."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _assign(target: ast.expr, value: Any, local: dict[str, Any]) -> bool:
    """Bind ``target = value`` (a name, or a tuple of names unpacking ``value``) in ``local``; False for any
    other target."""
    if isinstance(target, ast.Name):
        local[target.id] = value
        return True
    names = getattr(target, "elts", None)
    if names is None or not all(isinstance(n, ast.Name) for n in names) or len(names) != len(value):
        return False
    local.update(zip((n.id for n in names), value, strict=True))
    return True


def _class_attributes(module: str, node: ast.ClassDef) -> dict[str, tuple[str, ast.expr]]:
    attributes: dict[str, tuple[str, ast.expr]] = {}
    for statement in node.body:
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and statement.value is not None
            and not isinstance(statement.value, ast.Call)  # field(...) declarations are not class attributes
        ):
            attributes[statement.target.id] = (module, statement.value)
        if isinstance(statement, ast.Assign):
            for target in statement.targets:
                if isinstance(target, ast.Name):
                    attributes[target.id] = (module, statement.value)
    return attributes


def component_rows(target: str) -> list[KeyRow] | None:
    """The keys of the component at ``module:attribute`` (None when its source cannot be read)."""
    module, _, attribute = target.partition(":")
    index = SourceIndex()
    found = index.resolve(module, attribute)
    if found is None:
        return None
    collector = KeyCollector(index)
    collector.from_definition(*found)
    return sorted(collector.rows.values(), key=lambda r: r.key)


def show_component(registry: Registry, key: str) -> None:
    """Print ``kind/name``: its provider, target and configuration keys."""
    from theseus.errors import TheseusError
    from theseus.registry import COMPONENT_KINDS

    kind, _, name = key.partition("/")
    if kind not in COMPONENT_KINDS:
        raise TheseusError(f"unknown component kind {kind!r} in {key!r}; kinds are: {', '.join(COMPONENT_KINDS)}")
    if (kind, name) not in registry.components:
        from theseus.training.selection import unknown_name

        raise unknown_name(kind, name, f"theseus components {key}")
    entry = registry.component(kind, name)
    click.echo(f"{entry.key}  provided by {entry.provider}  ({entry.target})")
    rows = component_rows(entry.target)
    if rows is None:
        click.echo("its source cannot be read without importing it; 'theseus configure JOB out.yaml' lists every key")
        return
    if not rows:
        click.echo("no configuration keys")
        return
    from theseus.cli.listing import _table

    click.echo(_table([(r.key, r.type, r.default, r.help) for r in rows], ("KEY", "TYPE", "DEFAULT", "HELP")))
