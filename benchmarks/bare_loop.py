"""The framework-overhead baseline: a minimal hand-written flax + optax loop, and our trainer, on one workload.

The bare loop is what one writes without a framework: ``model.apply`` inside ``jax.value_and_grad``,
global-norm clipping + AdamW (the trainer's defaults: betas 0.9/0.95, weight decay 0.1 on matrices,
clip 1.0), one ``jax.jit`` with the state donated, batches copied from host memory each step and no
per-step synchronisation.

Our trainer is measured two ways on the same model and batches:

* :class:`TrainerStepLoop`: the trainer's jitted step (``train_step_fn``), driven exactly like the bare
  loop, so the two can be timed interleaved (window by window);
* :func:`measure_trainer_loop`: the whole ``trainer.run()`` loop (batch checks, dispatch, metric
  fetching, logging) at steady state.

Run ``python benchmarks/bare_loop.py --preset tiny --batch 8 --seq 256``.
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import (
    Loop,
    Timing,
    add_workload_arguments,
    interleaved,
    paired_ratio,
    rotated,
    start_like_theseus_run,
)
from benchmarks.workload import Workload

LEARNING_RATE = 3e-4


def make_optimizer(learning_rate: float = LEARNING_RATE) -> Any:
    """Global-norm clipping (1.0) then AdamW (0.9, 0.95, eps 1e-8) with weight decay 0.1 on matrices only."""
    import jax
    import optax

    def matrices(params: Any) -> Any:
        return jax.tree.map(lambda p: p.ndim >= 2, params)

    return optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.adamw(learning_rate, b1=0.9, b2=0.95, eps=1e-8, weight_decay=0.1, mask=matrices),
    )


class _JaxLoop(Loop):
    """Shared driving of a jitted step: host batch -> device each step, sync only at window ends."""

    def __init__(self, work: Workload) -> None:
        self.work = work
        self.tokens_per_step = work.tokens_per_step
        self.flops_per_step = work.flops_per_step()
        self.batches = work.host_batches()
        self.index = 0
        self.last: Any = None

    def step(self, index: int) -> Any:
        raise NotImplementedError

    def run(self, steps: int) -> None:
        import jax

        for _ in range(steps):
            self.last = self.step(self.index)
            self.index += 1
        jax.block_until_ready(self.last)

    def prepare(self, warmup: int) -> float:
        start = time.perf_counter()
        self.build()
        self.run(1)
        first = time.perf_counter() - start
        if warmup:
            self.run(warmup)
        return first

    def build(self) -> None:
        raise NotImplementedError

    def loss(self) -> float:
        return float(self.last)


class BareLoop(_JaxLoop):
    """The minimal flax + optax training loop on ``work.model`` (``optimizer``: a factory of the
    transformation to use instead of :func:`make_optimizer`)."""

    name = "bare flax+optax"

    def __init__(self, work: Workload, seed: int = 0, optimizer: Callable[[], Any] | None = None) -> None:
        if work.model is None:
            raise ValueError("BareLoop needs a built model (Workload.create(..., build=True))")
        super().__init__(work)
        self.seed = seed
        self.optimizer = optimizer or make_optimizer
        self.state: Any = None

    def build(self) -> None:
        import flax.linen as nn
        import jax
        import jax.numpy as jnp
        import optax

        model, seq = self.work.model, self.work.seq
        tx = self.optimizer()
        init_key, self.dropout_key = jax.random.split(jax.random.key(self.seed))

        @jax.jit
        def init(key: jax.Array) -> tuple[Any, Any]:
            variables = model.init({"params": key, "dropout": key}, jnp.zeros((1, seq), jnp.int32), deterministic=True)
            params = nn.unbox(variables)["params"]
            return params, tx.init(params)

        def loss_fn(params: Any, batch: dict[str, jax.Array], key: jax.Array) -> jax.Array:
            _logits, loss = model.apply(
                {"params": params},
                batch["x"],
                batch["y"],
                batch["padding_mask"],
                deterministic=False,
                rngs={"dropout": key},
            )
            return loss

        def step(state: tuple[Any, Any], batch: dict[str, jax.Array], key: jax.Array) -> tuple[Any, jax.Array]:
            params, opt_state = state
            loss, grads = jax.value_and_grad(loss_fn)(params, batch, key)
            updates, opt_state = tx.update(grads, opt_state, params)
            return (optax.apply_updates(params, updates), opt_state), loss

        self.jstep = jax.jit(step, donate_argnums=(0,))
        self.state = init(init_key)

    def step(self, index: int) -> Any:
        import jax

        batch = jax.device_put(self.batches[index % len(self.batches)])
        self.state, loss = self.jstep(self.state, batch, jax.random.fold_in(self.dropout_key, index))
        return loss

    def close(self) -> None:
        self.state = None


class _WindowDone(Exception):
    """Raised from ``batch()`` to end a timed ``run()`` once enough steps were seen."""


def trainer_class(work: Workload, base: type | None = None) -> Any:
    """A subclass of ``base`` (default ``BaseTrainer``; e.g. ``SFTTrainer``, whose quantized base is held out)
    training the workload's model on its batches (custom batching, ``DATASET = []``)."""
    from theseus.model.models import GPT
    from theseus.training.base import BaseTrainer

    batches = work.host_batches()

    class BenchmarkTrainer(base or BaseTrainer):  # type: ignore[misc,valid-type]
        MODEL = GPT if work.model is None else type(work.model)
        DATASET: ClassVar[list[Any]] = []

        def batch(self, slice: str = "train") -> dict[str, Any]:
            return batches[self.position(slice) % len(batches)]

    return BenchmarkTrainer


