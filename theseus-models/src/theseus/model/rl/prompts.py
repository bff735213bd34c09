"""How a policy reads prompts and ends its turns: the tokenizer, chat template and stop tokens of the
checkpoint it starts from (``training/init_from``).

The tokenizer is the one the source records (a Hugging Face checkpoint's ``tokenizer.json``, or the
tokenizer a theseus run trained with), else theseus' byte tokenizer. With ``rl/chat`` (by default where
the source has one) prompts are rendered by the source's chat template: a run's ``chat_template.json``
(kept by ``train/sft``), or the ``chat_template`` of a checkpoint's ``tokenizer_config.json``, through
the sandboxed Jinja2 renderer of ``theseus.data.chat``. A completion stops at the tokenizer's end of
text and at every end-of-sequence id of the checkpoint (``generation_config.json``'s ``eos_token_id``,
one or a list, and the ``eos_token`` of ``tokenizer_config.json`` and of the template), such as a chat
model's end of turn.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.data.chat import ChatTemplate, has_chat_template, read_json_object, special_token_text
from theseus.data.tokenizers.base import Tokenizer
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.data.tokenizers.spec import load_tokenizer
from theseus.errors import ConfigError, DataError
from theseus.model.loading.chat import TEMPLATE_FILE
from theseus.rl.environment import Prompt
from theseus.runs.ref import RunRef
from theseus.training.sources import INIT_FROM, parse_source

#: The files of a Hugging Face checkpoint read beside its ``tokenizer.json``.
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class PolicyText:
    """The policy's tokenizer, the chat template prompts are rendered with (None: plain text) and the
    token ids that end a completion (the tokenizer's end of text first)."""

    tokenizer: Tokenizer
    template: ChatTemplate | None
    stop_ids: tuple[int, ...]

    def text(self, prompt: Prompt) -> str:
        """The text the policy continues: the prompt's messages through the chat template with its
        generation prompt, else the plain text after a system message on its own line."""
        if self.template is not None:
            return self.template.render(prompt.messages, add_generation_prompt=True)
        return f"{prompt.system}\n{prompt.text}" if prompt.system else prompt.text

    def encode(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids."""
        return list(self.tokenizer.encode(self.text(prompt)))

    def reply(self, transcript: Sequence[Mapping[str, str]], reply: str) -> str:
        """The text that follows the policy's last turn (the last message of ``transcript``) when the
        environment replies ``reply``: with a template, what it renders between that turn's content and the
        next assistant turn's (the turn's end, the reply as a ``tool`` message, the assistant's header), so
        an episode reads as the conversation a chat-data warm-up renders (``Environment.solution``); the
        reply as it is without a template, or with one that does not render a tool message after the turn
        (``phi3`` drops them)."""
        written = transcript[-1]["content"] if transcript else ""
        if self.template is None or not written:
            return reply
        try:
            before = self.template.render(list(transcript))
            after = self.template.render([*transcript, {"role": "tool", "content": reply}], add_generation_prompt=True)
        except DataError:  # a template that refuses a tool message
            return reply
        at = before.rfind(written)
        end = at + len(written)
        if at < 0 or not after.startswith(before[:end]):
            return reply
        between = after[end:]
        return between if reply in between else reply


def _read(path: Path) -> dict[str, Any]:
    """The checkpoint file's JSON object, {} when it has none; a damaged one is a DataError naming it."""
    return read_json_object(path) if path.is_file() else {}


def _single_id(tokenizer: Tokenizer, text: str) -> int | None:
    """The id of ``text`` when the tokenizer reads it as one token, else None."""
    if not text:
        return None
    ids = list(tokenizer.encode(text))
    return int(ids[0]) if len(ids) == 1 else None


def stop_ids(tokenizer: Tokenizer, folder: Path | None, template: ChatTemplate | None) -> tuple[int, ...]:
    """The ids a completion ends at: the tokenizer's end of text, ``generation_config.json``'s
    ``eos_token_id`` (an id or a list) and the ``eos_token`` of ``tokenizer_config.json`` in ``folder``,
    and the template's ``eos_token``; ids outside the tokenizer's vocabulary are left out."""
    found: list[int] = [int(tokenizer.eot_id)]
    if folder is not None:
        eos = _read(folder / GENERATION_CONFIG).get("eos_token_id")
        found += [int(i) for i in (eos if isinstance(eos, list) else [eos]) if isinstance(i, int)]
        named = _single_id(tokenizer, special_token_text(_read(folder / TOKENIZER_CONFIG).get("eos_token")))
        found += [] if named is None else [named]
    if template is not None:
        named = _single_id(tokenizer, template.eos_token)
        found += [] if named is None else [named]
    return tuple(i for i in dict.fromkeys(found) if 0 <= i < tokenizer.vocab_size)


def tokenizer_folder(spec: Mapping[str, Any] | None) -> Path | None:
    """The folder of a Hugging Face tokenizer's ``tokenizer.json`` (None for other tokenizers)."""
    if not spec or spec.get("kind") != "hf" or not spec.get("path"):
        return None
    return Path(str(spec["path"])).expanduser().parent


def kept_template(init_from: str, root: Path) -> Path | None:
    """The file holding the chat template of the ``training/init_from`` source: a run's
    ``chat_template.json``, a Hugging Face checkpoint's ``tokenizer_config.json``; None without a source."""
    if not init_from:
        return None
    source = parse_source(init_from, root)
    if isinstance(source, RunRef):
        return source.path / TEMPLATE_FILE
    folder = Path(source).expanduser()
    return folder / TOKENIZER_CONFIG if folder.is_dir() else None


def template_file(init_from: str, root: Path, tokenizer_spec: Mapping[str, Any] | None) -> Path | None:
    """The file that holds the chat template of the ``training/init_from`` source, where it would be: a
    run's ``chat_template.json``, a checkpoint's ``tokenizer_config.json`` (a hub id's beside its tokenizer);
    None without a source."""
    kept = kept_template(init_from, root)
    if kept is None and init_from.startswith("hf:"):  # a hub id: the files sit beside its tokenizer
        folder = tokenizer_folder(tokenizer_spec)
        kept = None if folder is None else folder / TOKENIZER_CONFIG
    return kept


def found_template(init_from: str, root: Path, tokenizer_spec: Mapping[str, Any] | None) -> ChatTemplate | None:
    """The chat template of the ``training/init_from`` source, None when it has none."""
    kept = template_file(init_from, root, tokenizer_spec)
    return ChatTemplate.from_tokenizer_config(kept) if kept is not None and has_chat_template(kept) else None


def source_template(init_from: str, root: Path, tokenizer_spec: Mapping[str, Any] | None) -> ChatTemplate:
    """The chat template of the ``training/init_from`` source (``rl/chat=true``); ConfigError naming the
    fix when there is none."""
    kept = template_file(init_from, root, tokenizer_spec)
    if kept is None or not has_chat_template(kept):
        what = "is not a run or a checkpoint" if kept is None else f"has no chat template ({kept.name})"
        raise ConfigError(
            f"rl/chat=true renders prompts with the chat template of the source the policy starts from, but "
            f"{INIT_FROM}={init_from or '(unset)'} {what}; start from a run fine-tuned on chat data "
            "(run:NAME) or a chat checkpoint (hf:DIR), or set rl/chat=false"
        )
    return ChatTemplate.from_tokenizer_config(kept)


def template_record(template: ChatTemplate) -> dict[str, str]:
    """``template`` in the layout a run keeps it (``chat_template.json``, ``tokenizer_config.json``'s keys)."""
    return {"chat_template": template.source, "bos_token": template.bos_token, "eos_token": template.eos_token}


def policy_text(init_from: str, root: Path, tokenizer_spec: Mapping[str, Any] | None, chat: bool | None) -> PolicyText:
    """The policy's text handling for a run starting from ``init_from`` whose source records
    ``tokenizer_spec`` (None: the byte tokenizer), its prompts rendered by the source's chat template with
    ``chat`` (``rl/chat``): always (true), never (false), or where the source has one (None)."""
    tokenizer: Tokenizer = ByteTokenizer() if not tokenizer_spec else load_tokenizer(dict(tokenizer_spec))
    if init_from.startswith("hf:") and tokenizer_folder(tokenizer_spec) is None:
        raise ConfigError(
            f"{INIT_FROM}={init_from} has no tokenizer.json; the policy reads prompts with its checkpoint's "
            "tokenizer: save the tokenizer beside the weights (tokenizer.save_pretrained(DIR))"
        )
    template: ChatTemplate | None = None
    if chat is None:
        template = found_template(init_from, root, tokenizer_spec)
    elif chat:
        template = source_template(init_from, root, tokenizer_spec)
    return PolicyText(tokenizer, template, stop_ids(tokenizer, tokenizer_folder(tokenizer_spec), template))


__all__ = [
    "PolicyText",
    "found_template",
    "kept_template",
    "policy_text",
    "source_template",
    "stop_ids",
    "template_file",
    "template_record",
    "tokenizer_folder",
]
