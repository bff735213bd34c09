"""Context parallelism's memory: temporaries per device of one training step's loss and gradients at a
long sequence, with the sequence on one device and split over ``mesh/context`` devices, read from the
compiled programs (nothing is run, so the sizes are those of the real sequence on a CPU host).

    python benchmarks/context_memory.py [--seq 16384] [--context 4] [--width 256] [--layers 2]

A GPT of ``--layers`` layers and ``--width`` channels (head width 64, remat per layer off) at batch 1:
the one-device program against the program on ``--context`` simulated devices, for each attention form.
Goal (at 16k over 4 devices): temporaries per device split ÷ one device <= 0.3.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def temporaries(seq: int, context: int, form: str, width: int, layers: int, kernel_alone: bool = False) -> int:
    """Bytes of temporaries per device of the loss-and-gradient program. ``kernel_alone``: one device, but
    attention through the context-parallel kernel (its online softmax and backward) on a context axis of
    size 1, which tells the kernel's saving from the split's."""
    import flax.linen as nn
    import jax
    import numpy as np

    from theseus.base.axis import ShardingPlan
    from theseus.config import Schema, configuration, configure, resolve
    from theseus.model.models import GPT
    from theseus.training.sharding import build_sharding

    keys = {
        "architecture/n_layers": layers,
        "architecture/n_embd": width,
        "architecture/n_heads": width // 64,
        "architecture/block_size": seq,
        "model/activation_dtype": "float32",
    }
    with configuration(resolve(Schema.build(GPT.gather()), overrides=keys)):
        model = configure(GPT)
    x = np.zeros((1, seq), np.int32)
    params = jax.eval_shape(lambda: nn.unbox(model.init(jax.random.key(0), x[:, :8])["params"]))

    def step(p: Any, x: jax.Array) -> Any:
        return jax.grad(lambda p: model.apply({"params": p}, x, x)[1])(p)

    devices = jax.devices()[:context]
    sharding = build_sharding(
        model.sharding if context > 1 else ShardingPlan(), context=context, context_attention=form, devices=devices
    )
    if kernel_alone:
        import dataclasses

        from jax.sharding import AxisType

        from theseus.base.axis import Axis, MeshAxis
        from theseus.model.layers import attention

        names = (MeshAxis.DATA, MeshAxis.CONTEXT, MeshAxis.MODEL)
        mesh = jax.make_mesh((1, 1, 1), names, axis_types=(AxisType.Auto,) * 3, devices=devices[:1])
        rules = [*sharding.parameter_fwdbwd_mapping, (Axis.SEQUENCE, MeshAxis.CONTEXT)]
        sharding = dataclasses.replace(sharding, mesh=mesh, parameter_fwdbwd_mapping=rules)
        attention.context_size = lambda: 2  # type: ignore[attr-defined]  # take the split path on one device
    with sharding.context():
        batch = jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding.batch_sharding(2))
        compiled = jax.jit(step).lower(params, batch).compile()
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=16384)
    parser.add_argument("--context", type=int, default=4)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args(argv)
    os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={args.context}")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    one = temporaries(args.seq, 1, "allgather", args.width, args.layers)
    print(f"GPT {args.layers} layers x {args.width}, batch 1 x {args.seq} tokens, float32")
    print("| program | temporaries per device | ÷ one device |\n|---|---|---|")
    print(f"| one device (blocked XLA attention) | {one / 2**20:.1f} MiB | 1.00 |")
    for form in ("allgather", "ring"):
        split = temporaries(args.seq, args.context, form, args.width, args.layers)
        print(f"| context={args.context} {form} | {split / 2**20:.1f} MiB | {split / one:.3f} |", flush=True)
    alone = temporaries(args.seq, 1, "ring", args.width, args.layers, kernel_alone=True)
    print(f"| one device, the context kernel | {alone / 2**20:.1f} MiB | {alone / one:.3f} |")


if __name__ == "__main__":
    main()
