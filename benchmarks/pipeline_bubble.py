"""The pipeline bubble: expected against measured, per schedule; and each schedule's temporaries.

On 4 simulated CPU devices the trainer's jitted step of a GPT (8 scanned layers) runs with
``mesh/pipeline=4`` under each schedule and micro-batch count, and on one device without a pipeline
(the ideal: the same work with nothing idle). The simulated devices share the host's cores, so a stage
that waits frees no compute for another and the pipelined step costs its ticks' work in full: every
stage computes on every tick, idle ones on a placeholder. The measured bubble is therefore
``1 - ideal / pipelined`` step time (median of per-round ratios, the programs timed in rotated rounds),
beside the expected ``(S - 1) / (M V + S - 1)`` (S stages, M micro-batches, V virtual stages per device;
``V = 1`` for gpipe). On devices of their own an idle stage is idle time instead, and the same fraction
is the share of the step the stages wait.

``1f1b`` skips the work of its idle ticks (``lax.cond``) and runs each stage again in its backward tick,
so on shared cores its measured figure is that recomputation rather than waiting; compare it with
``gpipe`` under ``model/remat=full``, which recomputes as much. Its point is memory: the temporaries
column is the compiled step's per-device temporary bytes (XLA's memory analysis).

Run ``python benchmarks/pipeline_bubble.py [--quick]`` (``--quick``: small shapes, for a smoke test).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STAGES = 4
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={STAGES}"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (after XLA_FLAGS: the simulated devices)
import numpy as np  # noqa: E402

from benchmarks.common import machine_line, rotated_rounds  # noqa: E402
from theseus.base.axis import Pipelining  # noqa: E402
from theseus.training.pretrain import Pretrain  # noqa: E402

#: (name, schedule, micro-batches, virtual stages per device, model/remat)
CASES = (
    ("gpipe M=4", "gpipe", 4, 1, "none"),
    ("gpipe M=8", "gpipe", 8, 1, "none"),
    ("interleaved M=4 V=2", "interleaved", 4, 2, "none"),
    ("interleaved M=8 V=2", "interleaved", 8, 2, "none"),
    ("gpipe M=8 remat=full", "gpipe", 8, 1, "full"),
    ("gpipe M=16 remat=full", "gpipe", 16, 1, "full"),
    ("1f1b M=8 remat=full", "1f1b", 8, 1, "full"),
    ("1f1b M=16 remat=full", "1f1b", 16, 1, "full"),
)


class Bench(Pretrain):
    """Random rows, no data to prepare; the first ``DEVICES`` devices."""

    DATASET: ClassVar[Any] = []
    EVALUATION: ClassVar[Any] = []
    DEVICES: ClassVar[int] = STAGES

    def batch(self, slice: str = "train") -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.position(slice))
        tokens = rng.integers(0, 256, (self.batch_rows, self.sequence_length + 1)).astype(np.int32)
        return {"x": tokens[:, :-1], "y": tokens[:, 1:]}

    def mesh_devices(self) -> list[Any]:
        return list(jax.devices())[: self.DEVICES]


class OneDevice(Bench):
    DEVICES = 1


def step_of(cls: type[Bench], root: Path, overrides: dict[str, Any]) -> tuple[Any, list[Any], int]:
    """The trainer's jitted step and its arguments, compiled and run once, and its temporary bytes per device."""
    trainer = cls.create(root, overrides)
    trainer.setup()
    state = trainer.init_state()
    batch = trainer.device_train_batch(trainer.host_batch())
    fn = trainer.train_step_fn()
    key = trainer.step_key(0)

    def step(state: Any, batch: Any, key: Any) -> Any:
        return fn(jax.tree.map(lambda a: a.copy(), state), batch, key)  # the step donates its state

    jax.block_until_ready(step(state, batch, key))
    temporaries = fn.lower(state, batch, key).compile().memory_analysis().temp_size_in_bytes
    return step, [state, batch, key], temporaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke test)")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (default 7, quick 2)")
    args = parser.parse_args()
    width, seq, rows = (64, 32, 16) if args.quick else (256, 128, 32)
    rounds = args.rounds or (2 if args.quick else 7)
    base = {
        "model": "gpt",
        "architecture/n_layers": 8,
        "architecture/n_embd": width,
        "architecture/n_heads": 4,
        "architecture/block_size": seq,
        "model/scan_layers": True,
        "training/batch_size": rows,
        "training/progress": False,
        "training/compilation_cache": False,
    }
    print(f"# pipeline bubble: gpt {base['architecture/n_layers']} layers x {width}, {rows}x{seq} tokens/step")
    print(f"# {machine_line()}, {STAGES} simulated devices, {rounds} rounds")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        steps = {"ideal (1 device)": step_of(OneDevice, root, {**base, "run/name": "ideal"})}
        for name, schedule, micro, virtual, remat in CASES:
            overrides = {
                "mesh/pipeline": STAGES,
                "mesh/pipeline_schedule": schedule,
                "mesh/pipeline_microbatches": micro,
                "mesh/pipeline_virtual": max(virtual, 2),
                "model/remat": remat,
                "run/name": name.replace(" ", "-").replace("=", ""),
            }
            steps[name] = step_of(Bench, root, {**base, **overrides})
        seconds = rotated_rounds({name: (fn, args) for name, (fn, args, _) in steps.items()}, rounds)
    ideal = seconds["ideal (1 device)"]
    print("| schedule | step (ms) | expected bubble | measured bubble | temporaries / device (MiB) |")
    print("|---|---|---|---|---|")
    ideal_temporaries = steps["ideal (1 device)"][2] / 2**20
    print(f"| ideal (1 device) | {statistics.median(ideal) * 1e3:.1f} | 0 | 0 | {ideal_temporaries:.1f} |")
    for name, schedule, micro, virtual, _remat in CASES:
        measured = 1 - statistics.median(i / p for i, p in zip(ideal, seconds[name], strict=True))
        expected = Pipelining(schedule, micro, max(virtual, 2)).bubble(STAGES)
        step_ms, temporaries = statistics.median(seconds[name]) * 1e3, steps[name][2] / 2**20
        print(f"| {name} | {step_ms:.1f} | {expected:.3f} | {measured:.3f} | {temporaries:.1f} |")


if __name__ == "__main__":
    main()
