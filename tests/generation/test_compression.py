"""``evaluation/compression``: bits per byte of a whole split, every token scored once in order."""

from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np
import pytest

from tests.generation.conftest import CORPUS, QUICK, TRAINERS, spread_params, tiny_values, write_corpus
from tests.models.conftest import forward
from theseus.data.format import Prepared
from theseus.errors import ConfigError, DataError
from theseus.evaluation import Compression
from theseus.evaluation.compression import sliding_windows, window_row
from theseus.model.models import GPT


@pytest.mark.parametrize(
    ("tokens", "length", "stride"), [(100, 16, 8), (100, 16, 16), (100, 16, 1), (10, 16, 8), (17, 16, 5)]
)
def test_windows_score_every_token_once_with_enough_context(tokens: int, length: int, stride: int) -> None:
    data = np.arange(tokens)
    scored: list[int] = []
    for number, (start, first) in enumerate(sliding_windows(tokens, length, stride)):
        x, y, mask = window_row(data, start, first, length)
        targets = [int(t) for t in y[mask] if t >= 0]
        assert targets == list(range(first, first + len(targets)))
        assert x[mask].tolist() == list(range(start, start + int(mask.sum())))
        if number:  # after the first window every target sees at least length - stride tokens
            assert first - start >= length - stride + 1
        scored += targets
    assert scored == list(range(1, tokens))


def test_bits_per_byte_match_each_byte_predicted_from_its_own_window(tmp_path: Path) -> None:
    """With stride 1 each byte is scored from the window that ends at it; the same figure computed
    straight from ``model.apply`` on those windows, divided by the split's bytes."""
    write_corpus(tmp_path)
    values = {**QUICK, **tiny_values(GPT), "training/sequence_length": 16}
    trainer = TRAINERS["gpt"].create(tmp_path, values)
    state = trainer.init_state()
    params = spread_params(trainer.model, std=0.2)
    state = state.replace(params=params)
    result = Compression(stride=1).evaluate(trainer, state)

    tokens = np.asarray(Prepared.open(tmp_path, CORPUS).tokens("val"), np.int32)
    length = 16
    windows = np.zeros((len(tokens) - 1, length), np.int32)
    last = np.zeros(len(tokens) - 1, np.int32)
    for t in range(1, len(tokens)):
        context = tokens[max(0, t - length) : t]
        windows[t - 1, : len(context)] = context
        last[t - 1] = len(context) - 1
    logits = forward(trainer.model, params, windows)
    logp = jax.nn.log_softmax(np.asarray(logits, np.float64), axis=-1)
    nats = -sum(float(logp[i, last[i], tokens[i + 1]]) for i in range(len(last)))
    raw = int(np.sum(tokens[1:] < 256))  # the byte tokenizer: end-of-text (256) stands for no byte
    assert result["targets"] == len(tokens) - 1 and result["bytes"] == raw
    assert result["bits_per_byte"] == pytest.approx(nats / math.log(2) / raw, rel=1e-5)
    halves = Compression().evaluate(trainer, state)  # default stride: half the window
    assert halves["targets"] == result["targets"] and halves["bits_per_byte"] != result["bits_per_byte"]
    with pytest.raises(ConfigError, match="stride=17 exceeds the sequence length 16"):
        Compression(stride=17).evaluate(trainer, state)
    with pytest.raises(DataError, match="gives 1 token"):
        Compression(max_tokens=1).evaluate(trainer, state)
