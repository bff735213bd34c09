"""Context parallelism across processes: two processes of two devices each split every sequence over a
``context`` axis of 4 that spans both (gloo collectives between them), train 3 steps of the CLI's
``train/pretrain`` and checkpoint; one process on one device resumes that checkpoint to step 5. Every
loss equals one process training the same 5 steps on one device."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import clean_env, run_cli, run_joined, xla_flags
from tests.distributed.settings import overrides
from tests.training.conftest import write_byte_corpus

TOLERANCE = 1e-5


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["split"] == "train"}


def devices(count: int) -> dict[str, str]:
    return clean_env(XLA_FLAGS=xla_flags(devices=count), JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("context-processes")
    write_byte_corpus(root, "fineweb")
    common = ["run", "train/pretrain", "--root", str(root)]
    split = overrides(run__name="split", mesh__context=4, training__stop_after=3, mesh__context_attention="ring")
    joined = run_joined([*common, *split], env=lambda _: devices(2))
    for process in joined:
        assert process.returncode == 0, process.stderr[-3000:]
    resumed = run_cli([*common, *overrides(run__name="split")], env=devices(1))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    one = run_cli([*common, *overrides(run__name="one")], env=devices(1))
    assert one.returncode == 0, one.stderr[-3000:]
    return {
        "split": losses(root / "runs" / "split"),
        "one": losses(root / "runs" / "one"),
        "log": joined[0].stdout + joined[0].stderr,
    }


def test_a_context_axis_across_two_processes_trains_as_one_device(runs: dict[str, Any]) -> None:
    assert "'context': 4" in runs["log"]  # the start-up line names the mesh
    assert sorted(runs["one"]) == [1, 2, 3, 4, 5]
    for step in (1, 2, 3):
        assert abs(runs["split"][step] - runs["one"][step]) <= TOLERANCE


def test_its_checkpoint_resumes_on_one_device(runs: dict[str, Any]) -> None:
    """Steps 4 and 5, trained on one device from the split run's checkpoint of step 3."""
    for step in (4, 5):
        assert abs(runs["split"][step] - runs["one"][step]) <= TOLERANCE
