"""FineWeb through its local-files mode: parquet with the real schema -> token shards -> the same text."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.data.conftest import FINEWEB_COLUMNS, fineweb_rows, write_fineweb_parquet
from theseus.config import configuration, configure
from theseus.data.datasets import FineWeb
from theseus.data.prepare import prepare
from theseus.data.tokenizers import EOT_TEXT, ByteTokenizer, load_tokenizer
from theseus.data.tokenizers.bpe import train_bpe
from theseus.errors import DataError


def test_parquet_has_fineweb_schema(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    (path, *_) = write_fineweb_parquet(tmp_path / "fw", fineweb_rows(4), files=1)
    assert tuple(pq.read_schema(path).names) == FINEWEB_COLUMNS


def test_fineweb_local_files_to_shards_and_back(tmp_path: Path, root: Path) -> None:
    rows = fineweb_rows(40)
    write_fineweb_parquet(tmp_path / "fw", rows, files=3)
    with configuration({"data/fineweb/path": str(tmp_path / "fw"), "data/val_fraction": 0.25}):
        dataset = configure(FineWeb)
    prepared = prepare(dataset, root)

    # every 4th document (indices 3, 7, ...) is validation, in stream order
    train = [r["text"] for i, r in enumerate(rows) if i % 4 != 3]
    val = [r["text"] for i, r in enumerate(rows) if i % 4 == 3]
    tok = ByteTokenizer()
    assert prepared.folder == root / "data" / "fineweb"
    assert tok.decode(prepared.tokens("train")) == "".join(t + EOT_TEXT for t in train)
    assert tok.decode(prepared.tokens("val")) == "".join(t + EOT_TEXT for t in val)

    header = json.loads((prepared.folder / "header.json").read_text())
    assert header["dtype"] == "uint16" and header["vocab_size"] == 257 and header["eot_id"] == 256
    assert header["tokenizer"] == {"kind": "byte"}
    assert header["splits"]["train"] == {"tokens": sum(len(t.encode()) + 1 for t in train), "documents": 30}
    assert header["splits"]["val"]["documents"] == 10
    assert header["source"]["dataset"] == "fineweb"
    assert header["source"]["config"]["data/fineweb/path"] == str(tmp_path / "fw")
    # the index points at each document and its end-of-text
    starts, lengths = prepared.index("train")[:, 0], prepared.index("train")[:, 1]
    assert prepared.tokens("train")[starts + lengths - 1].tolist() == [256] * 30


def test_fineweb_max_documents_caps_the_stream(tmp_path: Path, root: Path) -> None:
    rows = fineweb_rows(30)
    write_fineweb_parquet(tmp_path / "fw", rows)
    prepared = prepare(FineWeb(path=str(tmp_path / "fw"), max_documents=10, val_fraction=0.1), root)
    assert prepared.header.splits["train"].documents == 9
    assert prepared.header.splits["val"].documents == 1
    assert ByteTokenizer().decode(prepared.tokens("val")) == rows[9]["text"] + EOT_TEXT


def test_fineweb_with_a_bpe_tokenizer_roundtrips(tmp_path: Path, root: Path) -> None:
    rows = fineweb_rows(40, seed=3)
    write_fineweb_parquet(tmp_path / "fw", rows)
    bpe = train_bpe((r["text"] for r in rows), tmp_path / "bpe.json", vocab_size=300)
    dataset = FineWeb(path=str(tmp_path / "fw"), val_fraction=0.25)
    prepared = prepare(dataset, root, tokenizer=f"hf:{bpe}")
    tok = prepared.tokenizer()
    assert prepared.header.tokenizer["path"] == "tokenizer.json"  # a copy travels with the data
    assert (prepared.folder / "tokenizer.json").read_bytes() == bpe.read_bytes()
    assert tok.vocab_size == prepared.header.vocab_size <= 300
    train = [r["text"] for i, r in enumerate(rows) if i % 4 != 3]
    assert tok.decode(prepared.tokens("train")) == "".join(t + EOT_TEXT for t in train)
    # fewer tokens than bytes: the merges are used
    assert prepared.header.splits["train"].tokens < sum(len(t.encode()) for t in train)
    assert load_tokenizer(prepared.tokenizer_spec).encode("the model") == tok.encode("the model")


def test_fineweb_errors_are_one_line(tmp_path: Path, root: Path) -> None:
    with pytest.raises(DataError, match=r"data/fineweb/path=.* does not exist"):
        prepare(FineWeb(path=str(tmp_path / "missing")), root)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no \.parquet files"):
        prepare(FineWeb(path=str(tmp_path / "empty")), root)
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "wrong").mkdir()
    pq.write_table(pa.table({"content": ["a", "b"]}), tmp_path / "wrong" / "x.parquet")
    with pytest.raises(DataError, match="no column 'text'"):
        prepare(FineWeb(path=str(tmp_path / "wrong")), root)
    assert not (root / "data" / "fineweb").exists()


def test_fineweb_hub_mode_offline_says_how_to_use_local_files(root: Path) -> None:
    with pytest.raises(DataError) as info:
        prepare(FineWeb(subset="sample-10BT", max_documents=5), root)
    assert "HuggingFaceFW/fineweb" in str(info.value) and "data/fineweb/path" in str(info.value)
    assert "\n" not in str(info.value)


def test_fineweb_rows_keep_every_column(tmp_path: Path) -> None:
    rows = fineweb_rows(3)
    write_fineweb_parquet(tmp_path / "fw", rows, files=1)
    got = list(FineWeb(path=str(tmp_path / "fw")).rows())
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    assert set(got[0]) == set(FINEWEB_COLUMNS)
    assert np.isclose(got[1]["language_score"], rows[1]["language_score"])
