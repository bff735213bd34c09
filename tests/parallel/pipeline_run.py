"""Subprocess of the pipeline tests (8 simulated devices; XLA_FLAGS set before jax starts).

``python -m tests.parallel.pipeline_run ROOT OUT.json`` trains an 8-layer GPT (width 32) 5 steps on one
device and records, per run, the training losses, the mesh, the shape of a stacked parameter and the
bytes of stacked-layer and other parameters on the first device:

* ``single``: one device (validated at the end);
* ``gpipe``, ``interleaved`` and ``1f1b``: ``mesh/pipeline=4`` (4 micro-batches; interleaved with 2 virtual
  stages and ``model/remat=full``, each tick run again in the backward pass; 1f1b with 8, more than the
  7 inputs a stage holds at most);
* ``fsdp+tp``: ``mesh/pipeline=2`` (1f1b) beside ``mesh/data=2`` and ``mesh/model=2`` on 8 devices;
* ``resumed``: the gpipe run's step-3 checkpoint resumed on one device to step 5 (the run's losses then);
* ``errors``: the one-line ConfigError of each of ``MISTAKES`` (setup only).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, ClassVar

from tests.conftest import xla_flags
from tests.distributed.settings import setup_errors

os.environ["XLA_FLAGS"] = xla_flags(devices=8)
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import numpy as np

from theseus.training.pretrain import Pretrain

ROWS, STEPS = 8, 32
ARGS = {
    "model": "gpt",
    "architecture/n_layers": 8,
    "architecture/n_embd": 32,
    "architecture/n_heads": 2,
    "architecture/block_size": STEPS,
    "model/scan_layers": True,
    "model/activation_dtype": "float32",
    "model/loss_chunk": 16,  # tokens per device: the loss by chunks of a few positions, in every schedule
    "training/batch_size": ROWS,
    "training/steps": 5,
    "training/lr": 3e-3,
    "training/log_interval": 1,
    "training/eval_batches": 0,
    "training/checkpoint_interval": 3,  # the step the resume reads (and the end's)
    "training/async_checkpoints": False,
    "training/progress": False,
    "training/compilation_cache": False,
    "training/peak_flops": 1e12,
}
PIPELINES = {
    "gpipe": {"mesh/pipeline": 4, "mesh/pipeline_microbatches": 4},
    "interleaved": {
        "mesh/pipeline": 4,
        "mesh/pipeline_schedule": "interleaved",
        "mesh/pipeline_microbatches": 4,
        "mesh/pipeline_virtual": 2,
        "model/remat": "full",  # each tick run again in the backward pass
    },
    # 8 micro-batches through 4 stages: stage 0 holds at most 7 inputs, so its slots are reused; validated
    # at the end (the loss without its gradient), as the one device is
    "1f1b": {
        "mesh/pipeline": 4,
        "mesh/pipeline_schedule": "1f1b",
        "mesh/pipeline_microbatches": 8,
        "training/eval_batches": 1,
    },
}
EIGHT = {
    "fsdp+tp": {
        "mesh/pipeline": 2,
        "mesh/pipeline_schedule": "1f1b",  # gathers and reductions of fsdp and tp inside its branches
        "mesh/layout": "fsdp+tp",
        "mesh/data": 2,
        "mesh/model": 2,
    }
}

#: Settings that cannot work on 4 devices.
MISTAKES = {
    "devices": {"mesh/pipeline": 3},
    "layers": {"mesh/pipeline": 4, "architecture/n_layers": 6},
    "virtual": {"mesh/pipeline": 2, "mesh/pipeline_schedule": "interleaved", "mesh/pipeline_virtual": 3},
    "unrolled": {"mesh/pipeline": 4, "model/scan_layers": False},
}


class Tiny(Pretrain):
    """Random byte rows (the same for every layout): nothing to prepare."""

    DATASET: ClassVar[Any] = []
    EVALUATION: ClassVar[Any] = []
    DEVICES: ClassVar[int] = 8

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.position(slice))
        tokens = rng.integers(0, 64, (self.batch_rows, STEPS + 1)).astype(np.int32)
        return {"x": tokens[:, :-1], "y": tokens[:, 1:]}

    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[: self.DEVICES]


class OneDevice(Tiny):
    DEVICES = 1


class FourDevices(Tiny):
    DEVICES = 4


def losses(root: Path, run: str, split: str = "train") -> list[float]:
    rows = [json.loads(line) for line in (root / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    return [row["loss"] for row in rows if row.get("split") == split]


def held_bytes(trainer: Tiny) -> dict[str, Any]:
    """Bytes of the stacked layers' parameters and of the others on the first device, and a stacked shape."""
    assert trainer.state is not None
    first = jax.devices()[0]
    held = {"stack": 0, "stack_total": 0, "other": 0, "other_total": 0}
    shape: list[int] = []
    for path, leaf in jax.tree_util.tree_flatten_with_path(trainer.state.params)[0]:
        kind = "stack" if str(getattr(path[0], "key", path[0])) == "blocks" else "other"
        held[kind] += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == first)
        held[f"{kind}_total"] += leaf.nbytes
        if kind == "stack" and not shape:
            shape = list(leaf.shape)
    return {**held, "stack_shape": shape}


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    results: dict[str, Any] = {"device_count": jax.device_count(), "runs": {}}
    runs = [
        ("single", OneDevice, {"training/eval_batches": 1}),
        *((name, FourDevices, extra) for name, extra in PIPELINES.items()),
        *((name, Tiny, extra) for name, extra in EIGHT.items()),
    ]
    for name, cls, extra in runs:
        trainer = cls.create(root, {**ARGS, **extra, "run/name": name})
        trainer.run()
        results["runs"][name] = {
            "losses": losses(root, name),
            "validated": losses(root, name, "val"),
            "mesh": dict(trainer.sharding.mesh.shape),
            **held_bytes(trainer),
        }
    OneDevice.create(root, {**ARGS, "run/name": "gpipe", "training/resume_step": 3}).run()
    results["resumed"] = losses(root, "gpipe")  # steps 4 and 5 now from one device
    results["errors"] = setup_errors(FourDevices, root, ARGS, MISTAKES)
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
