"""The tokenizer that travels with a checkpoint: ``tokenizer.json`` and its companions, its
end-of-text token, and whether it starts texts with a beginning-of-sequence token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.data.chat import declared_template, special_token_text
from theseus.errors import ConfigError

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


#: The end-of-text token of theseus' byte tokenizer (id 256, after the 256 bytes).
BYTE_END_OF_TEXT = "<|endoftext|>"


def chat_template_record(folder: Path) -> dict[str, str] | None:
    """A checkpoint's chat template in the layout a run keeps it (``chat_template``, ``bos_token``,
    ``eos_token``): ``chat_template.jinja``, else the ``chat_template`` of ``tokenizer_config.json`` (the
    default of a list); None when it has none."""
    config: dict[str, Any] = {}
    path = folder / "tokenizer_config.json"
    if path.is_file():
        try:
            loaded = jsonfile.read(path, check_numbers=False)  # transformers writes model_max_length=int(1e30)
        except jsonfile.UnreadableJSON as exc:
            raise ConfigError(f"{exc}; download it again") from exc
        config = loaded if isinstance(loaded, dict) else {}
    template = declared_template(path, config)
    if template is None:
        return None
    tokens = {name: special_token_text(config.get(name)) for name in ("bos_token", "eos_token")}
    return {"chat_template": template, **tokens}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars = list(printable)
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def byte_tokenizer_json() -> dict[str, Any]:
    """A ``tokenizer.json`` equal to theseus' byte tokenizer (byte b -> id b, end-of-text -> 256):
    a byte-level BPE without merges, written as plain JSON (no tokenizer library needed)."""
    byte_to_char = bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "trim_offsets": True}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": 256,
                "content": BYTE_END_OF_TEXT,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {**byte_level, "add_prefix_space": False, "use_regex": False},
        "post_processor": None,
        "decoder": {**byte_level, "add_prefix_space": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {byte_to_char[b]: b for b in range(256)},
            "merges": [],
        },
    }


def token_id(tokenizer: dict[str, Any], token: str) -> int | None:
    """The id of ``token`` in a parsed ``tokenizer.json`` (added tokens first, then the model's vocabulary)."""
    for added in tokenizer.get("added_tokens") or []:
        if added.get("content") == token:
            return int(added["id"])
    vocab = (tokenizer.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        found = vocab.get(token)
        return int(found) if found is not None else None
    if isinstance(vocab, list):  # Unigram: [piece, score] pairs, the id is the position
        return next((i for i, entry in enumerate(vocab) if entry and entry[0] == token), None)
    return None


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
            generation = jsonfile.read_object(path)
        except jsonfile.UnreadableJSON:
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
    except ImportError as exc:
        raise ConfigError(f"reading {path} needs the tokenizers package: pip install 'theseus-models[hf]'") from exc
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
