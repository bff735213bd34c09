"""Pipeline parallelism on simulated devices (one subprocess, see ``pipeline_run.py``): gpipe, interleaved and 1f1b
over 4 stages, and 2 stages (1f1b) beside fsdp+tp, train on the losses of one device; each stage holds its share
of the stack, kept in the ``[n_layers, ...]`` form (under 1f1b, of the embedding's rows too); a pipelined
checkpoint resumes on one device on the same curve; settings that cannot work fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, clean_env


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("pipeline")
    out = root / "results.json"
    command = [sys.executable, "-m", "tests.parallel.pipeline_run", str(root), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_every_schedule_trains_on_the_curve_of_one_device(results: dict[str, Any]) -> None:
    runs = results["runs"]
    single = runs["single"]["losses"]
    assert len(single) == 5 and single[-1] < single[0] - 0.2
    meshes = {
        "gpipe": {"pipeline": 4, "data": 1, "model": 1},
        "interleaved": {"pipeline": 4, "data": 1, "model": 1},
        "1f1b": {"pipeline": 4, "data": 1, "model": 1},
        "fsdp+tp": {"pipeline": 2, "data": 2, "model": 2},
    }
    for name, mesh in meshes.items():
        assert runs[name]["mesh"] == mesh
        np.testing.assert_allclose(runs[name]["losses"], single, rtol=1e-5, atol=0, err_msg=name)
    assert len(runs["single"]["validated"]) == 1  # 1f1b's loss without a gradient: the stack, then the head
    np.testing.assert_allclose(runs["1f1b"]["validated"], runs["single"]["validated"], rtol=1e-5, atol=0)


def test_each_stage_holds_its_share_of_the_stack_in_the_stacked_form(results: dict[str, Any]) -> None:
    runs = results["runs"]
    for name in ("single", "gpipe", "interleaved", "1f1b", "fsdp+tp"):
        assert runs[name]["stack_shape"][0] == 8  # [n_layers, ...] whatever the mesh
    embeddings = 384 * 32 * 4  # bytes of the tied token embedding (vocabulary padded to 384), float32
    for name in ("gpipe", "interleaved", "1f1b"):
        assert runs[name]["stack"] * 4 == runs[name]["stack_total"]
    for name in ("gpipe", "interleaved"):
        assert runs[name]["other"] == runs[name]["other_total"]  # embeddings, head: replicated (dp)
    # 1f1b: the embedding's vocabulary rows split over the stages too; positions and the final norm whole
    assert runs["1f1b"]["other_total"] - runs["1f1b"]["other"] == embeddings * 3 / 4
    assert runs["fsdp+tp"]["stack"] * 2 < runs["fsdp+tp"]["stack_total"] / 2  # stages, then fsdp and tp


def test_a_pipelined_checkpoint_resumes_on_one_device(results: dict[str, Any]) -> None:
    np.testing.assert_allclose(results["resumed"], results["runs"]["single"]["losses"], rtol=1e-5, atol=0)


def test_settings_that_cannot_work_fail_in_one_line(results: dict[str, Any]) -> None:
    errors = results["errors"]
    fixes = {
        "devices": "mesh/pipeline=3 does not divide the 4 available devices",
        "layers": "set architecture/n_layers to a multiple of 4",
        "virtual": "set architecture/n_layers to a multiple of 6",
        "unrolled": "set model/scan_layers=true",
    }
    for name, fix in fixes.items():
        assert fix in errors[name] and "\n" not in errors[name], (name, errors[name])
