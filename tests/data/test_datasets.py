"""Datasets: the stdlib corpus, local files, instruction data, split routing and registration."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest

from tests.data.conftest import fineweb_rows, write_fineweb_parquet
from theseus.config import Schema
from theseus.data.datasets import Chat, Dataset, Document, FineWeb, Instructions, LocalText, PythonStdlib
from theseus.data.jobs import Tokenize
from theseus.data.prepare import prepare
from theseus.data.tokenizers import EOT_TEXT, ByteTokenizer
from theseus.errors import DataError
from theseus.registry import get_registry


def test_datasets_are_registered_under_their_folder_names() -> None:
    registry = get_registry()
    for cls in (PythonStdlib, FineWeb, LocalText, Instructions):
        assert registry.load_component("dataset", cls.name) is cls
    assert Instructions.style == "padded" and PythonStdlib.style == "pmd"


def test_tokenize_schema_holds_every_dataset_key() -> None:
    keys = Schema.build(Tokenize.config()).keys()
    for key in (
        "data/dataset",
        "data/tokenizer",
        "data/force",
        "data/max_documents",
        "data/val_fraction",
        "data/fineweb/subset",
        "data/fineweb/path",
        "data/local/path",
        "data/instructions/path",
        "data/python-stdlib/include_tests",
    ):
        assert key in keys


class Numbers(Dataset):
    name = "numbers"

    def source(self):
        for i in range(50):
            yield Document("" if i == 5 else f"doc {i}")


def test_split_routing_spreads_validation_evenly_and_skips_empty_documents() -> None:
    docs = list(Numbers(val_fraction=0.1).documents())
    assert len(docs) == 49  # the empty one is skipped
    val = [d.text for d in docs if d.split == "val"]
    assert val == ["doc 10", "doc 20", "doc 30", "doc 40"]  # kept-document indices 9, 19, 29, 39
    assert [d.text for d in Numbers(val_fraction=0.1, max_documents=12).documents()] == [d.text for d in docs[:12]]
    assert all(d.split == "train" for d in Numbers(val_fraction=0.0).documents())
    with pytest.raises(DataError, match="data/val_fraction"):
        Numbers(val_fraction=1.5)


def test_a_file_that_marks_its_splits_is_split_by_the_marks_alone(tmp_path: Path) -> None:
    # as rl/demonstrations writes them: the held-out rows say "val", the others say nothing
    chats = [
        {"messages": [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]}
        for i in range(8)
    ]
    marked = [{**chat, "split": "val"} if i in (2, 5) else chat for i, chat in enumerate(chats)]
    for name, rows in (("marked", marked), ("plain", chats)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))

    def val_rows(name: str) -> list[str]:
        dataset = Chat(path=str(tmp_path / f"{name}.jsonl"), template="plain", val_fraction=0.25)
        return [doc.segments[-1][0].strip() for doc in dataset.documents() if doc.split == "val"]

    assert val_rows("marked") == ["a2", "a5"]  # data/val_fraction routes none of the others
    assert val_rows("plain") == ["a3", "a7"]  # without marks, data/val_fraction splits
    assert Chat(path=str(tmp_path / "marked.jsonl"), val_fraction=0.25).splits == ("train",)  # val comes with its rows
    pairs = [{"prompt": f"p{i}", "response": f"r{i}", **({"split": "val"} if i == 1 else {})} for i in range(8)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in pairs))
    documents = Instructions(path=str(tmp_path / "pairs.jsonl"), val_fraction=0.25).documents()
    assert [doc.text for doc in documents if doc.split == "val"] == ["r1"]


def test_stdlib_corpus_is_the_interpreters_library_without_installed_packages() -> None:
    dataset = PythonStdlib()
    files = dataset.files()
    rels = [rel for rel, _ in files]
    assert rels == sorted(rels) and "os.py" in rels and "json/decoder.py" in rels
    assert not any("site-packages" in r or r.startswith("test/") for r in rels)
    root = Path(sysconfig.get_paths()["stdlib"])
    assert all(path == root / rel for rel, path in files[:20])
    assert len(PythonStdlib(include_tests=True).files()) > len(files)


def test_stdlib_prepare_is_deterministic_and_small_with_a_cap(tmp_path: Path) -> None:
    dataset = PythonStdlib(max_documents=12, val_fraction=0.25)
    a = prepare(dataset, tmp_path / "a")
    b = prepare(dataset, tmp_path / "b")
    for split in ("train", "val"):
        assert np.array_equal(a.tokens(split), b.tokens(split))
    assert a.header.splits["train"].documents == 9 and a.header.splits["val"].documents == 3
    first = dataset.files()[0][1].read_text(encoding="utf-8")
    assert ByteTokenizer().decode(a.tokens("train")[: len(first.encode()) + 1]) == first + EOT_TEXT
    assert a.header.source["python"] and a.header.source["dataset"] == "python-stdlib"


def test_local_text_jsonl_and_parquet(tmp_path: Path, root: Path) -> None:
    (tmp_path / "txt" / "sub").mkdir(parents=True)
    (tmp_path / "txt" / "a.txt").write_text("first file\n")
    (tmp_path / "txt" / "sub" / "b.txt").write_text("second file, ünïcode\n")
    prepared = prepare(LocalText(path=str(tmp_path / "txt"), val_fraction=0.5), root, name="texts")
    tok = ByteTokenizer()
    assert tok.decode(prepared.tokens("train")) == "first file\n" + EOT_TEXT
    assert tok.decode(prepared.tokens("val")) == "second file, ünïcode\n" + EOT_TEXT
    assert prepared.folder == root / "data" / "texts"

    lines = [{"body": f"line {i}"} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    local = LocalText(path=str(tmp_path / "d.jsonl"), text_field="body", val_fraction=0.5)
    prepared = prepare(local, root, name="lines")
    assert tok.decode(prepared.tokens("train")) == f"line 0{EOT_TEXT}line 2{EOT_TEXT}"

    rows = fineweb_rows(6)
    write_fineweb_parquet(tmp_path / "pq", rows, files=2)
    prepared = prepare(LocalText(path=str(tmp_path / "pq"), val_fraction=0.5), root, name="pq")
    assert tok.decode(prepared.tokens("val")) == "".join(rows[i]["text"] + EOT_TEXT for i in (1, 3, 5))


def test_local_errors(tmp_path: Path, root: Path) -> None:
    with pytest.raises(DataError, match="needs a path; pass data/local/path="):
        prepare(LocalText(), root)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 is not valid JSON"):
        prepare(LocalText(path=str(tmp_path / "bad.jsonl"), val_fraction=0), root)
    (tmp_path / "field.jsonl").write_text('{"content": "x"}\n')
    with pytest.raises(DataError, match="needs string field"):
        prepare(LocalText(path=str(tmp_path / "field.jsonl")), root)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "x.dat").write_bytes(b"\0")
    with pytest.raises(DataError, match="set data/local/format"):
        prepare(LocalText(path=str(tmp_path / "bin")), root)


def test_instructions_record_prompt_lengths(tmp_path: Path, root: Path) -> None:
    pairs = [
        {"prompt": "2+2?", "response": "4"},
        {"prompt": "capital of France?", "response": "Paris", "split": "val"},
        {"prompt": "say hi", "response": "hi there"},
    ]
    (tmp_path / "chat.jsonl").write_text("\n".join(json.dumps(p) for p in pairs))
    dataset = Instructions(path=str(tmp_path / "chat.jsonl"), template="Q: {prompt}\nA: ", val_fraction=0.0)
    prepared = prepare(dataset, root)
    assert prepared.header.style == "padded"
    index = prepared.index("train")
    assert index[:, 2].tolist() == [len("Q: 2+2?\nA: "), len("Q: say hi\nA: ")]
    tok = ByteTokenizer()
    docs = [tok.decode(d) for d in prepared.documents("train")]
    assert docs == [f"Q: 2+2?\nA: 4{EOT_TEXT}", f"Q: say hi\nA: hi there{EOT_TEXT}"]
    assert [tok.decode(d) for d in prepared.documents("val")] == [f"Q: capital of France?\nA: Paris{EOT_TEXT}"]
    with pytest.raises(DataError, match="has no '\\{prompt\\}'"):
        prepare(Instructions(path=str(tmp_path / "chat.jsonl"), template="no slot"), root, name="x", force=True)
