"""The GRPO trainer end to end on CPU: it raises the reward of a learnable environment, a stopped run
resumes bit-exactly (rollouts keyed by seed and step), LoRA with a KL penalty to the adapters-off
reference runs, and misconfigurations are one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_GPT
from tests.reliability.conftest import call_cli, error_line
from tests.training.test_fp8 import checkpoint_digest

LETTERS = Path(__file__).with_name("letters_env.py")
#: 4 prompts x 8 completions of up to 8 bytes from a one-layer GPT.
GRPO = [
    *TINY_GPT,
    "architecture/block_size=64",
    "training/sequence_length=64",
    "architecture/vocab_size=257",
    "training/batch_size=32",
    "rl/group_size=8",
    "rl/max_new_tokens=8",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/progress=false",
    "training/peak_flops=1e12",
]


def grpo(root: Path, *overrides: str) -> int:
    args = ["--load", str(LETTERS), "run", "gpt/train/grpo", "environment=letters", *GRPO, *overrides]
    return call_cli([*args, "--root", str(root)])


def train_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [row for row in rows if row["split"] == "train"]


def test_grpo_raises_the_reward_of_a_learnable_environment(tmp_path: Path) -> None:
    assert grpo(tmp_path, "training/steps=20", "training/lr=1e-2", "run/name=learn") == 0
    rows = train_rows(tmp_path / "runs" / "learn")
    rewards = np.array([row["reward"] for row in rows])
    assert len(rewards) == 20
    # lower-case letters are about a tenth of a random byte model's output; the policy learns to write them
    assert rewards[:3].mean() < 0.2 and rewards[-3:].mean() > rewards[:3].mean() + 0.25, rewards
    first = rows[0]
    for name in (
        "reward/letters",
        "reward_std",
        "completion_length",
        "completion_length_max",
        "clip_ratio/region_mean",
    ):
        assert name in first, sorted(first)
    assert first["rollout_tokens_per_s"] > 0 and first["completion_length_max"] <= 9


def test_a_stopped_grpo_run_resumes_bit_exactly(tmp_path: Path) -> None:
    assert grpo(tmp_path, "training/steps=4", "training/lr=1e-2", "run/name=whole") == 0
    assert grpo(tmp_path, "training/steps=4", "training/lr=1e-2", "run/name=halves", "training/stop_after=2") == 0
    assert grpo(tmp_path, "training/steps=4", "training/lr=1e-2", "run/name=halves") == 0
    assert checkpoint_digest(tmp_path / "runs" / "whole", 4) == checkpoint_digest(tmp_path / "runs" / "halves", 4)
    whole, halves = train_rows(tmp_path / "runs" / "whole"), train_rows(tmp_path / "runs" / "halves")
    assert [r["reward"] for r in whole] == [r["reward"] for r in halves]  # the same rollouts


def test_lora_with_a_kl_penalty_to_the_adapters_off_policy(tmp_path: Path) -> None:
    assert grpo(tmp_path, "training/steps=2", "model/lora/rank=4", "rl/beta=0.04", "run/name=lora") == 0
    rows = train_rows(tmp_path / "runs" / "lora")
    assert len(rows) == 2 and all(np.isfinite(row["kl"]) for row in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # fresh adapters: the policy is the reference


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            ["training/batch_size=12"],
            "error: training/batch_size=12 completions do not split into groups of rl/group_size=8; make the "
            "batch a multiple of the group size",
        ),
        (
            ["architecture/vocab_size=100"],
            "error: architecture/vocab_size=100 is smaller than the byte tokenizer's 257; set "
            "architecture/vocab_size=257 or more",
        ),
        (
            ["training/sequence_length=32", "architecture/block_size=32", "rl/max_new_tokens=24"],
            "error: a prompt of 13 tokens and rl/max_new_tokens=24 need training/sequence_length>=37 (and "
            "architecture/block_size); raise it or lower rl/max_new_tokens",
        ),
        (
            ["rl/beta=0.1"],
            "error: rl/beta=0.1 needs a reference: the policy with its LoRA adapters off; set model/lora/rank>0, "
            "or rl/beta=0",
        ),
    ],
)
def test_misconfigurations_are_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    assert grpo(tmp_path, "training/steps=1", *overrides) == 2
    assert error_line(capsys.readouterr().err) == expected
    assert not (tmp_path / "runs").exists()


def test_an_environment_is_selected_only_where_a_job_declares_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = call_cli(["run", "gpt/train/pretrain", "environment=arithmetic", "--root", str(tmp_path)])
    assert code == 2
    assert error_line(capsys.readouterr().err) == (
        "error: GPTPretrain has no environment to select; environment= applies to the jobs that declare one"
    )
