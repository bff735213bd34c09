"""Finding a Hugging Face checkpoint: a local folder, or a hub repository id fetched with ``huggingface_hub``."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.errors import ConfigError

CONFIG_FILE = "config.json"
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
#: Files a snapshot needs (weights in safetensors only: pickled ``.bin`` files are never fetched).
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]
EXTRA = "pip install 'theseus-models[hf]'"


def resolve_source(source: str, revision: str = "") -> tuple[Path, dict[str, Any]]:
    """The local folder of ``source`` and a provenance note; a hub id is downloaded (safetensors only)."""
    if not source:
        raise ConfigError("hf/source is empty; pass hf/source=<checkpoint folder or hub repository id>")
    folder = Path(source).expanduser()
    if folder.is_dir():
        return folder.absolute(), {"source": str(folder.absolute())}
    if not HUB_ID.match(source) or source.startswith((".", "/", "~")):
        raise ConfigError(
            f"hf/source={source!r} is neither a folder nor a hub repository id like 'openai-community/gpt2'"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ConfigError(f"hf/source={source!r} is a hub id, and downloading needs huggingface_hub: {EXTRA}") from exc
    try:
        path = snapshot_download(source, revision=revision or None, allow_patterns=HUB_PATTERNS)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"cannot download {source!r} from the Hugging Face hub ({type(exc).__name__}: {first}); offline, "
            f"download it elsewhere (huggingface-cli download {source} --include '*.json' '*.safetensors') and pass "
            "hf/source=<that folder>"
        ) from exc
    folder = Path(path)
    return folder, {"source": source, "revision": folder.name, "requested_revision": revision or "main"}


def hub_config_folder(repo: str) -> Path:
    """The local folder holding hub repository ``repo``'s ``config.json`` (downloaded if need be)."""
    if not HUB_ID.match(repo) or repo.startswith((".", "/", "~")):
        raise ConfigError(f"{repo!r} is neither a folder nor a hub repository id")
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise ConfigError(f"{repo!r} is a hub id, and reading it needs huggingface_hub: {EXTRA}") from exc
    try:
        return Path(hf_hub_download(repo, CONFIG_FILE)).parent
    except Exception as exc:  # offline, unknown repository: opening the source says which
        raise ConfigError(f"cannot read {repo!r}'s {CONFIG_FILE} ({type(exc).__name__})") from exc


def read_config(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise ConfigError(
            f"{folder} has no config.json; pass the folder a Hugging Face model was saved to (save_pretrained)"
        )
    try:
        return jsonfile.read_object(path)
    except jsonfile.UnreadableJSON as exc:
        raise ConfigError(f"{exc}; download it again") from exc
