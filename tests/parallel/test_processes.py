"""Context and pipeline parallelism across processes (two processes of two devices, gloo collectives
between them), against one process training the same job on one device, loss by loss:

- steps 1-3 of the CLI's ``train/pretrain`` with every sequence split over a ``context`` axis of 4 that
  spans both processes, then a checkpoint;
- steps 4-5 resumed from it with the layer stack in two pipeline stages, one per process (each stage's
  rows over its process's two devices): a context-parallel checkpoint read on another mesh.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import clean_env, run_joined, xla_flags
from tests.distributed.settings import overrides
from tests.reliability.conftest import call_cli
from tests.training.conftest import write_byte_corpus

TOLERANCE = 1e-5


def losses(run_dir: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {row["step"]: row["loss"] for row in rows if row["split"] == "train"}


def devices(count: int) -> dict[str, str]:
    return clean_env(XLA_FLAGS=xla_flags(devices=count), JAX_PLATFORMS="cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("processes")
    write_byte_corpus(root, "fineweb")
    # two layers: the pipeline's two stages hold one each
    common = ["run", "train/pretrain", "--root", str(root)]
    two_layers = {"architecture__n_layers": 2}
    split = overrides(
        run__name="split", mesh__context=4, training__stop_after=3, mesh__context_attention="ring", **two_layers
    )
    joined = run_joined([*common, *split], env=lambda _: devices(2))
    for process in joined:
        assert process.returncode == 0, process.stderr[-3000:]
    staged = run_joined(
        [*common, *overrides(run__name="split", mesh__pipeline=2, **two_layers)], env=lambda _: devices(2)
    )
    for process in staged:
        assert process.returncode == 0, process.stderr[-3000:]
    # the reference in this process (one device, the suite's XLA flags): a process of its own would only
    # import jax and theseus again
    assert call_cli([*common, *overrides(run__name="one", **two_layers)]) == 0
    return {
        **{name: losses(root / "runs" / name) for name in ("split", "one")},
        "log": joined[0].stdout + joined[0].stderr,
        "staged_log": staged[0].stdout + staged[0].stderr,
    }


def test_a_context_axis_across_two_processes_trains_as_one_device(runs: dict[str, Any]) -> None:
    assert "'context': 4" in runs["log"]  # the start-up line names the mesh
    assert sorted(runs["one"]) == [1, 2, 3, 4, 5]
    for step in (1, 2, 3):
        assert abs(runs["split"][step] - runs["one"][step]) <= TOLERANCE


def test_pipeline_stages_on_two_processes_continue_it_as_one_device(runs: dict[str, Any]) -> None:
    """Steps 4 and 5, trained in two pipeline stages from the context-parallel run's checkpoint of step 3."""
    assert "'pipeline': 2" in runs["staged_log"]
    assert sorted(runs["split"]) == [1, 2, 3, 4, 5]
    for step in (4, 5):
        assert abs(runs["split"][step] - runs["one"][step]) <= TOLERANCE
