"""docs/reinforcement-learning.md's SFT-to-GRPO arithmetic flow, as written, with the shorter step counts,
batch and model the page names (``SFT_STEPS=4 GRPO_STEPS=2 EVAL_BATCHES=1 GRPO_BATCH=32 LAYERS=1``):
demonstrations written and prepared as chat data, an SFT run whose chat template the GRPO run renders its
prompts with and keeps, a validation before the first update, the GRPO metrics logged, and the reward plotted
beside the loss (``benchmarks/rl_arithmetic.py`` runs the same flow at the page's own step counts and model)."""

from __future__ import annotations

import json
import math

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_arithmetic_flow(tmp_path) -> None:
    # The suite's fast compile (tests/conftest.py): with the page's four layers at a batch of 128 XLA's own
    # optimisation level was cheaper (GRPO's rollouts run long), but with one layer at the batch of 32 run
    # here compiling dominates: the flow's CPU time 31.8 s at XLA's level, 19.6 s with the fast compile
    shell = Shell.create(
        tmp_path / "work",
        SFT_STEPS="4",
        GRPO_STEPS="2",
        EVAL_BATCHES="1",
        GRPO_BATCH="32",
        LAYERS="1",  # one layer instead of four: compiling each layer was most of the flow's CPU time
    )
    shell.timeout = 900  # one script: demonstrations, tokenization, SFT and GRPO, on busy cores
    (result,) = shell.run(flows("docs/reinforcement-learning.md")["arithmetic"])
    assert "wrote 20000 training and 100 validation conversations of environment 'arithmetic'" in result.stdout
    assert len((shell.cwd / "arithmetic.jsonl").read_text().splitlines()) == 20100
    runs = shell.root / "runs"
    template = (runs / "arithmetic-sft" / "chat_template.json").read_text()
    assert "im_start" in template and (runs / "arithmetic-grpo" / "chat_template.json").read_text() == template
    rows = [json.loads(line) for line in (runs / "arithmetic-grpo" / "metrics.jsonl").read_text().splitlines()]
    val = [row for row in rows if row["split"] == "val"]
    assert [row["step"] for row in val] == [0, 2]  # training/eval_at_start: the SFT model's accuracy first
    assert all(0 <= row["accuracy"] <= 1 and row["reward"] == pytest.approx(-row["loss"]) for row in val)
    train = [row for row in rows if row["split"] == "train"]
    assert [row["step"] for row in train] == [1, 2]
    for name in ("accuracy", "entropy", "groups_dropped", "rollout_share", "update_seconds", "reward/format"):
        assert all(math.isfinite(row[name]) for row in train), name
    assert (runs / "arithmetic-grpo" / "reward.png").read_bytes()[:8] == PNG
    assert "step 2/2" in result.stdout
