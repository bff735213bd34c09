"""Subprocess of the splash attention layout test (4 simulated devices; XLA_FLAGS set before jax starts).

``python -m tests.models.splash_layouts_run ROOT OUT.json`` trains a tiny Llama (4 query heads sharing 2
key/value heads, a sliding window) 3 steps with ``architecture/attention_impl`` ``xla`` and ``splash``
(interpreted on CPU) under fsdp over 4 devices, fsdp+tp (2 x 2: each device holds two query
heads and one key/value head) and a 2-stage pipeline, and records each run's training losses.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from tests.conftest import xla_flags

os.environ["XLA_FLAGS"] = xla_flags(devices=4)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import numpy as np

from theseus.training.pretrain import Pretrain

ROWS, STEPS = 4, 32
ARGS = {
    "model": "llama",
    "architecture/n_layers": 2,
    "architecture/n_embd": 32,
    "architecture/n_heads": 4,
    "architecture/n_kv_heads": 2,
    "architecture/sliding_window": 12,
    "architecture/block_size": STEPS,
    "model/scan_layers": True,
    "model/activation_dtype": "float32",
    "training/batch_size": ROWS,
    "training/steps": 3,
    "training/lr": 3e-3,
    "training/log_interval": 1,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 0,
    "training/progress": False,
    "training/compilation_cache": False,
    "training/peak_flops": 1e12,
}
LAYOUTS: dict[str, tuple[int, dict[str, Any]]] = {
    "fsdp": (4, {"mesh/layout": "fsdp", "mesh/data": 4}),
    "fsdp+tp": (4, {"mesh/layout": "fsdp+tp", "mesh/data": 2, "mesh/model": 2}),
    "pipeline": (2, {"mesh/pipeline": 2, "mesh/pipeline_microbatches": 2}),
}


class Tiny(Pretrain):
    """Random token rows, the same for every layout; the second row padded after 20 tokens."""

    DATASET: ClassVar[Any] = []
    EVALUATION: ClassVar[Any] = []
    DEVICES: ClassVar[int] = 1

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.position(slice))
        tokens = rng.integers(0, 64, (self.batch_rows, STEPS + 1)).astype(np.int32)
        mask = np.ones((self.batch_rows, STEPS), bool)
        mask[1, 20:] = False
        return {"x": tokens[:, :-1], "y": tokens[:, 1:], "padding_mask": mask}

    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[: self.DEVICES]


def losses(root: Path, run: str) -> list[float]:
    rows = [json.loads(line) for line in (root / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("split") == "train"]


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    results: dict[str, Any] = {}
    for name, (devices, extra) in LAYOUTS.items():
        for impl in ("xla", "splash"):
            cls = type(f"Tiny{devices}", (Tiny,), {"DEVICES": devices})
            run = f"{name}-{impl}"
            values = {**ARGS, **extra, "architecture/attention_impl": impl, "run/name": run}
            cls.create(root, values).run()
            results[run] = losses(root, run)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
