"""Prompts for chat-tuned runs: a user message rendered with the chat template the run trained on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.data.chat import ChatTemplate

#: The chat template an SFT run trained with, kept in its run folder (``tokenizer_config.json`` layout:
#: ``chat_template``, ``bos_token``, ``eos_token``).
TEMPLATE_FILE = "chat_template.json"


def run_template(config: Any, tokenizer_spec: dict[str, Any]) -> ChatTemplate:
    """The chat template of a run: ``data/chat/template`` from its configuration (default ``auto``),
    resolved beside the run's tokenizer file for ``auto``."""
    return ChatTemplate.for_tokenizer(str(config.get("data/chat/template") or "auto"), tokenizer_spec)


def chat_prompt(run: Any, user: str) -> str:
    """``user`` as a user message of a loaded run, followed by the template's generation prompt.

    The template is the one the run trained with (``chat_template.json`` in its folder), else
    :func:`run_template`.
    """
    kept = Path(run.path) / TEMPLATE_FILE
    if kept.is_file():
        return ChatTemplate.from_tokenizer_config(kept).prompt(user)
    return run_template(run.config, dict(run.tokenizer.spec)).prompt(user)


__all__ = ["chat_prompt", "run_template"]
