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


def test_a_multi_turn_solution_warms_up_on_the_text_its_episodes_render(tmp_path: Path) -> None:
    """The calculator's demonstrations are conversations with a tool turn. Rendered by a chat template for
    SFT, they are the text a GRPO episode of the same turns reads under that template (rl/chat), and the
    warm-up learns the assistant turns, not the tool's."""
    from theseus.data.chat import ChatTemplate
    from theseus.data.tokenizers.byte import ByteTokenizer
    from theseus.model.rl.prompts import PolicyText

    out = tmp_path / "calculator.jsonl"
    args = ["run", "rl/demonstrations", "environment=calculator", f"rl/demonstrations/out={out}"]
    assert call_cli([*args, "rl/demonstrations/count=3", "rl/demonstrations/val=0", "--root", str(tmp_path)]) == 0
    env = load_environment("calculator")
    template = ChatTemplate.load("chatml")
    text = PolicyText(ByteTokenizer(), template, ())
    for line, prompt in zip(map(json.loads, out.read_text().splitlines()), env.prompts("train", 1, 0, 3), strict=True):
        user, call, tool, answer = line["messages"]
        assert [m["role"] for m in (user, call, tool, answer)] == ["user", "assistant", "tool", "assistant"]
        assert tool["content"] == env.respond(prompt, [call]) and call["content"].endswith(env.STOP[0])
        total, _ = env.score([prompt], [call["content"] + answer["content"]])
        assert total == [pytest.approx(1.2)]  # correct and well formed
        episode = text.text(prompt) + call["content"] + text.reply([user, call], tool["content"]) + answer["content"]
        assert template.conversation(line["messages"]).startswith(episode)
        learned = "".join(piece for piece, kept in template.segments(line["messages"]) if kept)
        assert call["content"] in learned and answer["content"] in learned and tool["content"] not in learned


@pytest.mark.parametrize(
    ("solution", "problem"),
    [
        ([{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}], "['tool', 'assistant']"),
        ([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "b"}], "['assistant', 'tool']"),
        ([{"role": "assistant", "content": 3}], "content is not text"),
        ([{"content": "a"}], "got list"),
    ],
)
def test_a_malformed_conversation_solution_is_one_line(solution: list, problem: str) -> None:
    from theseus.errors import ConfigError
    from theseus.rl.demonstrations import solution_turns

    with pytest.raises(ConfigError, match="solution\\(\\) must return a str or a list") as caught:
        solution_turns(solution, "mine")
    assert problem in str(caught.value) and "\n" not in str(caught.value)
