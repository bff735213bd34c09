"""The built-in pretraining jobs prepare the offline corpus they read when it is missing."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from theseus.data.format import data_folder, preparation_lock
from theseus.errors import DataError
from theseus.training.flywheel.strategy import Sampling
from theseus.training.pretrain import Pretrain, prepare_offline_corpus


def documents(root: Path) -> int:
    header = json.loads((data_folder(root, "python-stdlib") / "header.json").read_text())
    return sum(split["documents"] for split in header["splits"].values())


@pytest.mark.parametrize("model", ["gpt", "llama"])
def test_pretraining_prepares_the_missing_corpus_byte_level(model: str, tmp_path: Path) -> None:
    trainer = Pretrain.create(tmp_path, {"model": model, "data/max_documents": 8, "data/val_fraction": 0.25})
    prepare_offline_corpus(trainer)
    assert documents(tmp_path) == 8
    header = json.loads((data_folder(tmp_path, "python-stdlib") / "header.json").read_text())
    assert header["tokenizer"] == {"kind": "byte"} and header["splits"]["val"]["documents"] == 2


def test_data_prepared_earlier_is_read_as_it_is(tmp_path: Path) -> None:
    prepare_offline_corpus(Pretrain.create(tmp_path, {"data/max_documents": 8, "data/val_fraction": 0.25}))
    before = (data_folder(tmp_path, "python-stdlib") / "train.bin").stat().st_mtime_ns
    prepare_offline_corpus(Pretrain.create(tmp_path, {"data/max_documents": 12, "data/val_fraction": 0.25}))
    assert documents(tmp_path) == 8
    assert (data_folder(tmp_path, "python-stdlib") / "train.bin").stat().st_mtime_ns == before


def test_a_subclass_reading_other_data_prepares_nothing(tmp_path: Path) -> None:
    class OtherData(Pretrain):
        DATASET = Sampling("somewhere-else", 1.0, "pmd")

    prepare_offline_corpus(OtherData.create(tmp_path, {}))
    assert not (tmp_path / "data").exists()


def test_a_bad_corpus_setting_is_a_data_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="data/val_fraction must lie in"):
        prepare_offline_corpus(Pretrain.create(tmp_path, {"data/val_fraction": 1.5}))


def test_a_second_process_waits_for_the_one_preparing(tmp_path: Path) -> None:
    trainer = Pretrain.create(tmp_path, {"data/max_documents": 8, "data/val_fraction": 0.25})
    failures: list[BaseException] = []

    def prepare() -> None:
        try:
            prepare_offline_corpus(trainer, wait=60)
        except BaseException as exc:
            failures.append(exc)

    with preparation_lock(tmp_path, "python-stdlib"):  # as another process preparing it would
        waiting = threading.Thread(target=prepare)
        waiting.start()
        time.sleep(0.6)
        assert waiting.is_alive() and not (data_folder(tmp_path, "python-stdlib") / "header.json").exists()
    waiting.join(timeout=60)
    assert not waiting.is_alive() and not failures
    assert documents(tmp_path) == 8


def test_waiting_for_another_preparer_has_a_limit(tmp_path: Path) -> None:
    trainer = Pretrain.create(tmp_path, {"data/max_documents": 8})
    with preparation_lock(tmp_path, "python-stdlib"), pytest.raises(DataError, match="another process is preparing"):
        prepare_offline_corpus(trainer, wait=0.3)
