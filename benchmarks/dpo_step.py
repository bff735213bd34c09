"""Step time of preference tuning against SFT on the same batches of pairs, side by side in one run.

    python benchmarks/dpo_step.py [--layers 4] [--width 256] [--block 128] [--rows 16] [--rounds 7]

One prepared preference dataset (synthetic pairs, byte tokens), one GPT shape, and, interleaved
round by round, the update of:

* ``sft``: ``train/sft`` reading the same pairs (cross-entropy on both responses);
* ``dpo copy``: DPO whose reference is a frozen copy of the start (a second forward beside the step);
* ``dpo precomputed``: DPO with ``dpo/precompute_reference=true`` (reference looked up per document);
* ``dpo lora``: DPO with LoRA (rank 8), the reference being the policy with its adapters off, in the
  same compiled step; and ``sft lora`` for its ratio.

Each timed update includes what the trainer does per step on the device side
(``device_train_batch`` and the jitted step); the ratios are medians of per-round ratios.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from theseus.config import configuration, configure
from theseus.data.datasets import Preference
from theseus.data.prepare import prepare
from theseus.model.finetune import DPOTrainer, SFTTrainer


def write_pairs(root: Path, count: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    lines = []
    for _ in range(count):
        prompt = "Q: " + " ".join(rng.choice(words, size=6)) + "\nA: "
        chosen = " ".join(rng.choice(words, size=int(rng.integers(6, 14))))
        rejected = " ".join(rng.choice(words, size=int(rng.integers(6, 14))))
        lines.append(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}))
    path = root / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with configuration({"data/preference/path": str(path), "data/val_fraction": 0.0}):
        dataset = configure(Preference)
    prepare(dataset, root, tokenizer="byte")


class Variant:
    """One trainer's update, driven outside its loop: host batches built once, then timed steps."""

    def __init__(self, name: str, job: Any, root: Path, settings: dict[str, Any], rounds: int) -> None:
        self.name = name
        self.trainer = job.create(root, {**settings, "run/name": name.replace(" ", "-")})
        self.trainer.setup()
        self.state = self.trainer.init_state()
        self.hosts = [self.trainer.host_batch("train", position=i) for i in range(rounds + 1)]
        self.fn = self.trainer.train_step_fn()
        self.step(0)  # compile

    def step(self, index: int) -> float:
        begun = time.perf_counter()
        batch = self.trainer.device_train_batch(self.hosts[index])
        self.state, loss, *_ = self.fn(self.state, batch, self.trainer.step_key(index))
        jax.block_until_ready((self.state, loss))
        return time.perf_counter() - begun


def measure(layers: int, width: int, block: int, rows: int, rounds: int) -> dict[str, float]:
    """Median step seconds per variant, timed interleaved (one step of each per round)."""
    settings = {
        "architecture/n_layers": layers,
        "architecture/n_embd": width,
        "architecture/n_heads": max(1, width // 64),
        "architecture/block_size": block,
        "training/batch_size": rows,
        "training/steps": rounds + 2,
        "training/progress": False,
        "training/compilation_cache": False,
        "dataset": "preference:1:pairs",
    }
    lora = {"model/lora/rank": 8, "model/lora/targets": ["query", "value"]}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_pairs(root, 4 * rows)
        variants = [
            Variant("sft", SFTTrainer, root, settings, rounds),
            Variant("dpo copy", DPOTrainer, root, settings, rounds),
            Variant("dpo precomputed", DPOTrainer, root, {**settings, "dpo/precompute_reference": True}, rounds),
            Variant("sft lora", SFTTrainer, root, {**settings, **lora}, rounds),
            Variant("dpo lora", DPOTrainer, root, {**settings, **lora}, rounds),
        ]
        seconds: dict[str, list[float]] = {v.name: [] for v in variants}
        for r in range(rounds):
            for v in variants[r % len(variants) :] + variants[: r % len(variants)]:
                v.step(r + 1)  # untimed: the first step after another variant's
                seconds[v.name].append(v.step(r + 1))
        for v in variants:
            v.trainer.close()
    return {name: statistics.median(values) for name, values in seconds.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--block", type=int, default=128)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    times = measure(args.layers, args.width, args.block, args.rows, args.rounds)
    print(f"GPT {args.layers}x{args.width}, {args.rows} rows ({args.rows // 2} pairs) of {args.block} tokens")
    print("| update | step time | ÷ SFT |")
    print("|---|---|---|")
    for name, t in times.items():
        base = times["sft lora" if "lora" in name else "sft"]
        print(f"| {name} | {t * 1e3:.1f} ms | {t / base:.2f} |")


if __name__ == "__main__":
    main()
