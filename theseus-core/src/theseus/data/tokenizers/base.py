"""The tokenizer protocol: what every tokenizer offers, and the end-of-text text they share.

theseus-core ships this module, the byte tokenizer (``.byte``) and tokenizer specs with
``load_tokenizer`` (``.spec``); theseus-data adds ``.huggingface``, ``.tiktoken_tokenizer`` and
``.bpe`` to the same package.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, runtime_checkable

import numpy as np

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


def encode_arrays(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Encode many texts, using a tokenizer's batch or array fast path when it has one."""
    batch = getattr(tokenizer, "encode_batch", None)
    if batch is not None:
        return [np.asarray(ids, dtype=np.int64) for ids in batch(texts)]
    one = getattr(tokenizer, "encode_array", None)
    if one is not None:
        return [one(t) for t in texts]
    return [np.asarray(tokenizer.encode(t), dtype=np.int64) for t in texts]


__all__ = ["EOT_TEXT", "Tokenizer", "encode_arrays"]
