"""A mixture-of-experts model against the dense model with the same active parameters, and the memory
expert parallelism saves, side by side in one run.

    python benchmarks/moe_model.py [--quick] [--rounds 5]

* **tokens/s**: the trainer's jitted step of Qwen3-MoE (``E`` experts of width ``h``, top ``k``) and of
  dense Qwen3 whose MLP is ``k * h`` wide (the same matmul weights per token, the router aside),
  same layers, heads, batch and data, timed in interleaved rounds. Ratio = MoE tokens/s ÷ dense
  tokens/s (median of per-round ratios). Goal >= 0.8; for scale, maxtext reports Mixtral 8x7B at
  54.9 % MFU and dense Llama2-70B at 65 % on one TPU type, a ratio of 0.84.
* **memory, EP=4 against EP=1**: on 4 simulated devices (a subprocess), the Qwen3-MoE trainer in the
  ``dp`` layout and in ``ep`` with ``mesh/expert=4``: parameter and optimizer-state bytes per device
  (from the state shardings) and the compiled train step's temporary bytes (XLA's memory analysis).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import load_average, machine_line

RATIO_GOAL = 0.8


def shapes(quick: bool) -> dict[str, Any]:
    """The shared shape (layers, width, heads, batch, sequence) and the mixture (E, k, h)."""
    if quick:
        return {"layers": 2, "width": 64, "heads": 4, "batch": 2, "seq": 32, "experts": 4, "top_k": 2, "hidden": 32}
    return {"layers": 4, "width": 256, "heads": 4, "batch": 8, "seq": 256, "experts": 8, "top_k": 2, "hidden": 256}


def overrides(shape: dict[str, Any], moe: bool) -> dict[str, Any]:
    common = {
        "architecture/n_layers": shape["layers"],
        "architecture/n_embd": shape["width"],
        "architecture/n_heads": shape["heads"],
        "architecture/n_kv_heads": shape["heads"],
        "architecture/head_dim": shape["width"] // shape["heads"],
    }
    if moe:
        return {
            **common,
            "architecture/moe/n_experts": shape["experts"],
            "architecture/moe/top_k": shape["top_k"],
            "architecture/moe/expert_hidden": shape["hidden"],
        }
    return {**common, "architecture/d_ff": shape["top_k"] * shape["hidden"]}


def throughput(shape: dict[str, Any], rounds: int, steps: int) -> dict[str, Any]:
    """Step times of the MoE and dense trainer steps, interleaved, and the tokens/s ratio."""
    from benchmarks.bare_loop import TrainerStepLoop
    from benchmarks.common import interleaved
    from benchmarks.workload import Workload

    loops = []
    for name, model, moe in (("dense qwen3", "qwen3", False), ("qwen3_moe", "qwen3_moe", True)):
        work = Workload.create(
            "tiny", batch=shape["batch"], seq=shape["seq"], model=model, overrides=overrides(shape, moe)
        )
        loop = TrainerStepLoop(work)
        loop.name = name
        loops.append(loop)
    timings = interleaved(loops, steps=steps, repeats=rounds, warmup=1)
    for loop in loops:
        loop.close()
    dense, mixture = timings["dense qwen3"], timings["qwen3_moe"]
    ratio = statistics.median(d / m for d, m in zip(dense.windows, mixture.windows, strict=True))
    tokens = shape["batch"] * shape["seq"]
    return {
        "dense_ms": dense.step_seconds * 1e3,
        "moe_ms": mixture.step_seconds * 1e3,
        "dense_tokens_per_s": tokens / dense.step_seconds,
        "moe_tokens_per_s": tokens / mixture.step_seconds,
        "ratio": ratio,
    }


def expert_memory(shape: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Bytes per device of the MoE trainer as dp and as ep (``mesh/expert=4``); needs 4 devices."""
    import jax
    import numpy as np

    from benchmarks.bare_loop import trainer_class, trainer_overrides
    from benchmarks.sharding_memory import device_bytes
    from benchmarks.workload import Workload
    from theseus.config import configuration

    work = Workload.create(
        "tiny", batch=4 * shape["batch"], seq=shape["seq"], model="qwen3_moe", overrides=overrides(shape, True)
    )
    out = {}
    for name, layout in (("EP=1 (dp)", {"mesh/layout": "dp"}), ("EP=4", {"mesh/layout": "ep", "mesh/expert": 4})):
        with tempfile.TemporaryDirectory() as root:
            trainer = trainer_class(work).create(root, trainer_overrides(work, **layout))
            trainer.setup()
            abstract, shardings = trainer.abstract_state, trainer.state_shardings
            params = device_bytes(abstract.params, shardings.params)[0]
            opt = device_bytes(abstract.opt_state, shardings.opt_state)[0]
            rows = trainer.micro_rows
            batch = {
                "x": np.zeros((rows, shape["seq"]), np.int32),
                "y": np.zeros((rows, shape["seq"]), np.int32),
                "padding_mask": np.ones((rows, shape["seq"]), bool),
            }
            with configuration(trainer.context.config):
                device_batch = trainer.device_train_batch(batch)
                state_shape = jax.tree.map(
                    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings
                )
                compiled = trainer.train_step_fn().lower(state_shape, device_batch, trainer.step_key(0)).compile()
            analysis = compiled.memory_analysis()
            temp = int(analysis.temp_size_in_bytes) if analysis is not None else -1
            out[name] = {"params": params, "opt_state": opt, "step_temp": temp}
    return out


