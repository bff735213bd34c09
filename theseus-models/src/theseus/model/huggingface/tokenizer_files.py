"""The tokenizer that travels with a checkpoint: ``tokenizer.json`` and its companions, its
end-of-text token, and whether it starts texts with a beginning-of-sequence token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def _first(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return int(value) if isinstance(value, int) else None


def special_ids(folder: Path, config: dict[str, Any]) -> tuple[int | None, int | None]:
    """(bos, eos) ids: ``generation_config.json`` first, then ``config.json``."""
    generation: dict[str, Any] = {}
    path = folder / "generation_config.json"
    if path.is_file():
        try:
            generation = json.loads(path.read_text())
        except (OSError, ValueError):
            generation = {}
    bos = _first(generation.get("bos_token_id", config.get("bos_token_id")))
    eos = _first(generation.get("eos_token_id", config.get("eos_token_id")))
    return bos, eos


def tokenizer_spec(folder: Path, config: dict[str, Any], vocab_size: int) -> tuple[dict[str, Any] | None, int | None]:
    """The tokenizer spec of the checkpoint's ``tokenizer.json`` (None without one), with ``eot``
    from the checkpoint's end-of-sequence token, and the beginning-of-sequence id when encoding
    starts texts with one (else None); ConfigError when the tokenizer has more ids than the model's
    vocabulary."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None, None
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - tokenizers comes with theseus-data
        raise ConfigError("reading tokenizer.json needs the tokenizers package: pip install tokenizers") from exc
    try:
        tok = Tokenizer.from_file(str(path))
    except Exception as exc:
        raise ConfigError(f"{path} is not a valid Hugging Face tokenizer ({exc}); download it again") from exc
    size = int(tok.get_vocab_size(with_added_tokens=True))
    if size > vocab_size:
        raise ConfigError(
            f"{path} has {size} token ids but config.json's vocab_size is {vocab_size}; "
            "the tokenizer does not belong to these weights"
        )
    bos, eos = special_ids(folder, config)
    spec: dict[str, Any] = {"kind": "hf", "path": str(path)}
    eot = tok.id_to_token(eos) if eos is not None else None
    if eot:
        spec["eot"] = eot
    probe = tok.encode("a", add_special_tokens=True).ids
    starts_with_bos = bos is not None and bool(probe) and probe[0] == bos
    return spec, bos if starts_with_bos else None
