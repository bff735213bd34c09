"""Tokenizers and specs: byte-level, Hugging Face files, BPE training, tiktoken as an optional extra."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from theseus.data.format import Header, SplitInfo, token_dtype
from theseus.data.tokenizers import (
    EOT_TEXT,
    ByteTokenizer,
    HFTokenizer,
    TiktokenTokenizer,
    Tokenizer,
    load_tokenizer,
    train_bpe,
)
from theseus.data.tokenizers.spec import parse_spec
from theseus.errors import DataError, TheseusError

SAMPLES = ["", "hello", "naïve café — 数据 🙂", "def f(x):\n    return x  # tabs\tand spaces  \n"]


def test_byte_tokenizer_roundtrips_utf8_and_reserves_256_for_end_of_text() -> None:
    tok = ByteTokenizer()
    assert (tok.vocab_size, tok.eot_id, tok.spec) == (257, 256, {"kind": "byte"})
    assert isinstance(tok, Tokenizer)
    for text in SAMPLES:
        ids = tok.encode(text)
        assert ids == list(text.encode("utf-8")) and max(ids, default=0) < 256
        assert tok.decode(ids) == text
        assert np.array_equal(tok.encode_array(text), np.asarray(ids, dtype=np.uint8))
    assert tok.decode([104, 105, 256, 104]) == f"hi{EOT_TEXT}h"
    assert tok.decode([0xE6, 300]) == "\ufffd\ufffd"  # broken UTF-8 and unknown ids do not raise


def test_specs_resolve_through_the_registry(tmp_path: Path) -> None:
    assert isinstance(load_tokenizer("byte"), ByteTokenizer)
    assert isinstance(load_tokenizer({"kind": "byte"}), ByteTokenizer)
    path = train_bpe(["abc abc abd"] * 10, tmp_path / "t.json", vocab_size=270)
    assert parse_spec(f"hf:{path}") == {"kind": "hf", "path": str(path)}
    assert parse_spec(str(path)) == {"kind": "hf", "path": str(path)}
    assert parse_spec("tiktoken:cl100k_base") == {"kind": "tiktoken", "encoding": "cl100k_base"}
    hf = load_tokenizer(f"hf:{path}")
    assert isinstance(hf, HFTokenizer) and load_tokenizer(hf.spec).encode("abc abd") == hf.encode("abc abd")
    with pytest.raises(TheseusError, match="unknown tokenizer 'nope'"):
        load_tokenizer("nope")
    with pytest.raises(DataError, match="takes no argument"):
        parse_spec("byte:extra")
    with pytest.raises(DataError, match="has no 'kind'"):
        load_tokenizer({"path": "x"})


def test_trained_bpe_roundtrips_exactly_and_has_end_of_text(tmp_path: Path) -> None:
    corpus = [f"def function_{i}(value):\n    return value * {i}\n" for i in range(200)]
    path = train_bpe(corpus, tmp_path / "bpe.json", vocab_size=400)
    tok = HFTokenizer(path)
    assert 257 < tok.vocab_size <= 400 and tok.decode([tok.eot_id]) == EOT_TEXT
    for text in [*SAMPLES, corpus[7]]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(corpus[7])) < len(corpus[7].encode()) / 2
    assert [list(x) for x in tok.encode_batch(corpus[:3])] == [tok.encode(t) for t in corpus[:3]]
    with pytest.raises(DataError, match="must be above 257"):
        train_bpe(corpus, tmp_path / "small.json", vocab_size=100)


def test_hf_tokenizer_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"does not exist.*data/train-bpe"):
        load_tokenizer(f"hf:{tmp_path / 'missing.json'}")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(DataError, match=r"is not a Hugging Face tokenizer\.json"):
        load_tokenizer(f"hf:{tmp_path / 'bad.json'}")
    from tokenizers import Tokenizer as RawTokenizer
    from tokenizers import models, pre_tokenizers

    raw = RawTokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel()
    raw.save(str(tmp_path / "noeot.json"))
    with pytest.raises(DataError, match="has no end-of-text token"):
        load_tokenizer(f"hf:{tmp_path / 'noeot.json'}")


@pytest.mark.skipif(importlib.util.find_spec("tiktoken") is not None, reason="tiktoken is installed")
def test_tiktoken_without_the_extra_says_how_to_install() -> None:
    with pytest.raises(DataError, match=r"pip install 'theseus-data\[tiktoken\]'"):
        load_tokenizer("tiktoken:gpt2")
    with pytest.raises(DataError, match="tiktoken"):
        TiktokenTokenizer("gpt2")


def test_token_dtype_and_header_validation() -> None:
    assert token_dtype(257) == np.uint16 and token_dtype(65536) == np.uint16 and token_dtype(65537) == np.uint32
    header = Header("x", {"kind": "byte"}, 257, 256, "uint16", {"train": SplitInfo(10, 2)})
    assert Header.from_json(header.to_json(), "h") == header
    with pytest.raises(DataError, match="format version 99"):
        Header.from_json({**header.to_json(), "version": 99}, "h")
    with pytest.raises(DataError, match="says dtype uint16 for vocabulary 70000"):
        Header.from_json({**header.to_json(), "vocab_size": 70000}, "h")
    with pytest.raises(DataError, match="missing or has a malformed entry"):
        Header.from_json({k: v for k, v in header.to_json().items() if k != "splits"}, "h")
