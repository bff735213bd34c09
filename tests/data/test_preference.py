"""``dataset/preference``: TRL's standard and conversational rows become pairs of documents whose
responses alone are learned, one split per pair; the ``"pairs"`` style puts each pair in two
consecutive batch rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.finetune.conftest import preference_rows, write_jsonl
from theseus.config import configuration, configure
from theseus.data.datasets import Preference
from theseus.data.format import Prepared
from theseus.data.prepare import prepare
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.training.flywheel import Flywheel, Sampling


def prepared(root: Path, rows: list[dict], **settings: object) -> Prepared:
    path = write_jsonl(root / "pairs.jsonl", rows)
    with configuration({"data/preference/path": str(path), "data/preference/template": "plain", **settings}):
        dataset = configure(Preference)
    prepare(dataset, root, tokenizer="byte", progress=False)
    return Prepared.open(root, "preference")


def documents(data: Prepared, split: str) -> list[tuple[str, str]]:
    """``(text, learned text)`` of every document of ``split``, end-of-text left out."""
    tokens, index, learned = data.tokens(split), data.index(split), data.learned(split)
    decode = ByteTokenizer().decode
    out = []
    for start, length, _ in index.tolist():
        ids = tokens[start : start + length - 1]
        mask = learned[start : start + length - 1].astype(bool)
        assert learned[start + length - 1] == 1  # the end-of-text closes the learned response
        out.append((decode(ids.tolist()), decode(ids[mask].tolist())))
    return out


def test_standard_rows_are_raw_text_with_only_the_responses_learned(tmp_path: Path) -> None:
    rows = preference_rows(16)
    data = prepared(tmp_path, rows)
    train = documents(data, "train")
    assert len(train) == 2 * 14 and len(documents(data, "val")) == 2 * 2  # rows 7 and 15 say "val"
    kept = [row for index, row in enumerate(rows) if index % 8 != 7]
    for row, chosen, rejected in zip(kept, train[0::2], train[1::2], strict=True):
        assert chosen == (row["prompt"] + row["chosen"], row["chosen"])
        assert rejected == (row["prompt"] + row["rejected"], row["rejected"])


def test_conversational_rows_are_rendered_with_the_chat_template(tmp_path: Path) -> None:
    rows = preference_rows(8, conversational=True)
    data = prepared(tmp_path, rows)
    chosen, rejected = documents(data, "train")[:2]
    question, answer = rows[0]["prompt"][0]["content"], rows[0]["chosen"][0]["content"]
    assert chosen == (f"User: {question}\nAssistant: {answer}\n", f"{answer}\n")
    assert rejected[0].startswith(f"User: {question}\nAssistant: nope")
    assert data.header.source["chat_template"].startswith("{% for m in messages %}")


def test_pairs_are_routed_and_capped_together(tmp_path: Path) -> None:
    rows = [{k: v for k, v in row.items() if k != "split"} for row in preference_rows(40)]
    data = prepared(tmp_path, rows, **{"data/val_fraction": 0.25, "data/max_documents": 20})
    train, val = documents(data, "train"), documents(data, "val")
    assert (len(train), len(val)) == (2 * 15, 2 * 5)  # 20 pairs, a quarter of them held out, never split
    for chosen, rejected in zip(train[0::2] + val[0::2], train[1::2] + val[1::2], strict=True):
        assert chosen[0][: -len(chosen[1])] == rejected[0][: -len(rejected[1])]  # one prompt per pair


def test_the_pairs_style_keeps_a_pair_in_consecutive_rows(tmp_path: Path) -> None:
    data = prepared(tmp_path, preference_rows(32))
    train = documents(data, "train")
    with Flywheel(Sampling("preference", 1.0, "pairs"), root=tmp_path, block_size=40, batch_size=8, seed=3) as wheel:
        batch = wheel.batch(0)
        other = Flywheel(
            Sampling("preference", 1.0, "pairs"),
            root=tmp_path,
            block_size=40,
            batch_size=8,
            seed=3,
            process_index=1,
            process_count=2,
            prefetch=0,
        )
        assert np.array_equal(other.batch(0)["x"], batch["x"][4:])  # the same rows on any process count
        other.close()
    document = batch["document"]
    assert np.array_equal(document[0::2] + 1, document[1::2]) and np.all(document[0::2] % 2 == 0)
    decode = ByteTokenizer().decode
    for row, doc in enumerate(document.tolist()):
        text, learned = train[doc]
        real = batch["padding_mask"][row]
        assert decode(batch["x"][row][real].tolist()) == text  # the whole document, then padding
        targets = batch["y"][row]
        assert decode(targets[(targets != -1) & (targets != ByteTokenizer().eot_id)].tolist()) == learned


def test_the_pairs_style_refuses_data_that_is_not_pairs(tmp_path: Path) -> None:
    from theseus.data.datasets import PythonStdlib
    from theseus.errors import DataError

    prepare(PythonStdlib(max_documents=5, val_fraction=0.0), tmp_path, progress=False)
    with pytest.raises(DataError, match="holds 5 documents, not pairs"):
        Flywheel(Sampling("python-stdlib", 1.0, "pairs"), root=tmp_path, block_size=16, batch_size=4)
