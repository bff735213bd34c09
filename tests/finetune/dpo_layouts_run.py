"""Subprocess of the DPO layout test: the same DPO run on 1 device and on 4 simulated devices.

``python dpo_layouts_run.py ROOT OUT.json`` trains a tiny GPT with DPO on the preference data under
``ROOT`` (one layer, 3 steps) on one device and on four as fsdp, tp and fsdp+tp, with a frozen-copy reference
and with LoRA (the reference being the adapters switched off), and writes each run's losses.
XLA_FLAGS must ask for 4 host devices before jax is imported.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.finetune.conftest import TINY_DPO
from theseus.model.finetune import DPOTrainer

#: One layer: the layouts' rules are the same on every layer, and each run traces and compiles the policy and
#: its reference, so a second layer only doubled that work.
LAYERS = {"architecture/n_layers": 1}
LORA = {"model/lora/rank": 4, "model/lora/targets": ["query", "value", "up", "down"]}
RUNS: dict[str, tuple[str | None, dict[str, Any]]] = {
    "copy/1": (None, {}),
    "copy/fsdp": ("fsdp", {}),
    "copy/tp": ("tp", {"mesh/model": 2, "mesh/data": 2}),
    "lora/1": (None, LORA),
    "lora/fsdp+tp": ("fsdp+tp", {**LORA, "mesh/data": 2, "mesh/model": 2}),
}


class OneDevice(DPOTrainer):
    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[:1]


def main(root: Path, out: Path) -> None:
    assert jax.device_count() == 4, jax.devices()
    found: dict[str, list[float]] = {}
    for name, (layout, settings) in RUNS.items():
        job = OneDevice if layout is None else DPOTrainer
        values = {**TINY_DPO, **LAYERS, **settings, "training/steps": 3, "run/name": name.replace("/", "-")}
        if layout is not None:
            values["mesh/layout"] = layout
        trainer = job.create(root, values)
        trainer.run()
        trainer.close()
        lines = (root / "runs" / values["run/name"] / "metrics.jsonl").read_text().splitlines()
        found[name] = [r["loss"] for r in map(json.loads, lines) if r["split"] == "train"]
    out.write_text(json.dumps(found))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
