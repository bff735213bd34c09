"""Instruction data: prompt + response pairs from JSON lines, learned only on the response."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from theseus.config import field
from theseus.data.datasets.base import TRAIN, VAL, Dataset, Document
from theseus.data.datasets.hf import find_files
from theseus.data.datasets.local import JSONL_SUFFIXES, read_jsonl, rows_name_splits
from theseus.errors import DataError


@dataclass
class Instructions(Dataset):
    """Prompt/response pairs from a JSONL file or folder, prepared for the ``"padded"`` style.

    Each line is an object with a prompt and a response field (``data/instructions/prompt_field``,
    ``data/instructions/response_field``). The prompt is formatted with ``data/instructions/template``
    (``{prompt}`` is replaced) and tokenized ahead of the response; in the padded style the loss
    covers only the response and its end-of-text. A line may carry ``"split": "train"|"val"``:
    a file with such marks is split by them alone (``names_splits``), one without by ``data/val_fraction``.
    """

    name: ClassVar[str] = "instructions"
    style: ClassVar[str] = "padded"

    path: str = field("data/instructions/path", default="", path="file", help="a JSONL file or folder of them")
    prompt_field: str = field("data/instructions/prompt_field", default="prompt", help="field holding the prompt")
    response_field: str = field(
        "data/instructions/response_field", default="response", help="field holding the response"
    )
    template: str = field(
        "data/instructions/template", default="{prompt}\n", help="how a prompt is written before its response"
    )

    def format_prompt(self, prompt: str) -> str:
        if "{prompt}" not in self.template:
            raise DataError(
                f"data/instructions/template={self.template!r} has no '{{prompt}}'; "
                "e.g. 'User: {prompt}\\nAssistant: '"
            )
        return self.template.replace("{prompt}", prompt)

    def source(self) -> Iterator[Document]:
        if not self.path:
            raise DataError("dataset 'instructions' needs a path; pass data/instructions/path=FILE.jsonl")
        files = find_files(self.path, JSONL_SUFFIXES, key="data/instructions/path")
        fields = (self.prompt_field, self.response_field)
        for file in files:
            for row in read_jsonl(file, fields, "data/instructions/prompt_field / response_field"):
                split = row.get("split")
                yield Document(
                    row[self.response_field],
                    prompt=self.format_prompt(row[self.prompt_field]),
                    split=split if split in (TRAIN, VAL) else None,
                )

    def names_splits(self) -> bool:
        return rows_name_splits(self.path, "data/instructions/path")

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info["origin"] = self.path
        return info
