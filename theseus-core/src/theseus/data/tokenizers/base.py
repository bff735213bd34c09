"""Tokenizers: the protocol every tokenizer follows, the byte-level default, and ``load_tokenizer``.

A tokenizer is described by a *spec*, a small JSON-able mapping whose ``kind`` names a registered
``tokenizer/<kind>`` component (``{"kind": "byte"}``, ``{"kind": "hf", "path": ...}``,
``{"kind": "tiktoken", "encoding": "gpt2"}``). The spec is written into the header of prepared data
so the data can always be decoded with the tokenizer that produced it.

The byte tokenizer maps UTF-8 bytes to ids 0..255 and reserves id 256 for end-of-text, so its
vocabulary has 257 entries and a model trained on byte data needs ``architecture/vocab_size >= 257``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from theseus.errors import DataError

#: How every tokenizer renders its end-of-text token in ``decode``.
EOT_TEXT = "<|endoftext|>"


@runtime_checkable
class Tokenizer(Protocol):
    """What the tokenize job, the loader and generation need from a tokenizer."""

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (ids are ``0 .. vocab_size - 1``)."""
        ...

    @property
    def eot_id(self) -> int:
        """The end-of-text id appended after every document."""
        ...

    @property
    def spec(self) -> dict[str, Any]:
        """A JSON-able description that ``load_tokenizer`` turns back into this tokenizer."""
        ...

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (end-of-text is never added)."""
        ...

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids``; the end-of-text id renders as ``EOT_TEXT``."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens 0..255 plus end-of-text 256 (vocabulary 257); needs nothing installed."""

    kind = "byte"
    vocab_size = 257
    eot_id = 256

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> ByteTokenizer:
        return cls()

    @property
    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind}

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_array(self, text: str) -> np.ndarray:
        """``encode`` as a uint8 array without building a Python list (the fast path)."""
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)

    def decode(self, ids: Iterable[int]) -> str:
        parts: list[str] = []
        chunk = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                chunk.append(i)
                continue
            parts.append(chunk.decode("utf-8", errors="replace"))
            chunk.clear()
            parts.append(EOT_TEXT if i == self.eot_id else "\ufffd")
        parts.append(chunk.decode("utf-8", errors="replace"))
        return "".join(parts)

    def __repr__(self) -> str:
        return "ByteTokenizer()"


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
    if kind == ByteTokenizer.kind:
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


def encode_arrays(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Encode many texts, using a tokenizer's batch or array fast path when it has one."""
    batch = getattr(tokenizer, "encode_batch", None)
    if batch is not None:
        return [np.asarray(ids, dtype=np.int64) for ids in batch(texts)]
    one = getattr(tokenizer, "encode_array", None)
    if one is not None:
        return [one(t) for t in texts]
    return [np.asarray(tokenizer.encode(t), dtype=np.int64) for t in texts]


__all__ = [
    "EOT_TEXT",
    "ByteTokenizer",
    "Tokenizer",
    "encode_arrays",
    "load_tokenizer",
    "parse_spec",
    "spec_identity",
]
