"""Tokenizer specs and ``load_tokenizer``.

A tokenizer is described by a *spec*, a small JSON-able mapping whose ``kind`` names a registered
``tokenizer/<kind>`` component (``{"kind": "byte"}``, ``{"kind": "hf", "path": ...}``,
``{"kind": "tiktoken", "encoding": "gpt2"}``). The spec is written into the header of prepared data
so the data can always be decoded with the tokenizer that produced it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from theseus.config import field
from theseus.data.tokenizers.base import Tokenizer
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.errors import DataError


def tokenizer_field() -> Any:
    """``data/tokenizer``, the spec data is prepared with, as every class that reads it declares it."""
    return field(
        "data/tokenizer", default="byte", path="spec", help="byte, hf:PATH/tokenizer.json or tiktoken:ENCODING"
    )


def parse_spec(value: str | Mapping[str, Any]) -> dict[str, Any]:
    """Normalise a tokenizer spec.

    Strings are ``"byte"``, ``"hf:PATH/tokenizer.json"`` (or just a path ending in ``.json``),
    ``"tiktoken:ENCODING"``, or generally ``"KIND:ARGUMENT"`` (passed to the kind's ``from_string``).
    """
    if isinstance(value, Mapping):
        spec = dict(value)
        if not isinstance(spec.get("kind"), str) or not spec["kind"]:
            raise DataError(f"tokenizer spec {spec!r} has no 'kind'; use e.g. {{'kind': 'byte'}}")
        return spec
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"tokenizer {value!r} is not a spec; use 'byte', 'hf:PATH.json' or 'tiktoken:gpt2'")
    text = value.strip()
    if text.endswith(".json") and ":" not in text.split("/")[0]:
        return {"kind": "hf", "path": text}
    kind, sep, argument = text.partition(":")
    if not sep:
        return {"kind": kind}
    cls = _tokenizer_class(kind)
    from_string = getattr(cls, "from_string_spec", None)
    if from_string is None:
        raise DataError(f"tokenizer kind {kind!r} takes no argument; use data/tokenizer={kind}")
    return dict(from_string(argument))


def _tokenizer_class(kind: str) -> Any:
    if kind == ByteTokenizer.kind:  # the default needs no registry scan
        return ByteTokenizer
    from theseus.registry import get_registry

    return get_registry().load_component("tokenizer", kind)


def load_tokenizer(spec: str | Mapping[str, Any] | Tokenizer) -> Tokenizer:
    """The tokenizer a spec describes (``tokenizer/<kind>`` components are looked up in the registry)."""
    if isinstance(spec, Tokenizer) and not isinstance(spec, (str, Mapping)):
        return spec
    parsed = parse_spec(spec)
    cls = _tokenizer_class(parsed["kind"])
    from_spec = getattr(cls, "from_spec", None)
    tokenizer = from_spec(parsed) if from_spec is not None else cls()
    if not isinstance(tokenizer, Tokenizer):
        raise DataError(
            f"tokenizer/{parsed['kind']} built a {type(tokenizer).__name__}, which lacks encode/decode/"
            "vocab_size/eot_id/spec; fix the tokenizer plugin"
        )
    return tokenizer


def spec_identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a spec that decides the ids (file locations left out, file hashes kept)."""
    return {k: v for k, v in spec.items() if k != "path"}


__all__ = ["load_tokenizer", "parse_spec", "spec_identity"]
