"""prepare(): atomic writes, no-op re-runs, force, parallel workers, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theseus.data.datasets import Dataset, Document, LocalText, PythonStdlib
from theseus.data.format import Prepared, data_folder, read_header
from theseus.data.prepare import prepare
from theseus.data.tokenizers import EOT_TEXT, ByteTokenizer
from theseus.data.tokenizers.bpe import train_bpe
from theseus.errors import DataError


class Exploding(Dataset):
    """Yields a few documents, then fails like a dropped connection."""

    name = "exploding"

    def source(self):
        for i in range(3000):
            if i == 2500:
                raise DataError("connection lost")
            yield Document(f"document {i} " * 50)


def listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if ".lock" not in p.name)


def test_interrupted_run_leaves_nothing_that_looks_complete(root: Path) -> None:
    with pytest.raises(DataError, match="connection lost"):
        prepare(Exploding(val_fraction=0.1), root)
    # no shard, no header; at most the hidden staging folder of committed chunks, to continue from
    assert [p for p in listing(root) if not p.startswith("data/.exploding.partial")] == ["data"]
    assert not list(root.rglob("header.json"))
    with pytest.raises(DataError, match="is not prepared"):
        Prepared.open(root, "exploding")


def test_failed_forced_rerun_keeps_the_previous_data(root: Path) -> None:
    first = prepare(PythonStdlib(max_documents=4, val_fraction=0.25), root, name="exploding")
    before = first.tokens("train").copy()
    with pytest.raises(DataError, match="connection lost"):
        prepare(Exploding(val_fraction=0.1), root, force=True)
    again = Prepared.open(root, "exploding")
    assert np.array_equal(again.tokens("train"), before)
    assert sorted(p.name for p in (root / "data").iterdir() if not p.name.endswith(".lock")) == ["exploding"]


def test_staging_folders_of_killed_runs_are_cleaned_up(root: Path) -> None:
    stale = root / "data" / ".python-stdlib.partial-123-abcdef01"
    stale.mkdir(parents=True)
    (stale / "train.bin").write_bytes(b"\0" * 10)
    prepare(PythonStdlib(max_documents=4, val_fraction=0.25), root)
    assert not stale.exists()


def test_rerun_is_a_noop_and_force_rewrites(root: Path) -> None:
    dataset = PythonStdlib(max_documents=4, val_fraction=0.25)
    first = prepare(dataset, root)
    header = first.folder / "header.json"
    stamp = header.stat().st_mtime_ns
    again = prepare(dataset, root)
    assert header.stat().st_mtime_ns == stamp and again.header == first.header
    forced = prepare(dataset, root, force=True)
    assert header.stat().st_mtime_ns != stamp
    assert np.array_equal(forced.tokens("train"), first.tokens("train"))


def test_rerun_with_other_settings_is_refused(root: Path, tmp_path: Path) -> None:
    prepare(PythonStdlib(max_documents=4, val_fraction=0.25), root)
    with pytest.raises(DataError, match=r"data/max_documents=4 \(now 8\).*data/force=true"):
        prepare(PythonStdlib(max_documents=8, val_fraction=0.25), root)
    bpe = train_bpe(["some text " * 20, "more text"], tmp_path / "t.json", vocab_size=300)
    with pytest.raises(DataError, match=r"prepared with tokenizer \{'kind': 'byte'\}.*data/force=true"):
        prepare(PythonStdlib(max_documents=4, val_fraction=0.25), root, tokenizer=f"hf:{bpe}")


def test_parallel_workers_write_the_same_shards(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import theseus.data.prepare as module

    monkeypatch.setattr(module, "CHUNK_DOCUMENTS", 4)  # several chunks in flight, returned in order
    dataset = PythonStdlib(max_documents=30, val_fraction=0.1)
    one = prepare(dataset, root, name="w1", workers=1)
    two = prepare(dataset, root, name="w2", workers=2)
    for split in ("train", "val"):
        assert np.array_equal(one.tokens(split), two.tokens(split))
        assert np.array_equal(one.index(split), two.index(split))


def test_uint32_shards_for_large_vocabularies(root: Path) -> None:
    class BigVocab(ByteTokenizer):
        vocab_size = 70_000
        eot_id = 69_999

    prepared = prepare(PythonStdlib(max_documents=3, val_fraction=0.34), root, tokenizer=BigVocab())
    assert prepared.header.dtype == "uint32" and prepared.tokens("train").dtype == np.uint32
    assert int(prepared.tokens("train")[-1]) == 69_999
    assert (prepared.folder / "train.bin").stat().st_size == 4 * prepared.header.splits["train"].tokens


def test_empty_split_and_empty_dataset_are_errors(root: Path, tmp_path: Path) -> None:
    (tmp_path / "one.txt").write_text("only one document")
    with pytest.raises(DataError, match=r"split 'val' of 'local' got no documents.*data/val_fraction"):
        prepare(LocalText(path=str(tmp_path / "one.txt"), val_fraction=0.1), root)
    (tmp_path / "blank.txt").write_text("")
    with pytest.raises(DataError, match="yielded no documents"):
        prepare(LocalText(path=str(tmp_path / "blank.txt")), root, name="blank")
    assert not data_folder(root, "local").exists()


def test_changed_tokenizer_file_is_a_mismatch(root: Path, tmp_path: Path) -> None:
    bpe = train_bpe(["alpha beta gamma " * 30, "delta"], tmp_path / "t.json", vocab_size=280)
    prepared = prepare(PythonStdlib(max_documents=3, val_fraction=0.34), root, tokenizer=f"hf:{bpe}")
    spec = json.loads((prepared.folder / "header.json").read_text())["tokenizer"]
    assert spec["kind"] == "hf" and len(spec["sha256"]) == 64
    (prepared.folder / "tokenizer.json").write_text((prepared.folder / "tokenizer.json").read_text() + " ")
    with pytest.raises(DataError, match=r"does not match the one the data was prepared with.*data/force=true"):
        prepared.tokenizer()


def test_header_is_written_last_and_describes_the_shards(root: Path) -> None:
    prepared = prepare(PythonStdlib(max_documents=5, val_fraction=0.2), root)
    header = read_header(prepared.folder)
    for split, info in header.splits.items():
        assert (prepared.folder / f"{split}.bin").stat().st_size == 2 * info.tokens
        assert (prepared.folder / f"{split}.idx").stat().st_size == 24 * info.documents
    tok = ByteTokenizer()
    docs = [tok.decode(d) for d in prepared.documents("train")]
    assert all(d.endswith(EOT_TEXT) for d in docs) and len(docs) == 4
