"""Building what a trainer runs with from its configuration: sequence length, batch geometry, the data
loader, the learning-rate schedule and the optimizer.

Pure functions of their arguments; ``BaseTrainer.setup()`` calls them in order and keeps the results.
Each raises ``ConfigError`` with the key to change when the configuration cannot work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import flax.linen as nn
import optax

from theseus.errors import ConfigError
from theseus.training.matrices import with_parameter_axes
from theseus.training.optimizer_state import kept
from theseus.training.optimizers import Optimizer, clip_by_global_norm
from theseus.training.schedules import Schedule
from theseus.training.sharding import TrainerSharding


def sequence_length(requested: int | None, block_size: int | None) -> int:
    """The training sequence length: ``training/sequence_length`` or else the model's block size."""
    length = requested or block_size
    if not length:
        raise ConfigError("the model has no architecture/block_size; set training/sequence_length")
    if block_size and length > block_size:
        raise ConfigError(
            f"training/sequence_length={length} exceeds the model's architecture/block_size={block_size}; "
            "lower the sequence length or raise the block size"
        )
    return int(length)


def batch_geometry(batch_size: int, micro_batch_size: int | None, sharding: TrainerSharding) -> tuple[int, int]:
    """``(accumulation steps, global micro-batch rows)`` of one optimizer step over ``sharding``."""
    if batch_size <= 0:
        raise ConfigError(f"training/batch_size must be positive, got {batch_size}")
    micro = micro_batch_size or batch_size
    if micro <= 0 or batch_size % micro:
        raise ConfigError(
            f"training/batch_size={batch_size} is not divisible by training/micro_batch_size={micro}; "
            "choose a micro batch that divides the global batch"
        )
    processes = sharding.feed_count
    if batch_size % processes:
        raise ConfigError(
            f"training/batch_size={batch_size} cannot be split over {processes} processes; "
            f"make it a multiple of {processes}"
        )
    data = sharding.data_size
    if micro % data:
        raise ConfigError(
            f"the micro batch of {micro} rows cannot be split over {data} data-parallel devices; "
            f"make training/micro_batch_size (or training/batch_size) a multiple of {data}"
        )
    if sharding.pipeline_size > 1:
        parts = sharding.pipelining.microbatches_for(sharding.pipeline_size)
        if micro % (parts * data):
            raise ConfigError(
                f"the micro batch of {micro} rows cannot be cut into mesh/pipeline_microbatches={parts} parts of "
                f"{data} data-parallel shares; make training/micro_batch_size (or training/batch_size) a multiple "
                f"of {parts * data}"
            )
    return batch_size // micro, micro


def learning_rate_schedule(schedule: Schedule | None, lr: float, steps: int) -> optax.Schedule:
    """The declared schedule over ``steps`` updates peaking at ``lr``, or a constant ``lr``."""
    return schedule.create(lr, steps) if schedule is not None else optax.constant_schedule(lr)


def per_step(schedule: optax.Schedule, updates: int) -> optax.Schedule:
    """``schedule`` over optimizer updates when each step takes ``updates`` of them: update ``k`` gets the
    learning rate of step ``k // updates``."""
    if updates == 1:
        return schedule
    return lambda count: schedule(count // updates)


def optimizer_chain(
    optimizer: Optimizer,
    lr_schedule: optax.Schedule,
    grad_clip: float,
    variables: Any,
    *,
    state_dtype: str = "float32",
    offload: bool = False,
) -> optax.GradientTransformation:
    """Clipping (when ``grad_clip`` > 0) then ``optimizer``, told which abstract parameters of
    ``variables`` are matrices by their logical axis names (weight decay and Muon use it). The optimizer's
    state is kept in ``state_dtype`` and, with ``offload``, in host memory
    (:func:`theseus.training.optimizer_state.kept`); clipping, which reads every gradient, stays outside."""
    parts = [clip_by_global_norm(grad_clip)] if grad_clip > 0 else []
    chain = optax.chain(*parts, kept(optimizer.create(lr_schedule), state_dtype, offload))
    return with_parameter_axes(chain, nn.get_partition_spec(variables)["params"])


def open_flywheel(
    declaration: Any,
    *,
    root: Path,
    sequence_length: int,
    batch_size: int,
    seed: int,
    sharding: TrainerSharding,
    accumulate_steps: int,
    vocab_size: int | None,
    block_size: int | None,
) -> Any:
    """The data loader of a DATASET declaration, checked against the model's vocabulary and block size."""
    from theseus.training.flywheel import Flywheel

    flywheel = Flywheel(
        declaration,
        root=root,
        block_size=sequence_length,
        batch_size=batch_size,  # global: each process materialises only its own rows
        seed=seed,
        process_index=sharding.feed_index,
        process_count=sharding.feed_count,
        micro_batches=accumulate_steps,
    )
    if vocab_size is not None:
        flywheel.check_model(int(vocab_size), int(block_size or sequence_length))
    return flywheel


__all__ = ["batch_geometry", "learning_rate_schedule", "open_flywheel", "optimizer_chain", "sequence_length"]