def trainer_overrides(work: Workload, **extra: Any) -> dict[str, Any]:
    """The trainer configuration for ``work``: its model keys, batch geometry, no validation, no progress bar,
    no compilation cache (the trainers run in temporary folders, and JAX keeps writing to the first
    folder configured in a process, which is gone by the time a later trainer compiles)."""
    values = {k: v for k, v in work.config.items() if k.startswith(("architecture/", "model/"))}
    values.update(
        {
            "training/batch_size": work.batch,
            "training/sequence_length": work.seq,
            "training/lr": LEARNING_RATE,
            "training/grad_clip": 1.0,
            "training/eval_batches": 0,
            "training/progress": False,
            "training/steps": 1_000_000,
            "training/checkpoint_interval": 0,
            "training/compilation_cache": False,
        }
    )
    values.update(extra)
    return values


class TrainerStepLoop(_JaxLoop):
    """Our trainer's jitted step (``train_step_fn``) driven like the bare loop, on the same batches."""

    name = "trainer step"

    def __init__(self, work: Workload) -> None:
        super().__init__(work)
        self._tmp = tempfile.TemporaryDirectory()
        self.state: Any = None

    def build(self) -> None:
        self.trainer = trainer_class(self.work).create(self._tmp.name, trainer_overrides(self.work))
        self.state = self.trainer.init_state()
        self.step_fn = self.trainer.train_step_fn()

    def step(self, index: int) -> Any:
        device_batch = self.trainer.device_train_batch(self.batches[index % len(self.batches)])
        outputs = self.step_fn(self.state, device_batch, self.trainer.step_key(index))  # (state, loss, meta, ...)
        self.state = outputs[0]
        return outputs[1]

    def close(self) -> None:
        self.state = None
        self._tmp.cleanup()


RUN_LOOP = "trainer run() loop"


def _settle() -> None:
    """Wait for every computation in flight (the training loop's dispatched update included)."""
    import jax

    jax.block_until_ready([a for a in jax.live_arrays() if not a.is_deleted()])


