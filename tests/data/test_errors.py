"""Every data mistake is one DataError line that names the problem and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.data.conftest import write_prepared
from theseus.data.datasets import FineWeb, PythonStdlib
from theseus.data.prepare import prepare
from theseus.errors import DataError
from theseus.training.flywheel import Flywheel, Sampling, Strategy


def fail(match: str, fn, *args, **kwargs) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(DataError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


def docs(count: int, length: int = 40) -> list[list[int]]:
    return [[(i * 7 + j) % 200 for j in range(length)] for i in range(count)]


def test_missing_data_prints_the_exact_command(root: Path) -> None:
    message = fail("is not prepared", Flywheel, Sampling(FineWeb, 1.0, "pmd"), root=root, block_size=8, batch_size=2)
    assert message.endswith(f"prepare it with: theseus run data/tokenize data/dataset=fineweb --root {root}")
    message = fail("is not prepared", Flywheel, "python-stdlib", root=root, block_size=8, batch_size=2)
    command = message.split("prepare it with: ")[1]
    assert command == f"theseus run data/tokenize data/dataset=python-stdlib --root {root}"
    # the printed command really prepares what the loader needs (here with a small cap added)
    from theseus.cli.main import main

    main([*command.split()[1:], "data/max_documents=5", "data/val_fraction=0.2"])
    Flywheel("python-stdlib", root=root, block_size=8, batch_size=2).close()


def test_incomplete_folder_is_reported_as_such(root: Path) -> None:
    (root / "data" / "half").mkdir(parents=True)
    (root / "data" / "half" / "train.bin").write_bytes(b"\0" * 100)
    fail(
        r"'half' is incomplete \(no header.json\).*theseus run data/tokenize",
        Flywheel,
        "half",
        root=root,
        block_size=8,
        batch_size=2,
    )


def test_truncated_or_corrupt_shard(root: Path) -> None:
    prepared = write_prepared(root, "cut", {"train": docs(20), "val": docs(5)})
    path = prepared.folder / "train.bin"
    path.write_bytes(path.read_bytes()[:-10])
    fail(
        r"train.bin has \d+ bytes but the header promises \d+ .*corrupt or truncated.*data/force=true",
        Flywheel,
        "cut",
        root=root,
        block_size=8,
        batch_size=2,
    )
    (prepared.folder / "val.idx").unlink()
    (prepared.folder / "header.json").write_text('{"format": "theseus-tokens", "version": 1')
    fail("header.json is unreadable", Flywheel, "cut", root=root, block_size=8, batch_size=2)


def test_tokenizer_mismatch_between_sources(root: Path) -> None:
    write_prepared(root, "a", {"train": docs(20), "val": docs(5)}, tokenizer={"kind": "byte"}, vocab_size=257)
    write_prepared(root, "b", {"train": docs(20), "val": docs(5)}, tokenizer={"kind": "hf", "sha256": "x"})
    fail(
        "were prepared with different tokenizers.*data/force=true",
        Flywheel,
        [Sampling("a", 0.5), Sampling("b", 0.5)],
        root=root,
        block_size=8,
        batch_size=2,
    )


def test_tokenizer_changed_since_preparation(root: Path) -> None:
    write_prepared(root, "wrongvocab", {"train": docs(20), "val": docs(5)}, tokenizer={"kind": "byte"}, vocab_size=300)
    with Flywheel("wrongvocab", root=root, block_size=8, batch_size=2) as fw:
        fail("now has vocabulary 257.*says 300.*data/force=true", fw.tokenizer)


def test_empty_split(root: Path) -> None:
    write_prepared(root, "noval", {"train": docs(20), "val": []})
    fail(
        "split 'val' of dataset 'noval' is empty.*data/val_fraction",
        Flywheel,
        "noval",
        root=root,
        block_size=8,
        batch_size=2,
    )
    write_prepared(root, "trainonly", {"train": docs(20)})
    with Flywheel("trainonly", root=root, block_size=8, batch_size=2) as fw:
        fail("has no 'val' split.*data/val_fraction", fw.batch, 0, "val")


def test_rates_must_be_positive_and_sum_to_one(root: Path) -> None:
    message = fail(
        r"sampling rates \(a=0.5, b=0.4\) sum to 0.9; make them sum to 1",
        Strategy,
        [Sampling("a", 0.5), Sampling("b", 0.4)],
    )
    assert "a=0.5" in message
    fail("sum to 1.2", Flywheel, [Sampling("a", 0.6), Sampling("b", 0.6)], root=root, block_size=8, batch_size=2)
    fail("rate must be a number above 0", Sampling, "a", 0.0)
    fail("rate must be a number above 0", Sampling, "a", -1)
    fail("style 'stacked' .* is not one of pmd, padded, packed", Sampling, "a", 1.0, "stacked")
    fail("no dataset to sample from", Strategy, [])
    Strategy([Sampling("a", 0.1), Sampling("b", 0.2), Sampling("c", 0.7)])  # 0.1 + 0.2 + 0.7 within 1e-6


def test_block_size_longer_than_every_document_in_padded_style(root: Path) -> None:
    write_prepared(root, "short", {"train": docs(20, 30), "val": docs(4, 30)}, style="padded")
    fail(
        "block_size 64 is longer than every document of 'short'.*at most 30 or use the 'pmd' style",
        Flywheel,
        "short",
        root=root,
        block_size=64,
        batch_size=2,
    )
    Flywheel("short", root=root, block_size=30, batch_size=2).close()
    Flywheel(Sampling("short", 1.0, "pmd"), root=root, block_size=64, batch_size=2).close()


def test_split_too_small_for_windows_or_batch_not_splittable(root: Path) -> None:
    write_prepared(root, "tiny", {"train": docs(3, 10), "val": docs(3, 10)})
    fail(
        r"has 33 tokens, too few for windows of block_size\+1=65 tokens; lower block_size",
        Flywheel,
        "tiny",
        root=root,
        block_size=64,
        batch_size=2,
    )
    fail(
        "cannot be split into 2 micro-batches over 3 processes; make batch_size a multiple of 6",
        Flywheel,
        "tiny",
        root=root,
        block_size=4,
        batch_size=8,
        process_index=0,
        process_count=3,
        micro_batches=2,
    )


def test_model_vocabulary_or_block_size_too_small(root: Path) -> None:
    write_prepared(root, "bytes", {"train": docs(20), "val": docs(5)}, tokenizer={"kind": "byte"}, vocab_size=257)
    with Flywheel("bytes", root=root, block_size=16, batch_size=2) as fw:
        fail(
            r"model vocabulary 256 is smaller than the tokenizer's 257.*set architecture/vocab_size=257",
            fw.check_model,
            256,
            16,
        )
        fail("the model's block_size is 8; set architecture/block_size>=16", fw.check_model, 300, 8)


def test_bad_loader_arguments(root: Path) -> None:
    write_prepared(root, "ok", {"train": docs(20), "val": docs(5)})
    fail("block_size must be an integer >= 1", Flywheel, "ok", root=root, block_size=0, batch_size=2)
    fail(
        "process_index 2 must lie in",
        Flywheel,
        "ok",
        root=root,
        block_size=8,
        batch_size=2,
        process_index=2,
        process_count=2,
    )
    with Flywheel("ok", root=root, block_size=8, batch_size=2) as fw:
        fail("step must be an integer >= 0", fw.batch, -1)


def test_prepare_errors_name_the_fix(root: Path) -> None:
    fail("cannot name a folder", prepare, PythonStdlib(max_documents=2), root, name="../x")
