"""A plugin's own Hugging Face family: the example's ``hf/example_scaled_gpt`` carries a ``ScaledGPT``
run out with ``hf/export`` and back in with ``hf/import``, logits unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.models.conftest import forward
from tests.plugins_example.test_wheel_install import TINY
from tests.reliability.conftest import call_cli
from tests.tolerances import float32_tolerance, magnitude, model_ops

pytestmark = pytest.mark.slow


def test_a_plugin_model_round_trips_through_its_hf_family(tmp_path: Path) -> None:
    from theseus.model.loading.run import load_run
    from theseus_plugins_example.models import ScaledGPT

    root = ["--root", str(tmp_path / "root")]
    assert (
        call_cli(
            [
                "run",
                "data/tokenize",
                "data/dataset=python-stdlib",
                "data/max_documents=24",
                "data/val_fraction=0.125",
                *root,
            ]
        )
        == 0
    )
    train = ["example/gpt/train", *TINY, "architecture/scale=0.5", "analysis=", "run/name=scaled"]
    assert call_cli(["run", *train, *root]) == 0
    folder = tmp_path / "export"
    assert call_cli(["run", "hf/export", "hf/run=scaled", f"hf/out={folder}", *root]) == 0
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "example_scaled_gpt" and config["scale"] == 0.5
    assert call_cli(["run", "hf/import", f"hf/source={folder}", "run/name=back", *root]) == 0

    trained, back = load_run(tmp_path / "root", "scaled"), load_run(tmp_path / "root", "back")
    assert type(back.model) is ScaledGPT and back.config["architecture/scale"] == 0.5
    ids = np.arange(24, dtype=np.int32).reshape(1, 24) % 250
    ours, theirs = forward(trained.model, trained.params, ids), forward(back.model, back.params, ids)
    atol = float32_tolerance(model_ops(trained.model), scale=magnitude(ours))
    np.testing.assert_allclose(theirs, ours, atol=atol, rtol=0)
