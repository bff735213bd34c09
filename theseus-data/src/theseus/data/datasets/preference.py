"""Preference data: a prompt with a chosen and a rejected response, for DPO-style training.

Rows are JSON lines in either of the two shapes TRL reads:

* standard: ``{"prompt": "...", "chosen": "...", "rejected": "..."}``, taken as raw text (the
  response follows the prompt directly and ends with the end-of-text token);
* conversational: ``{"prompt": [messages], "chosen": [assistant messages], "rejected": [...]}``,
  rendered with the chat template (``data/preference/template``, as ``dataset/chat`` does): the
  prompt with the template's generation prompt, each response as its continuation.

Each pair becomes two documents, chosen then rejected, in the same split; only the responses (and
their end-of-text) are learned. The ``"pairs"`` style reads them back as consecutive batch rows.
"""

from __future__ import annotations

import dataclasses
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

FIELDS = ("prompt", "chosen", "rejected")

Pair = tuple[Document, Document]


@dataclass
class Preference(Dataset):
    """Preference pairs from a JSONL file or folder (TRL's standard or conversational shape).

    A row may carry ``"split": "train"|"val"``: a file with such marks is split by them alone
    (``names_splits``), one without by ``data/val_fraction``, a pair at a time. ``data/max_documents``
    counts pairs.
    """

    name: ClassVar[str] = "preference"
    style: ClassVar[str] = "pairs"
    masked: ClassVar[bool] = True

    path: str = field("data/preference/path", default="", path="file", help="a JSONL file or folder of them")
    template: str = field(
        "data/preference/template",
        default="auto",
        help="chat template of conversational rows: auto | chatml | plain | phi3 | a tokenizer_config.json or .jinja",
    )
    tokenizer: str = tokenizer_field()

    def chat_template(self) -> ChatTemplate:
        """The template conversational rows are rendered with."""
        return ChatTemplate.for_tokenizer(self.template, self.tokenizer)

    def pairs(self) -> Iterator[Pair]:
        """Every pair of the files, chosen then rejected, in file order."""
        if not self.path:
            raise DataError("dataset 'preference' needs a path; pass data/preference/path=FILE.jsonl")
        template: ChatTemplate | None = None
        rows = differing = 0
        for file in find_files(self.path, JSONL_SUFFIXES, key="data/preference/path"):
            for where, value in json_lines(file):
                row = _row(value, where)
                if isinstance(row["prompt"], list) and template is None:
                    template = self.chat_template()
                chosen, rejected = _segments(row, where, template)
                split = row.get("split")
                split = split if split in (TRAIN, VAL) else None
                rows += 1
                differing += chosen != rejected
                yield _document(chosen, split), _document(rejected, split)
        if rows and not differing:
            raise DataError(
                f"every one of the {rows} rows of {self.path} has chosen = rejected, so there is no preference "
                "to learn; fix the data (each row needs two different responses)"
            )

    def source(self) -> Iterator[Document]:
        for chosen, rejected in self.pairs():
            yield chosen
            yield rejected

    def documents(self) -> Iterator[Document]:
        """Both documents of each pair, in one split; at most ``max_documents`` pairs."""
        routed = not self.names_splits()
        for index, (chosen, rejected) in enumerate(self.pairs()):
            if self.max_documents is not None and index >= self.max_documents:
                return
            split = chosen.split or (self.split_of(index) if routed else TRAIN)
            yield dataclasses.replace(chosen, split=split)
            yield dataclasses.replace(rejected, split=split)

    def names_splits(self) -> bool:
        return rows_name_splits(self.path, "data/preference/path")

    def estimated_documents(self) -> int | None:
        return None if self.max_documents is None else 2 * self.max_documents

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = self.path
        return {**info, **self.chat_template().record()}


def _row(row: Any, where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f'{where} is not a JSON object; each row is {{"prompt", "chosen", "rejected"}}')
    missing = [name for name in FIELDS if name not in row]
    if missing:
        raise DataError(
            f"{where} has no {' or '.join(repr(m) for m in missing)} field; each preference row needs "
            '"prompt", "chosen" and "rejected" (strings, or message lists)'
        )
    kinds = {type(row[name]) for name in FIELDS}
    if kinds not in ({str}, {list}):
        raise DataError(
            f"{where} mixes shapes: 'prompt', 'chosen' and 'rejected' must all be strings (standard) or all "
            "message lists (conversational)"
        )
    return row


def _segments(
    row: dict[str, Any], where: str, template: ChatTemplate | None
) -> tuple[tuple[tuple[str, bool], ...], tuple[tuple[str, bool], ...]]:
    """``(text, learned)`` pieces of the chosen and the rejected document."""
    if template is None:
        return ((row["prompt"], False), (row["chosen"], True)), ((row["prompt"], False), (row["rejected"], True))
    prompt = row["prompt"]
    check_messages(prompt, f"{where} 'prompt'")
    head = template.render(prompt, add_generation_prompt=True)
    out = []
    for name in ("chosen", "rejected"):
        response = row[name]
        check_messages(response, f"{where} {name!r}")
        if any(m["role"] != "assistant" for m in response):
            raise DataError(
                f"{where} {name!r} holds a message that is not the assistant's; responses are assistant turns"
            )
        full = template.conversation([*prompt, *response])  # without a closing eos_token
        if not full.startswith(head):
            raise DataError(
                f"{where}: chat template {template.name} does not render the response as a continuation of the "
                "prompt; choose another template with data/preference/template"
            )
        out.append(((head, False), (full[len(head) :], True)))
    return out[0], out[1]


def _document(segments: tuple[tuple[str, bool], ...], split: str | None) -> Document:
    return Document("".join(text for text, _ in segments), split=split, segments=segments)


__all__ = ["Preference"]
