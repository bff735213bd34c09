"""Chat data: conversations (``messages`` with roles) from JSON lines, learned only on assistant turns."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.data.chat import ChatTemplate, check_messages
from theseus.data.datasets.base import TRAIN, VAL, Dataset, Document
from theseus.data.datasets.hf import find_files
from theseus.data.datasets.local import JSONL_SUFFIXES, rows_name_splits
from theseus.data.json_lines import json_lines
from theseus.data.tokenizers.spec import tokenizer_field
from theseus.errors import DataError


@dataclass
class Chat(Dataset):
    """Conversations from a JSONL file or folder, rendered with a chat template.

    Each line is ``{"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}]}``
    (the field is ``data/chat/messages_field``) and may carry ``"split": "train"|"val"``: a file with
    such marks is split by them alone (``names_splits``), one without by ``data/val_fraction``. The
    conversation is rendered with ``data/chat/template``: ``auto`` (the ``chat_template`` of the
    ``tokenizer_config.json`` beside an ``hf:`` tokenizer, else ``chatml``), a built-in name
    (``chatml``, ``plain``, ``phi3``), or a path to a ``tokenizer_config.json`` or ``.jinja`` file. Only the
    assistant turns are learned: the prepared data stores a mask with the tokens. Read it in the
    ``"packed"`` style (the default) or ``"padded"``.
    """

    name: ClassVar[str] = "chat"
    style: ClassVar[str] = "packed"
    masked: ClassVar[bool] = True

    path: str = field("data/chat/path", default="", path="file", help="a JSONL file or folder of them")
    messages_field: str = field("data/chat/messages_field", default="messages", help="field holding the messages")
    template: str = field(
        "data/chat/template",
        default="auto",
        help="auto | chatml | plain | phi3 | a tokenizer_config.json or .jinja file",
    )
    tokenizer: str = tokenizer_field()

    def chat_template(self) -> ChatTemplate:
        """The template conversations are rendered with."""
        return ChatTemplate.for_tokenizer(self.template, self.tokenizer)

    def source(self) -> Iterator[Document]:
        if not self.path:
            raise DataError("dataset 'chat' needs a path; pass data/chat/path=FILE.jsonl")
        template = self.chat_template()
        for file in find_files(self.path, JSONL_SUFFIXES, key="data/chat/path"):
            for where, row in json_lines(file):
                messages = row.get(self.messages_field) if isinstance(row, dict) else None
                if messages is None:
                    raise DataError(
                        f"{where} has no {self.messages_field!r} field; each chat row needs "
                        f'"{self.messages_field}": [{{"role": ..., "content": ...}}] '
                        "(or set data/chat/messages_field)"
                    )
                check_messages(messages, where)
                try:
                    segments = template.segments(messages)
                except DataError as exc:
                    raise DataError(f"{where}: {exc}") from exc
                split = row.get("split")
                yield Document(
                    "".join(text for text, _ in segments),
                    split=split if split in (TRAIN, VAL) else None,
                    segments=segments,
                )

    def names_splits(self) -> bool:
        return rows_name_splits(self.path, "data/chat/path")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = self.path
        return {**info, **self.chat_template().record()}
