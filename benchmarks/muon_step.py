"""Muon's Newton-Schulz iterations batched over like matrices against one parameter at a time.

The bare flax + optax loop (``benchmarks.bare_loop.BareLoop``) on one GPT workload, timed
interleaved with three optimizers (global-norm clipping in front of each):

* ``AdamW``: the bare loop's own optimizer (no orthogonalisation at all, for scale);
* ``Muon, per parameter``: ``optax.contrib.muon``, which runs the iterations parameter by parameter;
* ``Muon, batched``: theseus's Muon (:mod:`theseus.training.muon`): the same mathematics, one
  batched iteration per group of matrices with the same shape and axis names.

Both Muons get the model's logical axis names, as in a trainer. The default workload is a GPT of
the demo's size (tiny preset with 2 layers and 2 heads, unpadded byte vocabulary, 8 rows of 128
tokens; the demo itself uses Llama's blocks).

Run ``python benchmarks/muon_step.py`` or e.g. ``--preset small --batch 8 --seq 256 --layers 0``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bare_loop import LEARNING_RATE, BareLoop, make_optimizer
from benchmarks.common import (
    add_workload_arguments,
    interleaved,
    load_average,
    machine_line,
    start_like_theseus_run,
)
from benchmarks.workload import Workload

PER_PARAMETER = "Muon, per parameter (optax)"
BATCHED = "Muon, batched (theseus)"


def optax_muon_like(config: Any, learning_rate: float) -> Any:
    """``optax.contrib.muon`` configured as theseus's :class:`~theseus.training.optimizers.Muon`
    with ``config`` (a ``MuonConfig``): the per-parameter reference."""
    from optax.contrib import muon as optax_muon

    from theseus.training.optimizers import decay_mask, muon_parameters

    return optax_muon(
        learning_rate,
        ns_steps=config.ns_steps,
        beta=config.beta,
        nesterov=config.nesterov,
        weight_decay=config.weight_decay,
        weight_decay_mask=decay_mask,
        adam_b1=config.adam_beta1,
        adam_b2=config.adam_beta2,
        adam_weight_decay=0.0,
        adam_learning_rate=learning_rate * config.adam_lr_ratio,
        muon_weight_dimension_numbers=lambda p: muon_parameters(p, config.exclude),
        consistent_rms=config.consistent_rms or None,
    )


def muon_factories(work: Workload) -> dict[str, Any]:
    """``{name: () -> optax transformation}`` of the two Muons, told the model's axis names."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import optax

    from theseus.training.matrices import with_parameter_axes
    from theseus.training.optimizers import Muon

    model = work.model
    boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, work.seq), jnp.int32)))
    specs = nn.get_partition_spec(boxed)["params"]
    config = Muon.config()

    def clipped(factory: Any) -> Any:
        return lambda: with_parameter_axes(optax.chain(optax.clip_by_global_norm(1.0), factory()), specs)

    return {
        PER_PARAMETER: clipped(lambda: optax_muon_like(config, LEARNING_RATE)),
        BATCHED: clipped(lambda: Muon.create(LEARNING_RATE, config)),
    }


def compare(
    preset: str, batch: int, seq: int, overrides: dict[str, Any], *, steps: int, repeats: int
) -> tuple[Workload, dict[str, tuple[float, float]]]:
    """The workload and ``{optimizer: (ms per step, ÷ per-parameter Muon)}``, timed interleaved."""
    work = Workload.create(preset, batch=batch, seq=seq, vocab_size=257, overrides=overrides)
    loops = [BareLoop(work, optimizer=make_optimizer)]
    loops[0].name = "AdamW"
    for name, factory in muon_factories(work).items():
        loop = BareLoop(work, optimizer=factory)
        loop.name = name
        loops.append(loop)
    timings = interleaved(loops, steps=steps, repeats=repeats, warmup=1)
    base = timings[PER_PARAMETER]
    return work, {
        name: (
            timing.step_seconds * 1e3,
            statistics.median(x / y for x, y in zip(timing.windows, base.windows, strict=True)),
        )
        for name, timing in timings.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.set_defaults(seq=128)
    parser.add_argument("--layers", type=int, default=2, help="architecture/n_layers (0: the preset's)")
    parser.add_argument("--heads", type=int, default=2, help="architecture/n_heads (0: the preset's)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    overrides: dict[str, Any] = {"architecture/vocab_multiple": 1}
    if args.layers:
        overrides["architecture/n_layers"] = args.layers
    if args.heads:
        overrides["architecture/n_heads"] = args.heads
    before = load_average()
    work, result = compare(args.preset, args.batch, args.seq, overrides, steps=args.steps, repeats=args.repeats)
    shape = f"{args.preset} {work.dims.n_layer} layers x {work.dims.n_embd}, {args.batch}x{args.seq}"
    print(f"{machine_line()}; {shape}; load {before} -> {load_average()}")
    print(f"{'optimizer':30s} {'ms/step':>9s} {'÷ per-parameter Muon':>21s}")
    for name, (ms, ratio) in result.items():
        print(f"{name:30s} {ms:9.1f} {ratio:21.3f}")


if __name__ == "__main__":
    start_like_theseus_run()
    main()
