"""Deprecated: tokenizers live in ``theseus.data.tokenizers``: ``.base`` (the ``Tokenizer`` protocol,
``EOT_TEXT``, ``encode_arrays``), ``.byte`` (``ByteTokenizer``) and ``.spec`` (``load_tokenizer``,
``parse_spec``, ``spec_identity``). This alias is kept for one minor version."""

from __future__ import annotations

import warnings

from theseus.data.tokenizers.base import EOT_TEXT, Tokenizer, encode_arrays
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.data.tokenizers.spec import load_tokenizer, parse_spec, spec_identity

warnings.warn(
    "theseus.data.tokenizer is deprecated; import from theseus.data.tokenizers.base (Tokenizer, EOT_TEXT, "
    "encode_arrays), theseus.data.tokenizers.byte (ByteTokenizer) and theseus.data.tokenizers.spec "
    "(load_tokenizer, parse_spec, spec_identity)",
    DeprecationWarning,
    stacklevel=2,
)

__all__ = [
    "EOT_TEXT",
    "ByteTokenizer",
    "Tokenizer",
    "encode_arrays",
    "load_tokenizer",
    "parse_spec",
    "spec_identity",
]
