"""Jinja2 templates rendered in the sandbox within bounds of time and size.

A chat template comes with a downloaded tokenizer, so it is untrusted code. Jinja2's immutable sandbox
keeps it from reaching Python; the bounds here keep it from running forever or filling memory:

- every step of a ``for`` loop and every call checks the time since the rendering began
  (:data:`RENDER_SECONDS`), so nested loops, recursive macros and ``loop()`` recursion stop;
- ``+``, ``*``, ``**``, ``%`` and ``~`` refuse a result longer than :data:`MAX_TEXT` characters (or
  items) or an integer past :data:`MAX_INT_BITS` bits, before building it where the size is known in
  advance (``~`` is checked once built);
- a call or a filter is refused before it runs when it is given a number past :data:`MAX_TEXT` (a width or
  a count: ``'x'.ljust(10**9)``, ``|center(10**9)``), a format asking for such a width
  (``'{:>1000000000}'.format(x)``, ``|format``) or a replacement whose result would be past it, and its
  result is checked for size;
- the text written is counted as it is produced, up to :data:`MAX_TEXT` characters.

A rendering past a bound raises :class:`RenderBoundError`.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

#: Seconds one rendering may take.
RENDER_SECONDS = 10.0
#: The most characters a rendering may write, and the longest text or list an operator may build.
MAX_TEXT = 16 << 20
#: The most bits of an integer an operator may build (``2 ** 10 ** 9`` would take hours to compute).
MAX_INT_BITS = 1 << 16


class RenderBoundError(Exception):
    """A rendering went past one of the bounds (the message says which)."""


class _Budget(threading.local):
    """The deadline of the rendering under way in this thread."""

    deadline = float("inf")


_BUDGET = _Budget()


def _check_time() -> None:
    if time.monotonic() > _BUDGET.deadline:
        raise RenderBoundError(f"it ran for more than {RENDER_SECONDS:g} s")


def _sized(value: Any) -> int | None:
    """The length of text, a list or a tuple; an integer's bits; None for anything else."""
    if isinstance(value, (str, list, tuple)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length()
    return None


def _check_size(value: Any) -> Any:
    """``value`` when it is within the bounds, else RenderBoundError."""
    size = _sized(value)
    if size is None:
        return value
    if isinstance(value, int) and size > MAX_INT_BITS:
        raise RenderBoundError(f"it built an integer of more than {MAX_INT_BITS} bits")
    if not isinstance(value, int) and size > MAX_TEXT:
        raise RenderBoundError(f"it built a value of more than {MAX_TEXT:,} characters or items")
    return value


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_operands(operator: str, left: Any, right: Any) -> None:
    """Refuse a sum of texts or lists, a repetition, a power or a ``%`` format (by the widths it writes)
    whose result would be past the bounds, before it is built."""
    if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
        if len(left) + len(right) > MAX_TEXT:
            raise RenderBoundError(f"it built a value of more than {MAX_TEXT:,} characters or items")
    elif operator == "*":
        for sequence, count in ((left, right), (right, left)):
            if isinstance(sequence, (str, list, tuple)) and _is_int(count) and len(sequence) * count > MAX_TEXT:
                raise RenderBoundError(f"it built a value of more than {MAX_TEXT:,} characters or items")
        if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise RenderBoundError(f"it built an integer of more than {MAX_INT_BITS} bits")
    elif operator == "**" and _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
        if right * left.bit_length() > MAX_INT_BITS:
            raise RenderBoundError(f"it built an integer of more than {MAX_INT_BITS} bits")
    elif operator == "%" and isinstance(left, str):
        _check_format(left, right if isinstance(right, tuple) else (right,))


def _check_format(text: str, args: Iterable[Any] = ()) -> None:
    """Refuse a format (``%`` or ``str.format``) that asks for a field wider than :data:`MAX_TEXT`: a width
    or precision written in it (``%1000000000s``, ``{:>1000000000}``) or given as an argument (``%*s``)."""
    longest = max((len(digits) for digits in re.findall(r"\d+", text)), default=0)
    given = "*" in text and any(_is_int(a) and abs(a) > MAX_TEXT for a in args)
    if longest > len(str(MAX_TEXT)) or given:
        raise RenderBoundError(f"it asked for a field wider than {MAX_TEXT:,} characters")


def _check_arguments(name: str, target: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Refuse a call or filter ``name`` on ``target`` whose arguments ask for more than the bounds: a number
    past :data:`MAX_TEXT` (a width, a count), a format of such a width, a replacement past :data:`MAX_TEXT`."""
    values = (*args, *kwargs.values())
    if any(_is_int(v) and abs(v) > MAX_TEXT for v in values):
        raise RenderBoundError(f"it gave {name} a number larger than {MAX_TEXT:,}")
    if name in ("format", "format_map") and isinstance(target, str):
        _check_format(target, values)
    if name == "replace" and isinstance(target, str) and len(args) >= 2:
        old, new = str(args[0]), str(args[1])
        grown = len(target) + (target.count(old) if old else len(target) + 1) * max(0, len(new) - len(old))
        if grown > MAX_TEXT:
            raise RenderBoundError(f"it built a value of more than {MAX_TEXT:,} characters or items")


def bounded_steps(iterable: Iterable[Any]) -> Iterator[Any]:
    """The items of a ``for`` loop, checking the time before each."""
    for item in iterable:
        _check_time()
        yield item


def bounded_environment(**options: Any) -> Any:
    """An immutable Jinja2 sandbox whose templates (compiled with :func:`compile_bounded`) keep the bounds."""
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "+", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_operands(operator, left, right)
            return _check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
            _check_time()
            name = getattr(__obj, "__name__", type(__obj).__name__)
            bound_to = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # the sandbox wraps str.format
            _check_arguments(name, bound_to, args, kwargs)
            return _check_size(super().call(__context, __obj, *args, **kwargs))

    environment = BoundedSandbox(**options)
    for name, function in list(environment.filters.items()):
        environment.filters[name] = _bounded_filter(name, function)
    environment.filters[_STEPS_FILTER] = bounded_steps
    environment.filters[_VALUE_FILTER] = _check_size
    return environment


def _bounded_filter(name: str, function: Any) -> Any:
    """Filter ``name`` with its arguments checked before it runs and its result after (a filter is called
    directly, not through the sandbox's ``call``)."""
    import functools

    @functools.wraps(function)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_time()
        plain = [a for a in args if not _is_jinja_context(a)]
        target = plain[0] if plain else None
        _check_arguments(name, target, tuple(plain[1:]), kwargs)
        return _check_size(function(*args, **kwargs))

    return bounded


def _is_jinja_context(value: Any) -> bool:
    """Whether ``value`` is what Jinja passes a filter first (its environment, context or eval context)."""
    from jinja2.environment import Environment
    from jinja2.nodes import EvalContext
    from jinja2.runtime import Context

    return isinstance(value, (Environment, Context, EvalContext))


#: The filters :func:`compile_bounded` puts around loops and ``~`` (a filter is called directly, without
#: the sandbox's checks of a call).
_STEPS_FILTER = "theseus_bounded_steps"
_VALUE_FILTER = "theseus_bounded_value"


def compile_bounded(environment: Any, source: str) -> Any:
    """``source`` compiled in ``environment`` (from :func:`bounded_environment`) with every ``for`` loop
    stepping through :func:`bounded_steps` and every ``~`` result checked for size."""
    from jinja2 import nodes
    from jinja2.visitor import NodeTransformer

    def through(name: str, node: nodes.Node) -> nodes.Node:
        checked = nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)
        return checked.set_environment(environment)

    class Bounded(NodeTransformer):
        def visit_For(self, node: nodes.For) -> nodes.Node:
            self.generic_visit(node)
            node.iter = through(_STEPS_FILTER, node.iter)
            return node

        def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
            self.generic_visit(node)
            return through(_VALUE_FILTER, node)

    tree = Bounded().visit(environment.parse(source))
    return environment.from_string(tree)


def render_bounded(template: Any, **variables: Any) -> str:
    """``template`` (from :func:`compile_bounded`) rendered with ``variables`` within the bounds."""
    previous = _BUDGET.deadline
    _BUDGET.deadline = time.monotonic() + RENDER_SECONDS
    try:
        pieces: list[str] = []
        written = 0
        for piece in template.generate(**variables):
            written += len(piece)
            if written > MAX_TEXT:
                raise RenderBoundError(f"it wrote more than {MAX_TEXT:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    finally:
        _BUDGET.deadline = previous


__all__ = [
    "MAX_INT_BITS",
    "MAX_TEXT",
    "RENDER_SECONDS",
    "RenderBoundError",
    "bounded_environment",
    "bounded_steps",
    "compile_bounded",
    "render_bounded",
]
