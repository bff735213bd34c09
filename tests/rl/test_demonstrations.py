"""``rl/demonstrations``: an environment's prompts with their reference solutions as chat data (the SFT
warm-up before GRPO), and its errors as one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.conftest import call_cli, error_line
from theseus.rl import load_environment

ARITHMETIC = ["environment/arithmetic/digits=1", "environment/arithmetic/operations=+-"]


def test_conversations_hold_the_environments_prompts_and_correct_answers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "sub" / "arithmetic.jsonl"
    args = ["run", "rl/demonstrations", *ARITHMETIC, f"rl/demonstrations/out={out}", "rl/demonstrations/count=40"]
    assert call_cli([*args, "rl/demonstrations/val=10", "--root", str(tmp_path)]) == 0
    assert (
        capsys.readouterr()
        .out.strip()
        .endswith(f"wrote 40 training and 10 validation conversations of environment 'arithmetic' to {out}")
    )
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == 50 and [line.get("split") for line in lines] == [None] * 40 + ["val"] * 10
    env = load_environment("arithmetic", digits=1, operations="+-")
    expected = env.prompts("train", 1, 0, 40) + env.prompts("eval", 1, 0, 10)  # rl/demonstrations/seed=1
    for line, prompt in zip(lines, expected, strict=True):
        user, assistant = line["messages"]
        assert user == {"role": "user", "content": prompt.text}
        assert assistant == {"role": "assistant", "content": f"<answer>{prompt.metadata['answer']}</answer>"}
        total, _ = env.score([prompt], [assistant["content"]])
        assert total == [pytest.approx(1.2)]  # correct and well formed
    assert not {json.dumps(x["messages"][0]) for x in lines[:40]} & {json.dumps(x["messages"][0]) for x in lines[40:]}


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["environment=countdown", "rl/demonstrations/out={tmp}/x.jsonl"],
            "error: environment 'countdown' has no reference solutions to demonstrate; choose one that does "
            "(environment=arithmetic) or write its solution() method",
        ),
        ([], "error: rl/demonstrations/out is not set; name the JSON-lines file to write"),
    ],
)
def test_errors_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    overrides = [o.format(tmp=tmp_path) for o in overrides]
    assert call_cli(["run", "rl/demonstrations", *overrides, "--root", str(tmp_path)]) == 2
    assert error_line(capsys.readouterr().err) == expected
    assert not list(tmp_path.glob("*.jsonl")) and not list(tmp_path.glob(".*.partial"))
