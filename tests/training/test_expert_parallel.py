"""Expert parallelism on 4 and 8 simulated devices (one subprocess, see ``expert_parallel_run.py``): the
all-to-all expert paths equal the loop over experts, every layout with ``ep`` trains on the losses of
one device, an ep checkpoint resumes on one device on the same curve, each device holds its share of
the experts, and impossible settings fail in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, clean_env, xla_flags
from tests.training.conftest import write_byte_corpus

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("expert-parallel")
    write_byte_corpus(root, "fineweb")
    out = root / "results.json"
    env = clean_env(XLA_FLAGS=xla_flags(devices=8), JAX_PLATFORMS="cpu")
    command = [sys.executable, str(HERE / "expert_parallel_run.py"), str(root), str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


def test_all_to_all_experts_equal_the_loop_over_experts(results: dict[str, Any]) -> None:
    layer = results["layer"]
    for path in ("dropless", "capacity"):
        assert layer[f"{path}_scale"] > 1  # the outputs are not trivially small
        assert layer[f"{path}_forward"] <= 1e-5 and layer[f"{path}_grad"] <= 1e-5, layer


def test_every_expert_parallel_layout_trains_on_the_curve_of_one_device(results: dict[str, Any]) -> None:
    assert results["device_count"] == 8
    runs = results["runs"]
    single = runs["single"]["losses"]
    assert single["steps"] == [1, 2, 3, 4, 5] and single["loss"][-1] < single["loss"][0] - 0.2
    meshes = {
        "ep": {"expert": 4, "data": 1, "model": 1},
        "fsdp+ep": {"expert": 2, "data": 2, "model": 1},
        "tp+ep": {"expert": 2, "data": 1, "model": 2},
        "fsdp+tp+ep": {"expert": 2, "data": 2, "model": 2},
    }
    for layout, mesh in meshes.items():
        run = runs[layout]
        assert run["mesh"] == mesh
        for key in ("loss", "aux_loss", "moe_tokens_max"):
            np.testing.assert_allclose(run["losses"][key], single[key], rtol=1e-5, atol=0, err_msg=f"{layout} {key}")


def test_each_device_holds_its_share_of_the_experts(results: dict[str, Any]) -> None:
    runs = results["runs"]
    whole = runs["single"]["expert_bytes"]
    assert runs["ep"]["expert_bytes"] * 4 == whole  # 1 of 4 experts per device
    assert runs["ep"]["expert_spec"][0] == "expert"
    assert runs["fsdp+ep"]["expert_bytes"] * 4 == whole  # 2 experts per device, their width over data
    assert runs["fsdp+ep"]["expert_spec"][:2] == ["expert", "data"]
    assert runs["tp+ep"]["expert_bytes"] * 4 == whole
    assert "model" in runs["tp+ep"]["expert_spec"]
    assert runs["fsdp+tp+ep"]["expert_bytes"] * 8 == whole  # over expert, data and model
    assert runs["fsdp+tp+ep"]["expert_spec"][0] == "expert" and "model" in runs["fsdp+tp+ep"]["expert_spec"]


def test_an_expert_parallel_checkpoint_resumes_on_one_device(results: dict[str, Any]) -> None:
    resumed, single = results["resumed"], results["runs"]["single"]["losses"]
    assert resumed["steps"] == [1, 2, 3, 4, 5]
    np.testing.assert_allclose(resumed["loss"], single["loss"], rtol=1e-5, atol=0)


def test_expert_settings_that_cannot_work_fail_in_one_line(results: dict[str, Any]) -> None:
    errors = results["errors"]
    expected = {
        "experts": "architecture/moe/n_experts=6 cannot be split over mesh/expert=4; set mesh/expert to a divisor",
        "layout": "mesh/expert=2 but layout 'fsdp' does not shard over the expert axis; use mesh/layout=ep or fsdp+ep",
        "devices": "mesh/expert=3 does not divide the 4 available devices",
    }
    for name, fragment in expected.items():
        assert fragment in errors[name] and "\n" not in errors[name], errors[name]
