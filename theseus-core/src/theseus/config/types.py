"""Type checking and coercion of configuration values against field annotations."""

from __future__ import annotations

import types
import typing
from typing import Any, Literal

from theseus.errors import ConfigError


def type_name(tp: Any) -> str:
    """A short human-readable name for an annotation (``int``, ``list[str]``, ...)."""
    if isinstance(tp, type) and not typing.get_args(tp):
        return tp.__name__
    if isinstance(tp, str):
        return tp
    return str(tp).replace("typing.", "")


def _is_union(origin: Any) -> bool:
    return origin is typing.Union or origin is types.UnionType


def same_type(a: Any, b: Any) -> bool:
    """Whether two annotations describe the same configuration type."""
    return a is b or type_name(a) == type_name(b)


def parse_override_value(text: str) -> Any:
    """Parse the right-hand side of ``key=value`` the way YAML reads a scalar or a flow list/mapping.

    Text stays text where YAML would change it: surrounding spaces (``prompt="def "``), what would
    read as a block collection (``-``, ``- x``, ``a: b``) and base-60 numbers (``10:12``); ``[a, b]``
    and ``{a: 1}`` still parse.
    """
    import yaml  # imported on use: listing commands never parse overrides

    if not text.strip():
        return text
    try:
        parsed = yaml.safe_load(text)
    except (yaml.YAMLError, ValueError, RecursionError):  # ValueError: an integer of over 4300 digits
        return text
    if isinstance(parsed, (list, dict)) and not text.lstrip().startswith(("[", "{")):
        return text
    if isinstance(parsed, str) and parsed != text and parsed == text.strip():
        return text
    if isinstance(parsed, (int, float)) and not isinstance(parsed, bool) and ":" in text:
        return text  # YAML 1.1 reads 2:30 as the base-60 number 150; nobody means that
    return parsed


def coerce(value: Any, tp: Any, key: str) -> Any:
    """Return ``value`` converted to annotation ``tp``, or raise a ConfigError naming ``key``."""
    if tp is Any or tp is typing.Any or isinstance(tp, str):
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if _is_union(origin):
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce(value, arg, key)
            except ConfigError:
                continue
        raise _type_error(key, value, tp)
    if origin is Literal:
        if value in args:
            return value
        choices = ", ".join(repr(a) for a in args)
        raise ConfigError(f"{key}: {value!r} is not one of {choices}")
    if origin in (list, tuple, typing.Sequence) or tp in (list, tuple):
        if isinstance(value, str):
            parsed = parse_override_value(value)
            value = parsed if isinstance(parsed, list) else [v.strip() for v in value.split(",")]
        if not isinstance(value, (list, tuple)):
            raise _type_error(key, value, tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise _type_error(key, value, tp)
            items = [coerce(v, a, key) for v, a in zip(value, args, strict=False)]
        else:
            item_type = args[0] if args else Any
            items = [coerce(v, item_type, key) for v in value]
        return tuple(items) if (origin is tuple or tp is tuple) else items
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise _type_error(key, value, tp)
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "no", "off", "0"):
            return False
        raise _type_error(key, value, tp)
    if tp is int:
        if isinstance(value, bool):
            raise _type_error(key, value, tp)
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise _type_error(key, value, tp)
    if tp is float:
        if isinstance(value, bool):
            raise _type_error(key, value, tp)
        if isinstance(value, (int, float)):
            try:
                return float(value)
            except OverflowError:  # an integer beyond the largest float
                raise ConfigError(
                    f"{key}={shown(value)} is too large for a number of type float (at most about 1.8e308)"
                ) from None
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _type_error(key, value, tp)
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            try:
                return str(value)
            except ValueError:  # an integer of over 4300 digits
                pass
        raise _type_error(key, value, tp)
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _type_error(key, value, tp)
    return value


def _type_error(key: str, value: Any, tp: Any) -> ConfigError:
    name = type_name(tp)
    return ConfigError(f"{key}: expected {name}, got {shown(value)} ({type(value).__name__}); set it as {key}=<{name}>")


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` for a message, cut to ``limit`` characters (with the full length) when longer."""
    try:
        text = repr(value)
    except ValueError:  # an integer of over 4300 digits
        text = f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    return text if len(text) <= limit else f"{text[: limit - 3]}... ({len(text)} characters)"
