"""docs/reinforcement-learning.md's GRPO flow, as written: two updates on the example plugin's
reverse-a-word environment, every logged quantity present, and ``theseus runs show`` naming the run;
and its distillation flow, which distils that run into a narrower student."""

from __future__ import annotations

import json
import math

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
    shown = shell.result("theseus runs show reverse-student").stdout
    assert "train/distill" in shown and "step 2/2" in shown
