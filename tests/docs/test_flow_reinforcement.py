"""docs/reinforcement-learning.md's GRPO flow, as written: two updates on the example plugin's
reverse-a-word environment, every logged quantity present, and ``theseus runs show`` naming the run;
and its distillation flow, which distils that run into a narrower student."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows


@pytest.fixture(scope="module")
def grpo_shell(tmp_path_factory: pytest.TempPathFactory) -> Shell:
    """A working directory where the GRPO flow ran (the distillation flow's teacher is its run)."""
    shell = Shell.create(tmp_path_factory.mktemp("rl") / "work")
    shell.run(flows("docs/reinforcement-learning.md")["grpo"])
    return shell


@pytest.mark.slow
def test_grpo_flow(grpo_shell: Shell) -> None:
    shell = grpo_shell
    rows = [json.loads(line) for line in (shell.root / "runs" / "reverse" / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    for name in ("reward", "reward_std", "reward/reversed", "reward/format", "completion_length_max", "ratio_mean"):
        assert all(math.isfinite(row[name]) for row in train), name
    assert all(1 <= row["completion_length"] <= 17 for row in train)
    (val,) = [row for row in rows if row["split"] == "val"]
    assert val["loss"] == pytest.approx(-val["reward"])
    assert val["completions"] == 2 and "tokens" not in val  # one greedy completion of each of 16 / 8 prompts
    shown = shell.result("theseus runs show reverse").stdout
    assert "train/grpo" in shown and "step 2/2" in shown


@pytest.mark.slow
def test_distill_flow(grpo_shell: Shell) -> None:
    """The distillation flow as written, its teacher the GRPO flow's run: two on-policy updates of a
    narrower student, the divergence and the rollouts logged, validation's loss the divergence."""
    shell = grpo_shell
    shell.run(flows("docs/reinforcement-learning.md")["distill"])
    lines = (shell.root / "runs" / "reverse-student" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    for name in ("loss", "reward", "rollout_seconds", "rollout_tokens_per_s", "completion_length_max"):
        assert all(math.isfinite(row[name]) for row in train), name
    assert all(row["loss"] > 0 and 1 <= row["completion_length"] <= 17 for row in train)
    (val,) = [row for row in rows if row["split"] == "val"]
    assert val["loss"] > 0 and math.isfinite(val["reward"])
    assert val["targets"] > 0 and "tokens" not in val  # the positions the divergence is taken at
    shown = shell.result("theseus runs show reverse-student").stdout
    assert "train/distill" in shown and "step 2/2" in shown


@pytest.mark.slow
def test_learned_reward_flow(grpo_shell: Shell) -> None:
    """The learned-reward flow as written: a reward model of preference pairs separates the held-out
    pairs, and two GRPO updates score completions with it beside the rule reward."""
    from tests.finetune.conftest import preference_rows, write_jsonl

    shell = grpo_shell
    write_jsonl(shell.cwd / "preferences.jsonl", preference_rows(64))
    shell.run(flows("docs/reinforcement-learning.md")["reward"])
    judge = [json.loads(line) for line in (shell.root / "runs" / "judge" / "metrics.jsonl").read_text().splitlines()]
    held_out = [row for row in judge if row["split"] == "val"][-1]
    assert held_out["step"] == 24 and held_out["accuracy"] >= 0.9, held_out  # chance is 0.5
    lines = (shell.root / "runs" / "reverse-judged" / "metrics.jsonl").read_text().splitlines()
    train = [row for row in map(json.loads, lines) if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    for row in train:
        assert math.isfinite(row["reward/model"]) and row["reward/model"] != 0.0
        assert row["reward"] == pytest.approx(row["reward/reversed"] + 0.5 * row["reward/model"], abs=1e-4)


def test_calculator_flow(tmp_path: Path) -> None:
    """The multi-turn flow as written: three GRPO updates on the calculator environment, the turns per
    episode and the rewards logged, ``theseus runs show`` naming the run; and the reading-the-rollouts flow
    on that run: four rollouts a step in ``rollouts.jsonl``, each with its prompt, turns, rewards and
    advantage, which ``theseus runs show --rollouts`` prints."""
    shell = Shell.create(tmp_path / "work")
    shell.run(flows("docs/reinforcement-learning.md")["calculator"])
    run = shell.root / "runs" / "calculator"
    train = [
        row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if row["split"] == "train"
    ]
    assert [row["step"] for row in train] == [1, 2, 3]
    for row in train:
        assert 1.0 <= row["turns"] <= 3.0 and 1 <= row["completion_length"] <= 3 * 16 + 1, row
        assert math.isfinite(row["reward"]) and math.isfinite(row["reward/correct"])
    assert "step 3/3" in shell.result("theseus runs show calculator").stdout

    logged = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["index"], r["group"]) for r in logged] == [
        (step, index, index // 4) for step in (1, 2, 3) for index in range(4)
    ]
    for record, row in zip(logged[::4], train, strict=True):  # the rollouts of the metrics' step
        assert record["step"] == row["step"] and record["prompt"].startswith("Compute ")
        assert set(record["rewards"]) == {"correct", "format"}
        assert 1 <= len(record["turns"]) <= 5 and record["turns"][0]["role"] == "assistant"
        assert [t["role"] for t in record["turns"]] == ["assistant", "tool"] * (len(record["turns"]) // 2) + [
            "assistant"
        ] * (len(record["turns"]) % 2)
        assert math.isfinite(record["reward"]) and math.isfinite(record["advantage"])
    group = logged[8:12]
    mean = sum(r["reward"] for r in group) / 4
    assert all((r["advantage"] > 0) == (r["reward"] > mean) for r in group if r["reward"] != mean)
    shown = shell.result("theseus runs show calculator --rollouts").stdout
    assert "run calculator: 4 rollouts at step 3 (logged at steps 1-3" in shown
    assert shown.count("rollout ") == 4 and logged[8]["prompt"][:30] in shown and "\x1b" not in shown
    as_json = json.loads(shell.result("theseus runs show calculator --rollouts --step 2 --json").stdout)
    assert as_json == logged[4:8]

    demonstrated = [json.loads(line) for line in (shell.cwd / "calculator.jsonl").read_text().splitlines()]
    assert len(demonstrated) == 1100  # rl/demonstrations/count and /val's defaults
    for line in demonstrated[:5]:
        roles = [m["role"] for m in line["messages"]]
        assert roles == ["user", "assistant", "tool", "assistant"], roles
        assert line["messages"][1]["content"].startswith("<calc>") and line["messages"][2]["content"].startswith(
            "<result>"
        )


def test_hf_policy_flow(tmp_path: Path) -> None:
    """The Hugging Face policy flow as written, on a tiny Qwen3 chat checkpoint: two GRPO updates of LoRA
    adapters over the checkpoint, prompts through its chat template, and the adapter exported for peft."""
    from tests.rl.chat_checkpoint import save_chat_checkpoint

    shell = Shell.create(tmp_path / "work")
    save_chat_checkpoint(shell.cwd / "qwen3")
    shell.run(flows("docs/reinforcement-learning.md")["hf-policy"])
    lines = (shell.root / "runs" / "qwen-grpo" / "metrics.jsonl").read_text().splitlines()
    train = [row for row in map(json.loads, lines) if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    assert all(math.isfinite(row["reward"]) and 1 <= row["completion_length"] <= 17 for row in train)
    adapter = shell.cwd / "qwen-grpo-adapter"
    assert json.loads((adapter / "adapter_config.json").read_text())["r"] == 8
    assert (adapter / "adapter_model.safetensors").stat().st_size > 0
