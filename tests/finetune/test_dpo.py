"""The DPO job end to end on a tiny GPT: log 2 at the first step, held-out reward accuracy well above
chance, the three sources of the reference agree, precomputed references kept and reused, gradient
accumulation, bit-exact resume, IPO and SimPO, and one-line errors."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import clean_env
from tests.finetune.conftest import TINY_DPO, preference_rows, prepare_preferences, write_jsonl
from tests.finetune.test_sft import cli_settings, leaves, read_checkpoint
from tests.reliability.conftest import call_cli, error_line
from theseus.model.finetune import DPOTrainer

pytestmark = pytest.mark.slow

#: TINY_DPO with one layer (nothing here depends on the depth) and the compilation cache a run keeps by
#: default: every program is kept as it is compiled, so the killed run's processes load the ones this process
#: compiled, as a user's restart does.
DPO = {**TINY_DPO, "architecture/n_layers": 1, "training/compilation_cache": True}

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/accuracies",
    "rewards/margins",
    "logps/chosen",
    "logps/rejected",
)


def records(root: Path, run: str, split: str) -> list[dict[str, Any]]:
    lines = (root / "runs" / run / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["split"] == split]


def losses(root: Path, run: str) -> np.ndarray:
    return np.asarray([r["loss"] for r in records(root, run, "train")])


def train(root: Path, run: str, **overrides: Any) -> DPOTrainer:
    trainer = DPOTrainer.create(root, {**DPO, **overrides, "run/name": run})
    trainer.run()
    trainer.close()
    return trainer  # type: ignore[return-value]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prepared preference pairs and a 24-step full DPO run (``learned``) whose reference is a frozen copy."""
    folder = tmp_path_factory.mktemp("dpo-root")
    prepare_preferences(folder)
    train(folder, "learned", **{"training/steps": 24, "training/eval_batches": 2})
    return folder


def test_first_step_is_log_2_and_the_held_out_reward_accuracy_is_well_above_chance(root: Path) -> None:
    first = records(root, "learned", "train")[0]
    assert first["step"] == 1 and first["loss"] == pytest.approx(math.log(2), abs=1e-6)  # policy = reference
    assert first["rewards/margins"] == pytest.approx(0.0, abs=1e-6)
    assert all(name in first for name in METRICS)
    held_out = records(root, "learned", "val")[-1]
    assert held_out["step"] == 24 and held_out["pairs"] == 8
    assert held_out["rewards/accuracies"] >= 0.9, held_out  # chance is 0.5
    # val/loss is the responses' cross-entropy (every objective's score); DPO's own loss rides beside it
    assert held_out["rewards/margins"] > 0.5 and held_out["preference_loss"] < 0.4 < held_out["loss"]
    assert held_out["logps/chosen"] > held_out["logps/rejected"]


