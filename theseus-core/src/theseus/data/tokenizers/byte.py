"""The byte-level tokenizer, the default: it needs nothing installed and fits every text.

It maps UTF-8 bytes to ids 0..255 and reserves id 256 for end-of-text, so its vocabulary has 257
entries and a model trained on byte data needs ``architecture/vocab_size >= 257``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from theseus.data.tokenizers.base import EOT_TEXT


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


__all__ = ["ByteTokenizer"]
