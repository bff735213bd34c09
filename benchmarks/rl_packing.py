"""GRPO's log-probability passes on padded rows against the same completions packed (``rl/pack``).

    python benchmarks/rl_packing.py                  # on an accelerator: GPT 12 x 768, 64 completions, rows of 256
    python benchmarks/rl_packing.py --cpu-smoke      # tiny sizes on CPU (tests the script)
    python benchmarks/rl_packing.py --batch 128 --seq 512 --layers 24 --width 1024

A ``train/grpo`` trainer is built in this process (full fine-tuning with ``rl/beta > 0``, so it holds a
copied reference) and given one step of scored rollouts with the length spread of the docs' arithmetic
and calculator flows: prompts of 16-40 tokens and completions of 4-64, drawn at random (no decoding is
timed). The same rows are scored padded (one completion a row of ``--seq`` tokens) and packed (first-fit
decreasing into rows of ``--seq``, segment ids, :mod:`theseus.training.packing`), by the three passes a
step runs:

* **policy**: the loss and its gradient (``steps.objective_loss`` under ``jax.value_and_grad``, jitted);
* **reference**: the copied reference's log-probabilities (``Reference.logps``: placing the rows, the
  jitted pass, fetching the result, as a run does once per rollout);
* **old policy**: ``steps.old_policy_logps``, jitted (what ``rl/updates_per_rollout > 1`` runs once).

Each pair is timed side by side in rotated rounds after an untimed call; tokens/s count the real tokens
(prompt and completion), the same on both sides, so the ratio is the time saved. The packed rows' fill
(real tokens ÷ their positions) and count are printed with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, load_average, publish_table, rotated_rounds


@dataclasses.dataclass(frozen=True)
class Setting:
    layers: int = 12
    width: int = 768
    heads: int = 12
    vocab: int = 50304
    batch: int = 64  # completions (rl/group_size 16)
    seq: int = 256  # the rows' length (training/sequence_length)
    prompt: tuple[int, int] = (16, 40)
    completion: tuple[int, int] = (4, 64)
    bfloat16: bool = True
    rounds: int = 5


CPU_SMOKE = Setting(layers=2, width=64, heads=4, vocab=257, batch=32, seq=128, bfloat16=False, rounds=3)


def settings(setting: Setting) -> list[str]:
    """The run's keys: a GPT of ``setting``'s shape under ``train/grpo`` with a copied reference."""
    keys = [
        f"architecture/n_layers={setting.layers}",
        f"architecture/n_embd={setting.width}",
        f"architecture/n_heads={setting.heads}",
        f"architecture/vocab_size={setting.vocab}",
        f"architecture/block_size={setting.seq}",
        f"training/sequence_length={setting.seq}",
        f"training/batch_size={setting.batch}",
        "rl/group_size=16",
        f"rl/max_new_tokens={setting.completion[1]}",
        "rl/beta=0.04",
        "rl/pack=true",
        "training/plots=false",
        "environment=arithmetic",
    ]
    return keys + (["model/activation_dtype=bfloat16"] if setting.bfloat16 else [])


def rollouts(setting: Setting, seed: int = 0) -> Any:
    """One step's scored rollouts: each group's prompt, its completions of random lengths, random rewards."""
    import numpy as np

    from theseus.model.rl.rollouts import Rollouts

    rng = np.random.default_rng(seed)
    low, high = setting.prompt
    prompts = [list(rng.integers(1, 256, int(rng.integers(low, high + 1)))) for _ in range(setting.batch // 16)]
    low, high = setting.completion
    completions = [list(rng.integers(1, 256, int(rng.integers(low, high + 1)))) for _ in range(setting.batch)]
    rewards = [float(r) for r in rng.random(setting.batch)]
    rows = [p for p in prompts for _ in range(16)]
    return Rollouts(rows, completions, [True] * setting.batch, rewards, {"correct": rewards})


def measure(setting: Setting) -> tuple[list[Row], str]:
    import jax

    from theseus.model.rl.rollout_source import Sampled
    from theseus.model.rl.trainer import GRPOTrainer
    from theseus.training import packing, steps

    with tempfile.TemporaryDirectory(prefix="theseus-rl-packing-") as root:
        trainer = GRPOTrainer.create(Path(root), settings(setting))
        assert isinstance(trainer, GRPOTrainer)
        trainer.setup()
        assert trainer._reference is not None  # full fine-tuning with a KL: the copied reference
        state = trainer.state = trainer.init_state()
        packed = trainer.rollout_rows(Sampled(rollouts(setting), 0.0, 0), 0)
        padded = {k: v for k, v in packed.items() if k not in (*packing.PACKED_ROWS, packing.PACKED_INDEX)}
        batches = {"padded": trainer.device_train_batch(padded), "packed": trainer.device_train_batch(packed)}
        objective, cls, sharding, reference = trainer.objective(), type(trainer), trainer.sharding, trainer._reference

        def policy(batch: Any) -> Any:
            micro = jax.tree.map(lambda a: a[0], batch)

            def loss(params: Any) -> Any:
                return steps.objective_loss(cls, objective, state, params, micro, jax.random.key(0), False)[0]

            with sharding.context():
                return jax.value_and_grad(loss)(state.params)

        def old_policy(batch: Any) -> Any:
            return steps.old_policy_logps(state, batch, sharding)

        passes = {"policy": jax.jit(policy), "old policy": jax.jit(old_policy)}
        steps_timed: dict[str, tuple[Any, tuple[Any, ...]]] = {}
        for layout, batch in batches.items():
            for name, fn in passes.items():
                steps_timed[f"{name}, {layout}"] = (fn, (batch,))
            rows = packed if layout == "packed" else padded
            steps_timed[f"reference, {layout}"] = (reference.logps, (rows,))
        seconds = rotated_rounds(steps_timed, setting.rounds)
        trainer.close()
    real = int(padded["padding_mask"].sum())
    fill, count = float(packed["pack_fill"][0]), int(packed["pack_rows"][0])
    table = []
    for name in ("policy", "reference", "old policy"):
        rates = {layout: real / statistics.median(seconds[f"{name}, {layout}"]) for layout in batches}
        for layout, rate in rates.items():
            note = f"{count} rows, fill {100 * fill:.0f} %" if layout == "packed" else f"{setting.batch} rows"
            table.append(Row(f"{name}: {layout}, real tokens/s", rate, "tok/s", note=note, fmt="{:,.0f}"))
        table.append(Row(f"{name}: packed ÷ padded, tokens/s", rates["packed"] / rates["padded"], "x", fmt="{:.2f}"))
    padded_fill = real / (setting.batch * setting.seq)
    extra = (
        f"GPT {setting.layers}x{setting.width}, {setting.batch} completions in rows of {setting.seq} "
        f"(prompts {setting.prompt[0]}-{setting.prompt[1]}, completions {setting.completion[0]}-"
        f"{setting.completion[1]} tokens; {real} real tokens, padded fill {100 * padded_fill:.0f} %), "
        f"{'bfloat16' if setting.bfloat16 else 'float32'}, {jax.devices()[0].platform}, load {load_average()}"
    )
    return table, extra


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU")
    for name in ("layers", "width", "heads", "batch", "seq", "rounds"):
        parser.add_argument(f"--{name}", type=int, help=f"override the setting's {name}")
    parser.add_argument("--output", type=Path, help="also write the Markdown table here")
    args = parser.parse_args(argv)
    setting = CPU_SMOKE if args.cpu_smoke else Setting()
    chosen = {k: v for k, v in vars(args).items() if k in Setting.__dataclass_fields__ and v is not None}
    setting = dataclasses.replace(setting, **chosen)
    table, extra = measure(setting)
    publish_table(table, args.output, title="GRPO's log-probability passes, padded and packed", extra=extra)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