def test_a_precomputed_reference_trains_the_same_curve_and_is_kept_for_resume(
    root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    train(root, "precomputed", **{"training/steps": 4, "dpo/precompute_reference": True})
    assert "reference: log-probabilities of 64 pairs (train, val)" in capsys.readouterr().err
    np.testing.assert_allclose(losses(root, "precomputed"), losses(root, "learned")[:4], atol=1e-5, rtol=0)
    folder = root / "runs" / "precomputed" / "reference"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["documents"] == {"train": 112, "val": 16} and manifest["sequence_length"] == 48
    assert np.load(folder / "train.npy").shape == (112,) and np.all(np.load(folder / "train.npy") < 0)

    train(root, "precomputed", **{"training/steps": 6, "dpo/precompute_reference": True})  # resumes at 4
    assert "log-probabilities of" not in capsys.readouterr().err  # read back, not computed again
    np.testing.assert_allclose(losses(root, "precomputed")[:6], losses(root, "learned")[:6], atol=1e-5, rtol=0)


def test_lora_reference_is_the_base_with_adapters_off(root: Path) -> None:
    lora = {"training/steps": 3, "model/lora/rank": 4, "model/lora/targets": ["query", "value", "up", "down"]}
    train(root, "lora", **lora)
    train(root, "lora-precomputed", **lora, **{"dpo/precompute_reference": True})
    adapters_off, precomputed = losses(root, "lora"), losses(root, "lora-precomputed")
    assert adapters_off[0] == pytest.approx(math.log(2), abs=1e-6)
    np.testing.assert_allclose(adapters_off, precomputed, atol=1e-5, rtol=0)
    assert adapters_off[-1] < adapters_off[0] - 1e-3  # the adapters learn


def test_accumulated_micro_batches_give_the_update_of_one_batch(root: Path) -> None:
    train(root, "accumulated", **{"training/steps": 3, "training/micro_batch_size": 2})
    np.testing.assert_allclose(losses(root, "accumulated"), losses(root, "learned")[:3], atol=1e-5, rtol=0)
    for ours, whole in zip(records(root, "accumulated", "train"), records(root, "learned", "train"), strict=False):
        assert ours["rewards/margins"] == pytest.approx(whole["rewards/margins"], abs=1e-5)


def test_ipo_and_simpo(root: Path) -> None:
    train(root, "ipo", **{"training/steps": 2, "dpo/loss": "ipo", "dpo/beta": 0.1})
    assert losses(root, "ipo")[0] == pytest.approx((1 / (2 * 0.1)) ** 2, abs=1e-4)  # zero margin at the start
    train(root, "simpo", **{"training/steps": 3, "dpo/loss": "simpo", "dpo/beta": 2.0, "dpo/simpo_gamma": 0.5})
    simpo = records(root, "simpo", "train")
    assert all(math.isfinite(r["loss"]) for r in simpo) and simpo[-1]["loss"] < simpo[0]["loss"]
    assert simpo[0]["rewards/chosen"] == pytest.approx(2.0 * simpo[0]["logps/chosen"], rel=1e-5)  # no reference
    assert not (root / "runs" / "simpo" / "reference").exists()


def test_killed_dpo_run_resumes_bit_exact(root: Path) -> None:
    changes = {"training/steps": 4, "training/checkpoint_interval": 2, "dpo/precompute_reference": True}
    settings = {**DPO, **changes}
    # the uninterrupted run in this process: it reuses the programs the precomputed-reference test compiled
    # (a third process would compile or load them again); the killed run and its restart are processes of
    # their own, as a user's are, and load those programs from the compilation cache
    train(root, "whole", **changes)
    command = [sys.executable, "-m", "theseus.cli.main", "run", "train/dpo", "--root", str(root)]
    killed_command = [*command, *cli_settings({**settings, "run/name": "killed"})]
    killed = subprocess.run(
        killed_command, env=clean_env(THESEUS_TEST_KILL_AT="step:3"), capture_output=True, text=True
    )
    assert killed.returncode == -9, killed.stderr
    resumed = subprocess.run(killed_command, env=clean_env(), capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming run 'killed' from step 2" in resumed.stderr and "log-probabilities of" not in resumed.stderr
    final, reference = (
        leaves(read_checkpoint(root / "runs" / "killed", 4)),
        leaves(read_checkpoint(root / "runs" / "whole", 4)),
    )
    assert final.keys() == reference.keys()
    for key in reference:
        assert final[key].tobytes() == reference[key].tobytes(), key


def bad_file(root: Path, name: str, rows: list[dict[str, Any]]) -> str:
    return str(write_jsonl(root / "bad" / f"{name}.jsonl", rows))


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing-rejected", ":2 has no 'rejected' field; each preference row needs"),
        ("chosen-equals-rejected", "every one of the 3 rows of"),
        ("mixed-shapes", ":1 mixes shapes: 'prompt', 'chosen' and 'rejected' must all be strings"),
    ],
)
def test_bad_preference_rows_are_one_line_errors(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str, message: str
) -> None:
    rows = preference_rows(3)
    if case == "missing-rejected":
        del rows[1]["rejected"]
    elif case == "chosen-equals-rejected":
        rows = [{**row, "rejected": row["chosen"]} for row in rows]
    else:
        rows[0]["chosen"] = [{"role": "assistant", "content": "sure"}]
    path = bad_file(tmp_path, case, rows)
    capsys.readouterr()
    args = ["run", "data/tokenize", "--root", str(tmp_path), "data/dataset=preference", f"data/preference/path={path}"]
    code = call_cli(args)
    line = error_line(capsys.readouterr().err)
    assert code != 0 and message in line, line


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"dataset": "preference:1:packed"}, "DPOTrainer trains on preference pairs; read them in the 'pairs' style"),
        (
            {"training/batch_size": 6, "training/micro_batch_size": 3},
            "a micro batch of 3 rows splits a preference pair",
        ),
        ({"dpo/loss": "kto"}, "dpo/loss"),
    ],
    ids=["not-pairs", "odd-micro-batch", "unknown-loss"],
)
def test_bad_dpo_settings_are_one_line_errors(
    root: Path, capsys: pytest.CaptureFixture[str], overrides: dict[str, Any], message: str
) -> None:
    capsys.readouterr()
    code = call_cli(["run", "train/dpo", "--root", str(root), *cli_settings({**DPO, **overrides})])
    line = error_line(capsys.readouterr().err)
    assert code == 2 and message in line, line


def test_responses_cut_by_the_row_length_are_reported(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    DPOTrainer.create(root, {**DPO, "training/sequence_length": 16, "run/name": "cut"}).setup()
    err = capsys.readouterr().err
    assert "note: 112 of 112 training responses are longer than training/sequence_length=16 and are cut" in err
    DPOTrainer.create(root, {**DPO, "run/name": "whole"}).setup()
    assert "are cut" not in capsys.readouterr().err
