"""DPO on 4 simulated devices (fsdp, tp, fsdp+tp; frozen-copy and LoRA references) trains the
curve of one device, in a subprocess that starts jax with the devices (``dpo_layouts_run.py``)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import clean_env, xla_flags
from tests.finetune.conftest import prepare_preferences


def test_sharded_layouts_train_the_curve_of_one_device(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prepare_preferences(root)
    out = tmp_path / "losses.json"
    script = Path(__file__).with_name("dpo_layouts_run.py")
    env = clean_env(XLA_FLAGS=xla_flags(devices=4))
    done = subprocess.run([sys.executable, str(script), str(root), str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    for mode, layouts in (("copy", ["fsdp", "tp"]), ("lora", ["fsdp+tp"])):
        one = found[f"{mode}/1"]
        assert one[0] == pytest.approx(math.log(2), abs=1e-6) and one[-1] < one[0]
        for layout in layouts:
            np.testing.assert_allclose(found[f"{mode}/{layout}"], one, atol=1e-5, rtol=0, err_msg=f"{mode}/{layout}")
