"""Subprocess of the GRPO layout test: the same GRPO runs on 4 simulated devices.

``python grpo_layouts_run.py ROOT`` trains ``LAYOUTS`` (full fine-tuning and LoRA in fsdp+tp) under
``ROOT`` through the CLI, rollouts on the run's mesh. XLA_FLAGS must ask for 4 host devices before jax
is imported.
"""

from __future__ import annotations

import sys
from pathlib import Path

import jax

assert jax.device_count() == 4, jax.devices()  # before the test modules reset XLA_FLAGS
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.reliability.conftest import call_cli  # noqa: E402  (after the device check)
from tests.rl.test_grpo import LAYOUT_RUN, LAYOUTS, grpo_args  # noqa: E402

if __name__ == "__main__":
    root = Path(sys.argv[1])
    for name, settings in LAYOUTS.items():
        assert call_cli(grpo_args(root, *LAYOUT_RUN, *settings, f"run/name={name}")) == 0, name
