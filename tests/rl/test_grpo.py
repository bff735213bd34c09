"""The GRPO trainer end to end on CPU: it raises the reward of a learnable environment, a stopped run
resumes bit-exactly (rollouts keyed by seed and step), LoRA with a KL penalty to the adapters-off
reference runs, and misconfigurations are one line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_GPT, clean_env, xla_flags
from tests.reliability.conftest import call_cli, error_line
from tests.training.test_fp8 import checkpoint_digest
from theseus.base.killpoints import ENV
from theseus.training.preemption import EXIT_CODE

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


def grpo_args(root: Path, *overrides: str) -> list[str]:
    return [
        "--load",
        str(LETTERS),
        "run",
        "train/grpo",
        "environment=letters",
        *GRPO,
        *overrides,
        "--root",
        str(root),
    ]


def grpo(root: Path, *overrides: str) -> int:
    return call_cli(grpo_args(root, *overrides))


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


#: Several updates per rollout and dynamic sampling: the rollout state a resumed run must rebuild.
RESUMED = [
    "training/steps=4",
    "training/lr=1e-2",
    "training/checkpoint_interval=1",
    "rl/updates_per_rollout=2",
    "rl/dynamic_sampling=true",
    "rl/rewards=odd_letters,overlong:0.5",  # overlong: a reward the environment does not name, with its keys
    "reward/overlong/max_length=100",
    "reward/overlong/buffer=10",
    "rl/log_completions=3",
]
#: Fields that measure time, not the run.
TIMING = {
    "step_time",
    "tokens_per_sec",
    "mfu",
    "rollout_seconds",
    "rollout_tokens_per_s",
    "rollout_wait_seconds",
    "update_seconds",
}


def untimed(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k not in TIMING and k != "rollout_share"} for row in rows]


def test_a_preempted_then_killed_grpo_run_resumes_bit_exactly(tmp_path: Path) -> None:
    """SIGTERM during update 2 checkpoints it and exits 75; the next attempt is SIGKILLed once rollout 4
    is made; the third finishes: parameters, optimizer state and metrics equal an uninterrupted run's."""
    assert grpo(tmp_path, *RESUMED, "run/name=whole") == 0
    command = [sys.executable, "-m", "theseus.cli.main", "--load", str(LETTERS), "run", "train/grpo"]
    command += ["environment=letters", *GRPO, *RESUMED, "run/name=broken", "--root", str(tmp_path)]
    for kill_at, code in (("step:2:TERM", EXIT_CODE), ("data:4", -signal.SIGKILL)):
        done = subprocess.run(command, env=clean_env(**{ENV: kill_at}), capture_output=True, text=True, timeout=300)
        assert done.returncode == code, done.stderr
    assert grpo(tmp_path, *RESUMED, "run/name=broken") == 0
    assert checkpoint_digest(tmp_path / "runs" / "whole", 4) == checkpoint_digest(tmp_path / "runs" / "broken", 4)
    whole, broken = train_rows(tmp_path / "runs" / "whole"), train_rows(tmp_path / "runs" / "broken")
    assert untimed(whole) == untimed(broken)  # the same rollouts, losses and metrics
    # the rollouts logged: three a step, each step once, as an uninterrupted run logs them
    logged = (tmp_path / "runs" / "broken" / "rollouts.jsonl").read_text()
    assert logged == (tmp_path / "runs" / "whole" / "rollouts.jsonl").read_text()
    assert [json.loads(line)["step"] for line in logged.splitlines()] == [1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4]
    # two of the four prompts score 0 whatever is written: their groups are dropped and refilled
    assert [row["groups_dropped"] for row in whole] == [0.5] * 4
    assert all(row["reward_std"] > 0 for row in whole)
    assert all(row["reward/overlong"] == 0.0 for row in whole)  # 8 tokens are far from 100 - 10
    # the second update of each rollout is off the sampling policy: its ratio moves from 1
    assert all(abs(row["ratio_mean"] - 1.0) > 1e-4 for row in whole), [row["ratio_mean"] for row in whole]