def memory_in_subprocess(quick: bool) -> dict[str, dict[str, int]]:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=4".strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    command = [sys.executable, str(Path(__file__).resolve()), "--memory-json"] + (["--quick"] if quick else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"moe_model memory subprocess failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def mib(value: int) -> str:
    return f"{value / 2**20:,.2f} MiB"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed window")
    parser.add_argument("--memory-json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    shape = shapes(args.quick)
    if args.memory_json:
        print(json.dumps(expert_memory(shape)))
        return
    print(f"{machine_line()}; load {load_average()}", flush=True)
    e, k, h = shape["experts"], shape["top_k"], shape["hidden"]
    print(
        f"{shape['layers']} layers, width {shape['width']}, batch {shape['batch']} x {shape['seq']}: "
        f"Qwen3-MoE E={e} k={k} h={h} against dense Qwen3 d_ff={k * h}"
    )
    result = throughput(shape, 2 if args.quick else args.rounds, 2 if args.quick else args.steps)
    print("| Model | Step | Tokens/s |\n|---|---|---|")
    print(f"| dense qwen3 | {result['dense_ms']:.1f} ms | {result['dense_tokens_per_s']:,.0f} |")
    print(f"| qwen3_moe | {result['moe_ms']:.1f} ms | {result['moe_tokens_per_s']:,.0f} |")
    print(f"MoE ÷ dense tokens/s: {result['ratio']:.3f} (goal >= {RATIO_GOAL})", flush=True)
    memory = memory_in_subprocess(args.quick)
    print("\n| Layout (4 devices) | Parameters / device | Optimizer state / device | Step temporaries |")
    print("|---|---|---|---|")
    for name, row in memory.items():
        print(f"| {name} | {mib(row['params'])} | {mib(row['opt_state'])} | {mib(row['step_temp'])} |")
    one, four = memory["EP=1 (dp)"], memory["EP=4"]
    state_ratio = (four["params"] + four["opt_state"]) / (one["params"] + one["opt_state"])
    print(f"EP=4 ÷ EP=1 parameters + optimizer state per device: {state_ratio:.3f}")
    if one["step_temp"] > 0 and four["step_temp"] > 0:
        print(f"EP=4 ÷ EP=1 step temporaries per device: {four['step_temp'] / one['step_temp']:.3f}")
    print(f"load {load_average()}")


if __name__ == "__main__":
    main()
