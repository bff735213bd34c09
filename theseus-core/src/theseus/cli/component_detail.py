"""``theseus components KIND/NAME``: a component's configuration keys, read from its source.

The source files are parsed, never imported, so this stays fast and does not load jax: the
``field()`` declarations of the component's configuration class (optimizers and schedules),
of the class itself and its bases (datasets, evaluations, analyses), and, for models, of the
child types listed by ``components()``, followed recursively. Keys, defaults, choices, bounds and
help given by module-level constants (``choices=("", *EXTRACT_MODES)``, ``default=DEFAULT_TAG``, imports
followed) are shown as their values.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from theseus.registry import Registry

#: The helper that declares a key defaulting to None (``theseus.model.layers._common.optional_key``).
OPTIONAL_KEY = "optional_key"


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


def literal(index: SourceIndex, module: str, node: ast.AST, depth: int = 0) -> Any:
    """The value of a constant expression in ``module``: literals, tuples and lists (``*`` unpacking
    included), names of module-level constants (imports followed), signs, arithmetic and f-strings of
    such values; ``Unresolved`` for anything else."""
    if depth > 16:
        raise Unresolved
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List)):
        items: list[Any] = []
        for element in node.elts:
            if isinstance(element, ast.Starred):
                items.extend(literal(index, module, element.value, depth + 1))
            else:
                items.append(literal(index, module, element, depth + 1))
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, (ast.Name, ast.Attribute)):
        name = _dotted(node)
        found = index.resolve(module, name) if name else None
        if found is None or isinstance(found[1], (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            raise Unresolved
        return literal(index, found[0], found[1], depth + 1)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal(index, module, node.operand, depth + 1)
        if not isinstance(value, (int, float)):
            raise Unresolved
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = literal(index, module, node.left, depth + 1), literal(index, module, node.right, depth + 1)
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
                value = literal(index, module, part.value, depth + 1)
                conversions: dict[int, Callable[[Any], Any]] = {ord("r"): repr, ord("a"): ascii, ord("s"): str}
                value = conversions.get(part.conversion, lambda v: v)(value)
                spec = literal(index, module, part.format_spec, depth + 1) if part.format_spec else ""
                parts.append(format(value, spec))
            else:
                parts.append(literal(index, module, part, depth + 1))
        return "".join(parts)
    raise Unresolved


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

    def _value(self, module: str, node: ast.AST) -> Any:
        """The value of ``node`` (see :func:`literal`); ``Unresolved`` when it is not a constant."""
        return literal(self.index, module, node)

    def _shown(self, module: str, node: ast.AST, show: Any = repr) -> str:
        """``node``'s value as ``show`` writes it, else its source text."""
        try:
            return str(show(self._value(module, node)))
        except Unresolved:
            return _constant(node)

    def _field(self, module: str, statement: ast.AnnAssign) -> None:
        call = statement.value
        assert isinstance(call, ast.Call)
        callee = (_dotted(call.func) or "").rsplit(".", 1)[-1]
        if callee not in ("field", OPTIONAL_KEY) or not call.args:
            return
        try:
            key = self._value(module, call.args[0])
        except Unresolved:
            return
        if not isinstance(key, str):
            return
        if callee == OPTIONAL_KEY:
            self._optional_key(module, statement, key)
            return
        keywords = {k.arg: k.value for k in call.keywords if k.arg}
        if "default" in keywords:
            default = self._shown(module, keywords["default"])
        elif "default_factory" in keywords:
            default = f"{ast.unparse(keywords['default_factory'])}()"
        else:
            default = "<required>"
        bounds = [
            f"{sign} {self._shown(module, keywords[name])}"
            for name, sign in (("min", ">="), ("above", ">"), ("max", "<="), ("below", "<"))
            if name in keywords
        ]
        if "choices" in keywords:
            try:
                choices = self._value(module, keywords["choices"])
                bounds.append("one of " + ", ".join(_choice(c) for c in choices))
            except (Unresolved, TypeError):
                bounds.append(f"one of {ast.unparse(keywords['choices'])}")
        text = self._shown(module, keywords["help"], str) if "help" in keywords else ""
        if bounds:
            text = f"{text} [{' and '.join(bounds)}]".strip()
        self.rows.setdefault(key, KeyRow(key, ast.unparse(statement.annotation), default, text))

    def _optional_key(self, module: str, statement: ast.AnnAssign, key: str) -> None:
        """A key declared by ``optional_key(key, what, none="the preset's")``: default None, and help saying
        what it sets and what None means."""
        call = statement.value
        assert isinstance(call, ast.Call)
        given = dict(zip(("what", "none"), call.args[1:3], strict=False))
        given.update({k.arg: k.value for k in call.keywords if k.arg in ("what", "none")})
        what = self._shown(module, given["what"], str) if "what" in given else ""
        none = self._shown(module, given["none"], str) if "none" in given else "the preset's"
        text = f"{what} (None: {none})"
        self.rows.setdefault(key, KeyRow(key, ast.unparse(statement.annotation), "None", text))

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
