"""Splash attention under the trainer's layouts (one subprocess on 4 simulated devices, see
``splash_layouts_run.py``): fsdp, fsdp+tp and a 2-stage pipeline train on XLA attention's losses; inside
pipeline stages the layers say in one line that they use XLA attention."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, clean_env


@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    root = tmp_path_factory.mktemp("splash")
    out = root / "results.json"
    command = [sys.executable, "-m", "tests.models.splash_layouts_run", str(root), str(out)]
    finished = subprocess.run(command, capture_output=True, text=True, env=clean_env(), cwd=REPO, timeout=600)
    assert finished.returncode == 0, finished.stderr[-3000:]
    return json.loads(out.read_text()), finished.stderr


def test_every_layout_trains_on_the_losses_of_xla_attention(done: tuple[dict[str, Any], str]) -> None:
    losses, _ = done
    for layout in ("fsdp", "fsdp+tp", "pipeline"):
        xla, kernel = losses[f"{layout}-xla"], losses[f"{layout}-splash"]
        assert len(kernel) == 3
        np.testing.assert_allclose(kernel, xla, atol=1e-5, rtol=0, err_msg=layout)
    assert losses["fsdp-splash"][-1] < losses["fsdp-splash"][0]


def test_pipeline_stages_say_once_that_they_use_xla_attention(done: tuple[dict[str, Any], str]) -> None:
    _, stderr = done
    notices = [line for line in stderr.splitlines() if line.startswith("notice: splash")]
    assert notices == [
        "notice: splash attention does not take attention inside a pipeline stage; this layer uses XLA attention"
    ]
