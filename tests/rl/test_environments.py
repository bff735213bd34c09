"""Built-in environments: determinism in (split, seed, step), disjoint splits, scoring, countdown's parser
and the jsonl file's extraction modes and errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from theseus.errors import ConfigError
from theseus.rl import load_environment
from theseus.rl.environments import JSONL, Arithmetic, Countdown
from theseus.rl.environments.countdown import check
from theseus.rl.expression import ExpressionError, parse


@pytest.mark.parametrize("name", ["arithmetic", "countdown"])
def test_prompts_are_deterministic_per_seed_and_step_and_splits_are_disjoint(name: str) -> None:
    env = load_environment(name)
    first = env.prompts("train", seed=3, step=5, count=8)
    assert first == load_environment(name).prompts("train", seed=3, step=5, count=8)
    assert first != env.prompts("train", seed=3, step=6, count=8)
    assert first != env.prompts("train", seed=4, step=5, count=8)
    train = {p.text for step in range(20) for p in env.prompts("train", 0, step, 16)}
    held_out = {p.text for step in range(20) for p in env.prompts("eval", 0, step, 16)}
    assert train and held_out and not train & held_out
    with pytest.raises(ConfigError, match="unknown split 'test'"):
        env.prompts("test", 0, 0, 1)


def test_arithmetic_answers_are_exact_and_scored_with_default_weights() -> None:
    env = load_environment("arithmetic", operations="+-*/", terms=4, digits=2)
    prompts = env.prompts("train", 0, 0, 32)
    for prompt in prompts:
        assert parse(prompt.metadata["expression"]).value == int(prompt.metadata["answer"])
    right = [f"<answer>{p.metadata['answer']}</answer>" for p in prompts[:2]]
    total, per = env.score(prompts[:3], [*right, f"{prompts[2].metadata['answer']}1"])
    assert per == {"correct": [1.0, 1.0, 0.0], "format": [1.0, 1.0, 0.0]}
    assert total == pytest.approx([1.2, 1.2, 0.0])
    total, per = env.score(prompts[:1], ["<answer>x</answer>"], {"format": 0.5})
    assert (total, per) == ([0.5], {"format": [1.0]})
    with pytest.raises(ConfigError, match="operations='\\+%'"):
        Arithmetic(operations="+%")


def test_countdown_parser_and_reward() -> None:
    assert parse("(3 + 5) * 2 - 6 / 4").value * 2 == 29
    for bad in ("1 / (2 - 2)", "2 ** 3", "(1 + 2", "3 4", "__import__('os')", ""):
        with pytest.raises(ExpressionError):
            parse(bad)
    assert check("(25 - 5) * 4", [4, 5, 25, 2], 80)
    assert check("25 * 4 - 5 * 4 = 80", [4, 5, 25, 4], 80)  # a number given twice may be used twice
    assert not check("25 * 4 - 5 * 4", [4, 5, 25, 2], 80)  # 4 reused
    assert not check("25 * 4", [4, 5, 25], 80) and not check("1 / (5 - 5)", [1, 5, 5], 0)
    env = Countdown()
    prompts = env.prompts("train", 0, 0, 4)
    solutions = [f"<answer>{p.metadata['solution']}</answer>" for p in prompts]
    total, per = env.score(prompts, [solutions[0], "<answer>1 / 0</answer>", "no idea", solutions[3]])
    assert per["countdown"] == [1.0, 0.0, 0.0, 1.0] and total == pytest.approx([1.2, 0.2, 0.0, 1.2])


def write(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def test_jsonl_extraction_modes_splits_and_epochs(tmp_path: Path) -> None:
    rows = [{"question": f"q{i}", "answer": f"so {i} + 1\n#### {i},000"} for i in range(40)]
    file = write(tmp_path / "gsm.jsonl", rows)
    env = JSONL(path=str(file), prompt_field="question", extract="hash", eval_fraction=0.25, template="Q: {prompt}")
    train, held_out = env.rows["train"], env.rows["eval"]
    assert len(train) + len(held_out) == 40 and held_out and not {p.text for p in train} & {p.text for p in held_out}
    assert train[0].text.startswith("Q: q") and train[0].metadata["answer"].endswith(",000")
    epoch = [p.text for step in range(len(train)) for p in env.prompts("train", 1, step, 1)]
    assert sorted(epoch) == sorted(p.text for p in train)  # one epoch draws every row once
    assert env.prompts("train", 1, 2, 3) == env.prompts("train", 1, 2, 3)
    prompt = train[0]
    total, _ = env.score([prompt, prompt], [f"<answer>{prompt.metadata['answer'].replace(',', '')}</answer>", "0"])
    assert total == [1.0, 0.0]
    boxed = write(tmp_path / "math.jsonl", [{"prompt": "p", "answer": "x = \\boxed{\\frac{3}{4}}"}])
    assert (
        JSONL(path=str(boxed), extract="boxed", eval_fraction=0.0).rows["train"][0].metadata["answer"] == "\\frac{3}{4}"
    )
    numbers = write(tmp_path / "n.jsonl", [{"prompt": "p", "answer": "1 then 2.5 apples"}])
    assert JSONL(path=str(numbers), extract="last_number", eval_fraction=0.0).rows["train"][0].metadata == {
        "answer": "2.5"
    }


def test_jsonl_errors_name_the_file_and_line(tmp_path: Path) -> None:
    def error(**kwargs: object) -> str:
        with pytest.raises(ConfigError) as caught:
            JSONL(**kwargs)  # type: ignore[arg-type]
        assert "\n" not in str(caught.value)
        return str(caught.value)

    assert "no file" in error(path=str(tmp_path / "missing.jsonl"))
    bad = write(tmp_path / "bad.jsonl", [{"prompt": "a", "answer": "1"}, "", "{oops"])
    assert f"{bad}:3 is not valid JSON" in error(path=str(bad))
    missing = write(tmp_path / "fields.jsonl", [{"question": "a", "answer": "1"}])
    assert f"{missing}:1: no field 'prompt' (it has 'question', 'answer'); set environment/jsonl/prompt_field" in error(
        path=str(missing)
    )
    assert f"{missing}:1: extract=hash finds no answer" in error(
        path=str(missing), prompt_field="question", extract="hash"
    )
    assert "holds no rows" in error(path=str(write(tmp_path / "empty.jsonl", [])))
    env = JSONL(path=str(missing), prompt_field="question", eval_fraction=0.0)
    with pytest.raises(ConfigError, match="the eval split is empty"):
        env.prompts("eval", 0, 0, 1)
