"""Hugging Face ``tokenizers``: any local ``tokenizer.json`` (e.g. a BPE trained by ``data/train-bpe``)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from theseus.data.tokenizers.base import EOT_TEXT
from theseus.errors import DataError

#: End-of-text tokens looked for, in order, when the spec does not name one.
EOT_CANDIDATES = (EOT_TEXT, "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class HFTokenizer:
    """A ``tokenizers.Tokenizer`` loaded from a ``tokenizer.json`` file.

    Spec: ``{"kind": "hf", "path": ".../tokenizer.json", "sha256": ..., "eot": "<|endoftext|>"}``;
    the hash, when present, must match the file. As a string: ``hf:PATH``.
    """

    kind = "hf"

    def __init__(self, path: str | Path, *, eot: str | None = None, sha256: str | None = None) -> None:
        self.path = Path(path).expanduser()
        if not self.path.is_file():
            raise DataError(
                f"tokenizer file {self.path} does not exist; pass data/tokenizer=hf:PATH/tokenizer.json "
                "(train one with 'theseus run data/train-bpe')"
            )
        actual = file_sha256(self.path)
        if sha256 is not None and sha256 != actual:
            raise DataError(
                f"tokenizer file {self.path} does not match the one the data was prepared with "
                f"(sha256 {actual[:12]} vs {sha256[:12]}); restore that file or re-prepare with data/force=true"
            )
        self.sha256 = actual
        try:
            from tokenizers import Tokenizer as _Tokenizer

            self._tok = _Tokenizer.from_file(str(self.path))
        except Exception as exc:
            raise DataError(f"{self.path} is not a Hugging Face tokenizer.json ({exc}); pass a valid file") from exc
        self._vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        names = (eot,) if eot else EOT_CANDIDATES
        for candidate in names:
            token_id = self._tok.token_to_id(candidate) if candidate else None
            if token_id is not None:
                self.eot, self._eot_id = candidate, int(token_id)
                break
        else:
            wanted = ", ".join(repr(n) for n in names)
            raise DataError(
                f"tokenizer {self.path} has no end-of-text token ({wanted}); add one as a special token "
                "or name it in the spec as {'kind': 'hf', 'path': ..., 'eot': TOKEN}"
            )

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> HFTokenizer:
        path = spec.get("path") or spec.get("value")
        if not path:
            raise DataError(f"tokenizer spec {dict(spec)!r} needs a 'path' to a tokenizer.json")
        return cls(path, eot=spec.get("eot"), sha256=spec.get("sha256"))

    @classmethod
    def from_string_spec(cls, argument: str) -> dict[str, Any]:
        return {"kind": cls.kind, "path": argument}

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def eot_id(self) -> int:
        return self._eot_id

    @property
    def spec(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path.resolve()), "sha256": self.sha256, "eot": self.eot}

    @property
    def files(self) -> dict[str, Path]:
        """Files the prepared data should keep a copy of (name in the data folder -> source)."""
        return {"tokenizer.json": self.path}

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [e.ids for e in self._tok.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=False))

    def __repr__(self) -> str:
        return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"
