"""tiktoken encodings (``gpt2``, ``cl100k_base``, ...), an optional extra: ``pip install 'theseus-data[tiktoken]'``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from theseus.errors import DataError


class TiktokenTokenizer:
    """A tiktoken encoding; spec ``{"kind": "tiktoken", "encoding": "gpt2"}`` or the string ``tiktoken:gpt2``.

    tiktoken downloads an encoding's ranks the first time it is used (then caches them); without a
    network, set ``TIKTOKEN_CACHE_DIR`` to a folder that already holds them.
    """

    kind = "tiktoken"

    def __init__(self, encoding: str = "gpt2") -> None:
        try:
            import tiktoken
        except ImportError as exc:
            raise DataError(
                "the tiktoken tokenizer needs the tiktoken package; pip install 'theseus-data[tiktoken]'"
            ) from exc
        try:
            self._enc = tiktoken.get_encoding(encoding)
        except Exception as exc:
            raise DataError(
                f"tiktoken could not load encoding {encoding!r} ({type(exc).__name__}: {exc}); use a known "
                "encoding such as gpt2 or cl100k_base, with network access or a filled TIKTOKEN_CACHE_DIR"
            ) from exc
        self.encoding = encoding

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> TiktokenTokenizer:
        return cls(str(spec.get("encoding") or spec.get("value") or "gpt2"))

    @classmethod
    def from_string_spec(cls, argument: str) -> dict[str, Any]:
        return {"kind": cls.kind, "encoding": argument or "gpt2"}

    @property
    def vocab_size(self) -> int:
        return int(self._enc.n_vocab)

    @property
    def eot_id(self) -> int:
        return int(self._enc.eot_token)

    @property
    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "encoding": self.encoding}

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode_ordinary(text))

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(ids) for ids in self._enc.encode_ordinary_batch(texts)]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._enc.decode([int(i) for i in ids]))

    def __repr__(self) -> str:
        return f"TiktokenTokenizer({self.encoding!r})"