def measure_trainer_loop(
    work: Workload,
    others: Sequence[Loop] = (),
    *,
    steps: int = 5,
    repeats: int = 3,
    warmup: int = 2,
    extra: Mapping[str, Any] | None = None,
    keep: Path | None = None,
) -> dict[str, Timing]:
    """Our whole training loop (``trainer.run()``: data, dispatch, metrics, logging) at steady state,
    interleaved round by round with ``others`` (e.g. the bare loop and the PyTorch loop).

    The time of each ``batch()`` call is recorded. The loop runs one update ahead of the host: when
    ``batch()`` is called for step ``i``, update ``i-2`` has been fetched and ``i-1`` is running, so the
    interval between two calls is one update. Each round, at a boundary call, everything in flight is
    waited for and each of ``others`` runs one timed window of ``steps`` steps; the trainer's window is
    then the ``steps`` intervals starting two calls later (back at steady state) and ending at the next
    boundary. The run is ended from ``batch()`` after the last round (no checkpoint is written).
    ``first_step_seconds`` of the run loop spans ``run()`` to the completion of its first update. ``extra``:
    further trainer keys (``training/profile``); ``keep``: a folder that receives the run's root before it is
    removed.
    """
    firsts = {loop.name: loop.prepare(warmup) for loop in others}
    windows: dict[str, list[float]] = {loop.name: [] for loop in others}
    seen: list[float] = []
    boundaries = [1 + warmup + r * (steps + 2) for r in range(repeats + 1)]

    class TimedTrainer(trainer_class(work)):  # type: ignore[misc]
        def batch(self, slice: str = "train") -> dict[str, Any]:
            if slice == "train":
                seen.append(time.perf_counter())
                call = len(seen) - 1
                if call == boundaries[-1]:
                    raise _WindowDone
                if call in boundaries:
                    _settle()
                    for loop in rotated(others, boundaries.index(call)):
                        windows[loop.name].append(loop.window(steps) / steps)
                    _settle()
            return super().batch(slice)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = TimedTrainer.create(tmp, trainer_overrides(work, **(extra or {})))
        start = time.perf_counter()
        with contextlib.suppress(_WindowDone):
            trainer.run()
        if keep is not None:  # e.g. the run's profile/ folder (training/profile), kept past the temporary root
            shutil.copytree(Path(tmp), keep, dirs_exist_ok=True)
    if len(seen) <= boundaries[-1]:
        raise RuntimeError(f"the training loop stopped after {len(seen)} batches; expected {boundaries[-1] + 1}")
    timings = {
        loop.name: Timing(loop.name, firsts[loop.name], windows[loop.name], loop.tokens_per_step, loop.flops_per_step)
        for loop in others
    }
    run_windows = [(seen[b + 2 + steps] - seen[b + 2]) / steps for b in boundaries[:-1]]
    timings[RUN_LOOP] = Timing(RUN_LOOP, seen[2] - start, run_windows, work.tokens_per_step, work.flops_per_step())
    return timings


def trainer_available() -> str | None:
    """None when ``theseus.training.base.BaseTrainer`` imports, else the reason it does not."""
    try:
        from theseus.training.base import BaseTrainer  # noqa: F401
    except ImportError as exc:
        return f"trainer not available ({exc})"
    return None


def compare(
    work: Workload, *, steps: int = 5, repeats: int = 3, warmup: int = 2, extra: Sequence[Loop] = ()
) -> dict[str, Timing]:
    """Bare loop, trainer step, ``extra`` loops and the trainer's ``run()`` loop, timed round by round.

    Without a trainer, only the bare loop and ``extra`` are timed (interleaved).
    """
    loops: list[Loop] = [BareLoop(work)]
    if trainer_available() is None:
        loops.append(TrainerStepLoop(work))
    loops.extend(extra)
    try:
        if trainer_available() is None:
            return measure_trainer_loop(work, loops, steps=steps, repeats=repeats, warmup=warmup)
        return interleaved(loops, steps=steps, repeats=repeats, warmup=warmup)
    finally:
        for loop in loops:
            loop.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_arguments(parser)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    work = Workload.create(args.preset, batch=args.batch, seq=args.seq)
    timings = compare(work, steps=args.steps, repeats=args.repeats)
    bare = timings["bare flax+optax"]
    for timing in timings.values():
        print(
            f"{timing.name:<22} {timing.step_seconds * 1e3:9.1f} ms/step {timing.tokens_per_s:10.0f} tok/s "
            f"first step {timing.first_step_seconds:6.2f} s  vs bare {timing.step_seconds / bare.step_seconds:5.3f}"
        )
    for name, timing in timings.items():
        if name != bare.name:
            print(f"{name} ÷ bare (paired windows): {paired_ratio(timing, bare):.3f}")


if __name__ == "__main__":
    start_like_theseus_run()
    main()
