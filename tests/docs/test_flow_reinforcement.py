"""docs/reinforcement-learning.md's GRPO flow, as written: two updates on the example plugin's
reverse-a-word environment, every logged quantity present, and ``theseus runs show`` naming the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows


@pytest.mark.slow
def test_grpo_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    shell.run(flows("docs/reinforcement-learning.md")["grpo"])
    rows = [json.loads(line) for line in (shell.root / "runs" / "reverse" / "metrics.jsonl").read_text().splitlines()]
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    for name in ("reward", "reward_std", "reward/reversed", "reward/format", "completion_length_max", "ratio_mean"):
        assert all(math.isfinite(row[name]) for row in train), name
    assert all(1 <= row["completion_length"] <= 17 for row in train)
    (val,) = [row for row in rows if row["split"] == "val"]
    assert val["loss"] == pytest.approx(-val["reward"])
    shown = shell.result("theseus runs show reverse").stdout
    assert "gpt/train/grpo" in shown and "step 2/2" in shown
