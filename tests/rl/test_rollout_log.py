"""Rollouts you can read (``rl/log_completions``): the records a step's rollouts become (prompt, turns with
the tool's replies, each reward, advantage; long texts cut with a marker), the tracker table made of them,
and ``theseus runs show NAME --rollouts`` printing them with control characters escaped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.conftest import call_cli, error_line
from theseus.model.rl.rollout_log import MAX_TEXT, clipped, rollout_records, table
from theseus.model.rl.rollouts import Rollouts

PROMPT = [{"role": "system", "content": "Use the tool."}, {"role": "user", "content": "Compute 12 * 7."}]
#: Two groups of two: a tool call, its reply and an answer; a text far too long; two plain answers.
TRANSCRIPTS = [
    [
        *PROMPT,
        {"role": "assistant", "content": "<calc>12*7</calc>"},
        {"role": "tool", "content": "<result>84</result>"},
        {"role": "assistant", "content": "<answer>84</answer>"},
    ],
    [*PROMPT, {"role": "assistant", "content": "x" * (MAX_TEXT + 500)}],
    [{"role": "user", "content": "Compute 1 + 1."}, {"role": "assistant", "content": "<answer>2</answer>"}],
    [{"role": "user", "content": "Compute 1 + 1."}, {"role": "assistant", "content": "<answer>3</answer>"}],
]


@pytest.fixture(autouse=True)
def terminal_width(monkeypatch: pytest.MonkeyPatch) -> None:
    """The printed view is read at one width, whatever terminal (or none) the suite runs in."""
    monkeypatch.setenv("COLUMNS", "120")


def rollouts() -> Rollouts:
    per_reward = {"correct": [1.0, 0.0, 1.0, 0.0], "format": [1.0, 0.0, 1.0, 1.0]}
    rewards = [1.2, 0.0, 1.2, 0.2]
    return Rollouts([[1]] * 4, [[2]] * 4, [True] * 4, rewards, per_reward, [[True]] * 4, TRANSCRIPTS)


def test_a_steps_rollouts_become_records_with_turns_rewards_and_advantages() -> None:
    records = rollout_records(rollouts(), step=3, count=3, group_size=2, advantages=[0.7, -0.7, 0.5, -0.5])
    assert [(r["step"], r["index"], r["group"]) for r in records] == [(3, 0, 0), (3, 1, 0), (3, 2, 1)]
    first = records[0]
    assert first["system"] == "Use the tool." and first["prompt"] == "Compute 12 * 7."
    assert first["turns"] == TRANSCRIPTS[0][2:]  # the tool's reply between the policy's two turns
    assert first["rewards"] == {"correct": 1.0, "format": 1.0}
    assert (first["reward"], first["advantage"]) == (1.2, 0.7)
    long = records[1]["turns"][0]["content"]
    assert long == "x" * MAX_TEXT + "…[500 more characters]"
    assert "system" not in records[2] and records[2]["turns"] == [TRANSCRIPTS[2][1]]
    assert all("advantage" not in r for r in rollout_records(rollouts(), 1, 4, 2))  # distillation has none
    assert clipped("short") == "short"

    columns, rows = table(records)
    assert columns == ["step", "index", "prompt", "turns", "reward/correct", "reward/format", "reward", "advantage"]
    assert rows[0] == [
        3,
        0,
        "Compute 12 * 7.",
        "assistant: <calc>12*7</calc>\n\ntool: <result>84</result>\n\nassistant: <answer>84</answer>",
        1.0,
        1.0,
        1.2,
        0.7,
    ]


def write_run(root: Path, lines: list[str]) -> Path:
    run = root / "runs" / "calc"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("training:\n  steps: 2\n")
    if lines:
        (run / "rollouts.jsonl").write_text("".join(line + "\n" for line in lines))
    return run


def show(root: Path, *args: str) -> int:
    return call_cli(["runs", "show", "calc", "--root", str(root), *args])


def test_runs_show_rollouts_prints_a_step_readably_and_safely(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last step by default, ``--step`` another; model text with an escape sequence, a carriage return
    and rich markup shown as text; a damaged line and a record of the wrong form do not stop it."""
    monkeypatch.setenv("COLUMNS", "200")
    hostile = {
        "step": 2,
        "index": 0,
        "group": 0,
        "prompt": "Compute 12 * 7.",
        "turns": [
            {"role": "assistant", "content": "\x1b[31mred\x1b[0m [bold]x[/bold]\nsecond line\r"},
            {"role": "tool", "content": "<result>84</result>"},
        ],
        "rewards": {"correct": 1.0},
        "reward": 1.0,
        "advantage": 0.5,
    }
    lines = [json.dumps({**hostile, "step": 1, "turns": [{"role": "assistant", "content": "step one"}]})]
    lines += [json.dumps(hostile), '{"step": 2, "turns": "not a list", "rewards": [1]}', '{"step": 2, "prom']
    write_run(tmp_path, lines)

    assert show(tmp_path, "--rollouts") == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\r" not in out
    assert "run calc: 2 rollouts at step 2 (logged at steps 1-2; --step S shows another)" in out
    assert "rollout 0 · group 0 · reward 1 · advantage 0.5" in out
    assert "\\x1b[31mred\\x1b[0m [bold]x[/bold]" in out  # escaped, and the markup left as text
    assert "second line\\r" in out and "<result>84</result>" in out and "correct 1" in out
    assert "step one" not in out

    assert show(tmp_path, "--rollouts", "--step", "1") == 0
    assert "step one" in capsys.readouterr().out
    assert show(tmp_path, "--rollouts", "--step", "1", "--json") == 0
    (record,) = json.loads(capsys.readouterr().out)
    assert record["turns"] == [{"role": "assistant", "content": "step one"}]

    assert show(tmp_path, "--rollouts", "--step", "5") == 2
    assert error_line(capsys.readouterr().err) == (
        "error: run 'calc' logged no rollouts at step 5; it logged them at steps 1-2"
    )
    assert show(tmp_path, "--step", "1") == 2
    assert error_line(capsys.readouterr().err) == "error: --step selects the rollouts shown; use it with --rollouts"


def test_a_run_without_rollouts_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path, [])
    assert show(tmp_path, "--rollouts") == 0
    assert capsys.readouterr().out.strip().splitlines() == [
        f"run 'calc' logged no rollouts; train it with rl/log_completions=N (train/grpo, train/distill) to write N "
        f"rollouts a step to {run / 'rollouts.jsonl'}"
    ]
