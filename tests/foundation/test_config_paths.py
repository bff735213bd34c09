"""Path fields (``field(..., path=KIND)``) are made absolute at the CLI edge, each kind its own way."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from theseus.config import Schema, field
from theseus.config.paths import absolute_paths, absolute_value
from theseus.errors import ConfigError


@pytest.mark.parametrize(
    ("value", "kind", "expected"),
    [
        ("out/merged", "file", "{cwd}/out/merged"),
        ("../x/./y", "file", "{parent}/x/y"),
        ("/abs/file.jsonl", "file", "/abs/file.jsonl"),
        ("", "file", ""),
        ("./gpt2", "source", "{cwd}/gpt2"),
        ("existing", "source", "{cwd}/existing"),
        ("openai-community/gpt2", "source", "openai-community/gpt2"),  # a hub id stays one
        ("hf:./gpt2/tokenizer.json", "spec", "hf:{cwd}/gpt2/tokenizer.json"),
        ("hf:existing", "spec", "hf:{cwd}/existing"),
        ("hf:org/model", "spec", "hf:org/model"),
        ("run:base@4", "spec", "run:base@4"),
        ("byte", "spec", "byte"),
        ("tiktoken:gpt2", "spec", "tiktoken:gpt2"),
    ],
)
def test_each_kind_resolves_against_the_working_directory(value: str, kind: str, expected: str, tmp_path: Path) -> None:
    cwd = tmp_path / "cwd"
    (cwd / "existing").mkdir(parents=True)
    assert absolute_value(value, kind, cwd) == expected.format(cwd=cwd, parent=tmp_path)


def test_the_schema_names_the_keys_to_resolve(tmp_path: Path) -> None:
    @dataclass
    class Paths:
        out: str = field("x/out", default="", path="file")
        name: str = field("x/name", default="")

    schema = Schema.build([Paths])
    values = absolute_paths({"x/out": "a/b", "x/name": "a/b"}, schema, tmp_path)
    assert values == {"x/out": str(tmp_path / "a" / "b"), "x/name": "a/b"}


def test_an_unknown_path_kind_is_refused() -> None:
    with pytest.raises(ConfigError, match="path='folder' is not a path kind; use one of file, source, spec"):
        field("x/y", default="", path="folder")
