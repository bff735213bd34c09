"""Parameter and optimizer-state bytes held by each device, per layout, on N simulated devices.

    python benchmarks/sharding_memory.py                      # tiny and gpt2-124m on 4 devices
    python benchmarks/sharding_memory.py --devices 8 --presets gpt2-124m
    python benchmarks/sharding_memory.py --init-memory        # also compile the sharded init (slow for 124M)

The trainer (``gpt`` model, AdamW) is set up for each layout exactly as ``theseus run`` would: the
mesh from ``mesh/*``, the parameter and optimizer-state shardings from the model's ``ShardingPlan``.
Shapes come from ``jax.eval_shape``, so nothing is allocated; the bytes a device holds are the
shard shape of every leaf under its sharding. With ``--init-memory`` the jitted initialisation is
compiled and XLA's memory analysis reports its output and temporary bytes per device: a sharded
initialisation never materialises the full parameters on one device.

The devices are simulated CPU devices (``XLA_FLAGS=--xla_force_host_platform_device_count=N``, set
before jax is imported; the script re-runs itself in a subprocess when jax is already loaded).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: GPT-2's vocabulary padded to a multiple of 128 (50257 does not split over a model axis).
PADDED_GPT2_VOCAB = 50304
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": {"architecture/preset": "tiny", "architecture/vocab_size": 256, "architecture/block_size": 256},
    "gpt2-124m": {
        "architecture/preset": "gpt2-124m",
        "architecture/vocab_size": PADDED_GPT2_VOCAB,
        "architecture/block_size": 1024,
    },
}
LAYOUTS = ("dp", "fsdp", "tp", "fsdp+tp")


@dataclasses.dataclass
class LayoutMemory:
    """Bytes per device of one preset under one layout (``error`` when the sizes do not split)."""

    preset: str
    layout: str
    mesh: dict[str, int]
    parameters: int = 0
    param_bytes: int = 0
    opt_bytes: int = 0
    total_param_bytes: int = 0
    total_opt_bytes: int = 0
    init_output_bytes: int | None = None
    init_temp_bytes: int | None = None
    error: str = ""

    @property
    def per_device(self) -> int:
        return self.param_bytes + self.opt_bytes


def mesh_sizes(layout: str, devices: int, model_axis: int) -> tuple[int, int]:
    """``(mesh/data, mesh/model)`` of a layout: tp puts every device on the model axis."""
    if layout in ("dp", "fsdp"):
        return devices, 1
    if layout == "tp":
        return 1, devices
    return devices // model_axis, model_axis


def device_bytes(abstract: Any, shardings: Any) -> tuple[int, int]:
    """``(bytes one device holds, bytes of the whole tree)``."""
    import jax
    import numpy as np

    from theseus.plan.build import held_bytes

    whole = sum(math.prod(leaf.shape) * np.dtype(leaf.dtype).itemsize for leaf in jax.tree.leaves(abstract))
    return held_bytes(abstract, shardings), whole


def measure(preset: str, layout: str, *, devices: int, model_axis: int = 2, init_memory: bool = False) -> LayoutMemory:
    """Set up the trainer of ``preset`` for ``layout`` on the first ``devices`` devices and count bytes."""
    import tempfile

    import jax

    from theseus.errors import ConfigError
    from theseus.training.base import BaseTrainer
    from theseus.training.state import create_state

    data, model = mesh_sizes(layout, devices, model_axis)

    class Trainer(BaseTrainer):
        MODEL = "gpt"
        DATASET: ClassVar[Any] = []

        def mesh_devices(self) -> list[Any]:
            return list(jax.devices())[:devices]

    settings = {
        **PRESETS[preset],
        "mesh/layout": layout,
        "mesh/data": data,
        "mesh/model": model,
        "training/batch_size": devices,
        "training/sequence_length": 8,
    }
    result = LayoutMemory(preset, layout, {"data": data, "model": model})
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer.create(root, settings)
        try:
            trainer.setup()
        except ConfigError as exc:
            result.error = str(exc)
            return result
        abstract, shardings = trainer.abstract_state, trainer.state_shardings
        result.parameters = sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(abstract.params))
        result.param_bytes, result.total_param_bytes = device_bytes(abstract.params, shardings.params)
        result.opt_bytes, result.total_opt_bytes = device_bytes(abstract.opt_state, shardings.opt_state)
        if init_memory:
            from theseus.config import configuration

            def init(key: jax.Array) -> Any:
                args = (trainer.model, trainer.tx, trainer.sharding, key, trainer.sequence_length, shardings)
                return create_state(*args)

            with configuration(trainer.context.config):
                compiled = jax.jit(init).lower(trainer.init_key).compile()
            analysis = compiled.memory_analysis()
            if analysis is not None:
                result.init_output_bytes = int(analysis.output_size_in_bytes)
                result.init_temp_bytes = int(analysis.temp_size_in_bytes)
    return result


def mib(value: int | None) -> str:
    return "—" if value is None else f"{value / 2**20:,.2f} MiB"


def table(results: list[LayoutMemory], devices: int) -> str:
    """A Markdown table: bytes per device of each layout, and the ratio to data parallel."""
    lines = [
        f"### Parameter + optimizer-state memory per device ({devices} devices, float32, AdamW)",
        "",
        "| Preset | Layout | Mesh (data x model) | Parameters / device | Optimizer state / device "
        "| Total / device | ÷ dp | Init output / temp per device |",
        "|---|---|---|---|---|---|---|---|",
    ]
    dp = {r.preset: r.per_device for r in results if r.layout == "dp" and not r.error}
    for r in results:
        mesh = f"{r.mesh['data']} x {r.mesh['model']}"
        if r.error:
            lines.append(f"| {r.preset} | {r.layout} | {mesh} | n/a | n/a | n/a | n/a | {r.error} |")
            continue
        ratio = f"{r.per_device / dp[r.preset]:.3f}" if r.preset in dp else "—"
        init = f"{mib(r.init_output_bytes)} / {mib(r.init_temp_bytes)}" if r.init_output_bytes is not None else "—"
        lines.append(
            f"| {r.preset} ({r.parameters / 1e6:.2f}M) | {r.layout} | {mesh} | {mib(r.param_bytes)} "
            f"| {mib(r.opt_bytes)} | {mib(r.per_device)} | {ratio} | {init} |"
        )
    return "\n".join(lines)


def run(presets: list[str], devices: int, model_axis: int, init_memory: bool) -> list[LayoutMemory]:
    """Measure every layout of every preset in this process (which must see ``devices`` devices)."""
    import jax

    if jax.device_count() < devices:
        raise SystemExit(
            f"jax sees {jax.device_count()} devices; set XLA_FLAGS=--xla_force_host_platform_device_count={devices} "
            "before jax is imported (or run this script directly)"
        )
    return [
        measure(preset, layout, devices=devices, model_axis=model_axis, init_memory=init_memory)
        for preset in presets
        for layout in LAYOUTS
    ]


def in_subprocess(presets: list[str], devices: int, model_axis: int, init_memory: bool) -> list[LayoutMemory]:
    """:func:`run` in a fresh interpreter with ``devices`` simulated CPU devices."""
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}".strip()
    env.setdefault("JAX_PLATFORMS", "cpu")
    command = [sys.executable, str(Path(__file__).resolve()), "--json-only", "--devices", str(devices)]
    command += ["--model-axis", str(model_axis), "--presets", *presets] + (["--init-memory"] if init_memory else [])
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode:
        raise RuntimeError(f"sharding_memory subprocess failed:\n{done.stderr[-3000:]}")
    return [LayoutMemory(**row) for row in json.loads(done.stdout.strip().splitlines()[-1])]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, default=4, help="simulated devices (default 4)")
    parser.add_argument("--model-axis", type=int, default=2, help="model axis size of fsdp+tp (default 2)")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS), choices=list(PRESETS))
    parser.add_argument("--init-memory", action="store_true", help="also compile the sharded initialisation")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if "jax" in sys.modules or args.json_only:
        results = run(args.presets, args.devices, args.model_axis, args.init_memory)
    else:
        results = in_subprocess(args.presets, args.devices, args.model_axis, args.init_memory)
    if args.json_only:
        print(json.dumps([dataclasses.asdict(r) for r in results]))
        return
    print(table(results, args.devices))


if __name__ == "__main__":
    main()
