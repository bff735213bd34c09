"""Subprocess of the scale-out tests: the same job on 1 device and on 4 devices in every layout.

``python layouts_run.py ROOT OUT.json [RUN]`` trains ``PlainGPT`` (5 steps, gradient
accumulation over 4 micro-batches on one device, 2 on four) on one device and on all four
(simulated) devices as dp, fsdp, tp and fsdp+tp, and records each run's losses and the
shardings of its parameters and optimizer state. With ``RUN``, it then resumes that run
(written by two processes in the dp layout) as fsdp+tp.
XLA_FLAGS must ask for 4 host devices before jax is imported.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks import sharding_memory
from benchmarks.sharding_memory import device_bytes
from tests.distributed.jobs import DistributedGPT, PlainGPT
from tests.distributed.settings import SETTINGS, setup_errors

LAYOUTS = {"dp": (-1, 1), "fsdp": (-1, 1), "tp": (1, -1), "fsdp+tp": (2, 2)}


class OneDevice(PlainGPT):
    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[:1]


def _path(path: tuple[Any, ...]) -> str:
    return "/".join(str(getattr(entry, "key", getattr(entry, "idx", entry))) for entry in path)


def losses(root: Path, run: str) -> dict[str, list[float]]:
    rows = [json.loads(line) for line in (root / "runs" / run / "metrics.jsonl").read_text().splitlines()]
    return {
        "train": [row["loss"] for row in rows if row["split"] == "train"],
        "steps": [row["step"] for row in rows if row["split"] == "train"],
        "val": [row["loss"] for row in rows if row["split"] == "val"],
    }


def _bytes_on_first_device(tree: Any) -> int:
    """Bytes of ``tree``'s shards that live on the first device."""
    first = jax.devices()[0]
    return sum(
        shard.data.nbytes
        for leaf in jax.tree.leaves(tree)
        for shard in leaf.addressable_shards
        if shard.device == first
    )


def describe(tree: Any) -> dict[str, dict[str, Any]]:
    """Path -> global shape, partition spec and the shape each device holds."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if not hasattr(leaf, "sharding") or not np.shape(leaf):
            continue
        out[_path(path)] = {
            "shape": list(leaf.shape),
            "spec": [list(a) if isinstance(a, tuple) else a for a in leaf.sharding.spec],
            "device_shapes": sorted({tuple(s.data.shape) for s in leaf.addressable_shards}),
            "devices": len(leaf.sharding.device_set),
        }
    return out


#: Sizes that do not split over the 4 devices, and the layout that would split them.
MISTAKES = {
    "heads": {"mesh/layout": "tp", "mesh/data": 1, "mesh/model": -1, "architecture/n_heads": 2},
    "vocab": {
        "mesh/layout": "fsdp+tp",
        "mesh/data": 1,
        "mesh/model": 4,
        "architecture/vocab_size": 258,
        "architecture/vocab_multiple": 2,
    },
    "embed": {"mesh/layout": "fsdp", "architecture/n_embd": 30, "architecture/n_heads": 6},
    "batch": {"mesh/layout": "dp", "training/batch_size": 6, "training/micro_batch_size": 0},
    "mesh": {"mesh/layout": "fsdp+tp", "mesh/data": 3, "mesh/model": -1},
}


def main() -> None:
    root, out = Path(sys.argv[1]), Path(sys.argv[2])
    resume = sys.argv[3] if len(sys.argv) > 3 else None
    import flax.linen as nn

    results: dict[str, Any] = {"device_count": jax.device_count(), "runs": {}}
    runs = [("single", OneDevice, "dp", 1, 1), *((name, PlainGPT, name, *shape) for name, shape in LAYOUTS.items())]
    trainers = {}
    for name, cls, layout, data, model in runs:
        extra = {"mesh/layout": layout, "mesh/data": data, "mesh/model": model, "run/name": name}
        if name == "single":
            extra["training/micro_batch_size"] = 2  # 4 micro-batches: the batch does not depend on it
        if name in ("dp", "fsdp+tp"):
            extra.update({"training/eval_interval": 3, "training/eval_batches": 1})
        trainer = cls.create(root, {**SETTINGS, **extra}, name=f"test/distributed/{name}")
        trainer.run()
        trainers[name] = trainer
        assert trainer.state is not None
        with trainer.sharding.context():
            boxed = jax.eval_shape(
                lambda k, t=trainer: t.model.init(k, np.zeros((1, t.sequence_length), np.int32)), trainer.init_key
            )
        logical = {
            _path(path): list(spec)
            for path, spec in jax.tree_util.tree_flatten_with_path(
                nn.get_partition_spec(boxed)["params"], is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)
            )[0]
        }
        abstract, shardings = trainer.abstract_state, trainer.state_shardings
        planned = [
            device_bytes(abstract.params, shardings.params),
            device_bytes(abstract.opt_state, shardings.opt_state),
        ]
        held = [_bytes_on_first_device(trainer.state.params), _bytes_on_first_device(trainer.state.opt_state)]
        results["runs"][name] = {
            "bytes": {"planned": [b[0] for b in planned], "whole": [b[1] for b in planned], "held": held},
            "mesh": dict(trainer.sharding.mesh.shape),
            "layout": trainer.sharding.layout,
            "sharding_type": type(trainer.sharding).__qualname__,
            "losses": losses(root, name),
            "params": describe(trainer.state.params),
            "opt_state": describe(trainer.state.opt_state),
            "logical": logical,
        }
    results["errors"] = setup_errors(PlainGPT, root, SETTINGS, MISTAKES)
    benchmark = sharding_memory.run(["tiny"], 4, 2, init_memory=False)
    results["benchmark"] = [dataclasses.asdict(row) for row in benchmark]
    results["benchmark_table"] = sharding_memory.table(benchmark, 4)
    if resume is not None:
        # A run resumes only with the evaluations and analyses it started with, so the two-process
        # run's own job continues it, in another layout (fsdp+tp), another micro-batching and with
        # its layers unrolled (the checkpoint holds them stacked).
        data, model = LAYOUTS["fsdp+tp"]
        extra = {
            "model/scan_layers": False,
            "mesh/layout": "fsdp+tp",
            "mesh/data": data,
            "mesh/model": model,
            "run/name": resume,
            "training/eval_interval": 3,
            "training/eval_batches": 1,
            "training/evaluation_interval": 3,
            "training/analysis_interval": 3,
            "evaluation/perplexity/batches": 1,
            "evaluation/multiple_choice/limit": 3,
            "analysis/activations/plot": False,
        }
        trainer = DistributedGPT.create(root, {**SETTINGS, **extra}, name="test/distributed/gpt")
        trainer.run()
        assert trainer.state is not None
        results["resumed"] = {
            "losses": losses(root, resume),
            "step": int(trainer.state.step),
            "params": describe(trainer.state.params),
        }
    out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
