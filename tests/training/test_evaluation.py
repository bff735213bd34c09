"""Shipped evaluations and analyses: perplexity, multiple choice, per-layer activation statistics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.tiny import TinyTrainer
from theseus.analysis import ActivationStatistics
from theseus.errors import DataError
from theseus.evaluation import MultipleChoice, Perplexity
from theseus.evaluation.multiple_choice import BUNDLED, encode_choice, read_questions


class Oracle(TinyTrainer):
    """Logits that predict ``next token = this token + 1`` (bytes), whatever the parameters."""

    @staticmethod
    def forward(state, params, batch, key=None, deterministic=False, intermediates=False):
        logits = 8.0 * jax.nn.one_hot(batch["x"] + 1, 257) + 0.0 * params["embed"].sum()
        return logits, jnp.zeros(()), {}


def test_multiple_choice_scores_choices_by_log_likelihood(tmp_path: Path) -> None:
    data = tmp_path / "choices.jsonl"
    items = [
        {"context": "abc", "choices": ["def", "xyz"], "answer": 0},
        {"context": "jkl", "choices": ["qrs", "mno"], "answer": 1},
        {"context": "tuv", "choices": ["wxy", "bad"], "answer": 1},  # the model prefers "wxy": wrong
    ]
    data.write_text("".join(json.dumps(i) + "\n" for i in items))
    trainer = Oracle.create(tmp_path, quick(**{"architecture/vocab_size": 257}))
    state = trainer.init_state()
    evaluation = MultipleChoice(path=str(data))
    result = evaluation.evaluate(trainer, state)
    assert result == {"acc": pytest.approx(2 / 3), "acc_norm": pytest.approx(2 / 3), "questions": 3}


def test_choice_rows_keep_the_whole_choice() -> None:
    x, y, mask = encode_choice(list(range(10, 30)), [7, 8, 9], length=8)
    # 20 context + 3 choice tokens, cut from the left to 9 tokens: 24..29, 7, 8, 9.
    assert x.tolist() == [24, 25, 26, 27, 28, 29, 7, 8]
    assert y.tolist() == [-1, -1, -1, -1, -1, 7, 8, 9]
    assert mask.all()
    x, y, mask = encode_choice([1, 2], [3], length=8)
    assert x.tolist()[:2] == [1, 2] and y.tolist()[:2] == [-1, 3] and mask.tolist() == [True] * 2 + [False] * 6


def test_bundled_questions_and_bad_files(tmp_path: Path) -> None:
    questions = read_questions(BUNDLED)
    assert len(questions) >= 20 and all(0 <= q.answer < len(q.choices) for q in questions)
    assert {q.answer for q in questions} == {0, 1, 2, 3}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"context": "a", "choices": ["b", "c"], "answer": 5}\n')
    with pytest.raises(DataError, match=r"bad\.jsonl:1 has answer 5 but only 2 choices"):
        read_questions(bad)
    with pytest.raises(DataError, match="does not exist"):
        read_questions(tmp_path / "missing.jsonl")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    trainer = TinyTrainer.create(tmp_path_factory.mktemp("eval"), quick(training__eval_batches=2))
    return trainer, trainer.init_state()


def test_perplexity_is_exp_of_the_validation_loss(tiny) -> None:
    trainer, state = tiny
    result = Perplexity(batches=2).evaluate(trainer, state)
    validation = trainer.validate(state, batches=2)
    assert result["perplexity"] == pytest.approx(math.exp(validation["loss"]))
    assert result["targets"] == 2 * 8 * 16


def test_multiple_choice_needs_a_vocabulary_that_fits_the_tokenizer(tiny) -> None:
    trainer, state = tiny
    with pytest.raises(DataError, match=r"tokenizer's vocabulary \(257\) exceeds the model's"):
        MultipleChoice().evaluate(trainer, state)


def test_activation_statistics(tiny, tmp_path: Path) -> None:
    trainer, state = tiny
    out = tmp_path / "activations"
    summary = ActivationStatistics().analyze(trainer, state, 3, out)
    record = json.loads((out / "step_00000003.json").read_text())
    assert (out / "step_00000003.png").stat().st_size > 1000
    names = [row["name"] for row in record["layers"]]
    assert names == ["up", "Dropout_0", "down", "norm", "lm_head", "model"]  # execution order
    # The numbers are those of the recorded outputs.
    _out, recorded = trainer.capture(
        state, trainer.sharding.put_batch(trainer.host_batch("val", 0)), trainer.step_key(3)
    )
    lm_head = np.asarray(dict(recorded)[("lm_head", "__call__", "0")], np.float64)
    head = next(r for r in record["layers"] if r["name"] == "lm_head")
    assert head["rms"] == pytest.approx(float(np.sqrt(np.mean(lm_head**2))))
    assert head["shape"] == [8, 16, 32]
    assert summary["max_abs"] == max(r["max_abs"] for r in record["layers"])