def test_lora_with_a_kl_penalty_to_the_adapters_off_policy_and_cispo_at_its_defaults(tmp_path: Path) -> None:
    """LoRA with a KL penalty to the adapters-off reference trains; and ``rl/loss=cispo`` with no other loss
    key trains (one run for both: the reference's log-probabilities do not depend on the loss): its cap is 5
    where ``rl/epsilon_high`` is not set, as the run records."""
    assert (
        grpo(tmp_path, "training/steps=2", "model/lora/rank=4", "rl/beta=0.04", "rl/loss=cispo", "run/name=lora") == 0
    )
    rows = train_rows(tmp_path / "runs" / "lora")
    assert len(rows) == 2 and all(np.isfinite(row["kl"]) for row in rows)
    assert rows[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # fresh adapters: the policy is the reference
    assert all(np.isfinite(row["loss"]) and "cispo_clip_ratio" in row for row in rows)
    objective = json.loads((tmp_path / "runs" / "lora" / "provenance.json").read_text())["objective"]
    assert objective["values"]["epsilon_high"] == 5.0 and objective["values"]["loss"] == "cispo"


LORA = ["model/lora/rank=4", "model/lora/targets=[query,value,up,down]"]
#: Two rollouts of two updates each.
LAYOUT_RUN = ["training/steps=2", "training/lr=1e-2", "rl/updates_per_rollout=2"]
#: run name -> settings, on 4 devices (grpo_layouts_run.py): fsdp+tp applies both the fsdp and the tp
#: rules, whose layouts alone tests/distributed/test_scale_out.py compares with one device. Synchronous
#: rollouts on the run's mesh are checked with LoRA (a rollout samples LoRA and full parameters alike), full
#: fine-tuning's sharded update with rollouts made ahead (``behind-fsdp+tp``: an update reads its rollouts the
#: same wherever they were made).
#: Rollouts made ahead (rl/async_rollouts) by the parameters a step behind: the producer's copies of the
#: sharded parameters and the sampling correction. (Made ahead by the current parameters, rl/max_staleness=0,
#: a run is the synchronous one: tests/rl/test_async_rollouts.py, on one device; that path samples as the
#: synchronous runs here do.)
BEHIND = ["rl/async_rollouts=true", "rl/max_staleness=1"]
FSDP_TP = ["mesh/layout=fsdp+tp", "mesh/data=2", "mesh/model=2"]
LAYOUTS = {
    "lora-fsdp+tp": [*FSDP_TP, *LORA],
    "behind-fsdp+tp": [*FSDP_TP, *BEHIND],
    "behind-apart": ["mesh/layout=fsdp", "rl/rollout_devices=2", *BEHIND],  # 2 devices train, 2 generate
}


def test_sharded_layouts_roll_out_and_train_as_one_device(tmp_path: Path) -> None:
    """LoRA in fsdp+tp on 4 devices (data 2 x model 2) with rollouts on the run's mesh, and full fine-tuning
    with rollouts made ahead by the parameters a step behind, on the run's mesh or on two devices of their
    own: the same rewards, losses and sampling corrections as one device."""
    assert grpo(tmp_path, *LAYOUT_RUN, *LORA, "run/name=lora-1") == 0
    assert grpo(tmp_path, *LAYOUT_RUN, *BEHIND, "run/name=behind-1") == 0
    script = Path(__file__).with_name("grpo_layouts_run.py")
    env = clean_env(XLA_FLAGS=xla_flags(devices=4))
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    for name in LAYOUTS:
        one = train_rows(tmp_path / "runs" / f"{name.split('-')[0]}-1")
        sharded = train_rows(tmp_path / "runs" / name)
        fields = ["reward", "loss", "ratio_mean"] + (
            ["sampling/importance_sampling_ratio/mean"] if "behind" in name else []
        )
        for field in fields:
            np.testing.assert_allclose([r[field] for r in sharded], [r[field] for r in one], atol=1e-5, err_msg=name)


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
            ["rl/chat=true"],
            "error: rl/chat=true renders prompts with the chat template of the source the policy starts from, but "
            "training/init_from=(unset) is not a run or a checkpoint; start from a run fine-tuned on chat data "
            "(run:NAME) or a chat checkpoint (hf:DIR), or set rl/chat=false",
        ),
        (
            ["rl/loss=ppo"],
            "error: rl/loss='ppo' is not accepted; use one of: grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo, vespo",
        ),
        (
            ["rl/loss=cispo", "rl/epsilon_high=0.2"],
            "error: rl/loss=cispo caps the importance ratio at rl/epsilon_high=0.2, below 1, which scales down every "
            "on-policy token; set rl/epsilon_high>=1 (MiniMax-M1 and ScaleRL use 5, its default)",
        ),
        (
            ["rl/loss=vespo", "rl/sampling_correction_mode=sequence_mask"],
            "error: rl/loss=vespo: vespo folds the sampling correction into its weight per token, so it takes a "
            "token_* mode, got 'sequence_mask'; set rl/sampling_correction_mode=token_mask or token_truncate",
        ),
        (
            ["rl/sampling_correction_min=2", "rl/sampling_correction_max=1.5"],
            "error: rl/sampling_correction_min=2.0 must be below rl/sampling_correction_max=1.5; lower the minimum "
            "or raise the maximum",
        ),
        (
            ["rl/sampling_correction_mode=token_truncate", "rl/sampling_correction_max=null"],
            "error: rl/sampling_correction_mode=token_truncate clips the ratio to bounds, but "
            "rl/sampling_correction_min and rl/sampling_correction_max are both null; set one",
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
    code = call_cli(["run", "train/pretrain", "environment=arithmetic", "--root", str(tmp_path)])
    assert code == 2
    assert error_line(capsys.readouterr().err) == (
        "error: Pretrain has no environment to select; environment= applies to the jobs that declare one"
    )
