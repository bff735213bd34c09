"""The training step compiled ahead of time for the trainer's mesh: what it holds per device.

``theseus plan`` compiles it for a target's devices, and ``model/remat=auto`` for each candidate before a
run's first update (:mod:`theseus.training.memory`). The state, the batch and the key are shapes with
shardings, so nothing is allocated.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from theseus.errors import ConfigError, ResourceError, TheseusError

#: A size as XLA's TPU compiler writes it in an out-of-memory refusal (``15.75G``: binary units).
_COMPILER_SIZE = re.compile(r"(\d+(?:\.\d+)?)([KMGT])(?:i?B)?\b")
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class StepTooLarge(ResourceError):
    """The compiler refused the step for want of device memory (XLA's TPU compiler checks the chip's
    memory itself): what it said it needs and has, when it said, and the batch that was tried."""

    def __init__(self, needed_bytes: int | None, available_bytes: int | None, trainer: Any) -> None:
        from theseus.base.failures import REMAT_KEY, memory_advice

        self.needed_bytes = needed_bytes
        self.available_bytes = available_bytes
        self.batch_size = int(trainer.args.batch_size)
        self.sequence_length = int(trainer.sequence_length)
        self.unit = int(trainer.sharding.data_size)  # batches are tried in multiples of the data-parallel size
        self.remat = trainer.context.config.get(REMAT_KEY)  # the policy refused (where auto had come to)
        super().__init__(
            f"the training step of {self.batch_size} x {self.sequence_length} tokens does not fit in the device's "
            f"memory (the compiler {self.amount()}); {memory_advice(trainer.context.config)}"
        )

    def amount(self) -> str:
        """``needs 21.67 GB of 16.91 GB`` (decimal units, as the plan's), or ``ran out`` without figures."""
        if self.needed_bytes and self.available_bytes:
            return f"needs {self.needed_bytes / 1e9:,.2f} GB of {self.available_bytes / 1e9:,.2f} GB"
        return "ran out"


@dataclass
class CompiledStep:
    """A compiled training step and what it holds per device."""

    trainer: Any
    compiled: Any
    text: str
    parameters: int  # whole model
    parameter_bytes: int  # per device
    optimizer_bytes: int
    gradient_bytes: int
    batch_bytes: int
    argument_bytes: int
    output_bytes: int
    alias_bytes: int
    temporary_bytes: int
    compile_seconds: float
    peak_bytes: int = 0  # the compiler's own peak (0: it reports none)
    code_bytes: int = 0
    platform: str = ""
    offloaded_bytes: int = 0  # of the state, kept in host memory (optimizer/offload)

    @property
    def summed_bytes(self) -> int:
        """Arguments, outputs not aliased to them, and temporaries, added up as if all lived at once."""
        return self.argument_bytes + self.output_bytes - self.alias_bytes + self.temporary_bytes

    @property
    def total_bytes(self) -> int:
        """Peak bytes per device. On a TPU: the compiler's own peak of its buffer assignment plus the
        program's code, which is what the chip runs: buffers whose lives do not overlap share memory, so the
        sum overcounts (by 0.8 GB for gpt2-124m's scanned step on a v5e, which ran at a peak of 16.82 GB
        under a 16.91 GB limit while the sum said 17.62). Elsewhere :attr:`summed_bytes` (XLA's CPU peak
        leaves out the temporaries; GPUs are not measured against it)."""
        if self.platform == "tpu" and self.peak_bytes:  # the peak counts an offloaded state in host memory too
            return self.peak_bytes - self.offloaded_bytes + self.code_bytes
        return self.summed_bytes

    def fits_in(self, limit: int) -> bool:
        """Whether the step fits ``limit`` bytes per device beside the next batch, which the training loop
        places on the device while the step runs."""
        return self.total_bytes + self.batch_bytes <= limit


def shard_bytes(leaf: Any, sharding: Any) -> int:
    """Bytes one device holds of one abstract array under ``sharding``."""
    import numpy as np

    return math.prod(sharding.shard_shape(leaf.shape)) * np.dtype(leaf.dtype).itemsize


def held_bytes(abstract: Any, shardings: Any, *, in_host_memory: bool = False) -> int:
    """Bytes one device holds of a tree of abstract arrays under their shardings: of the leaves in device
    memory, or with ``in_host_memory`` of those kept in host memory (``optimizer/offload``)."""
    import jax

    from theseus.training.optimizer_state import on_device

    return sum(
        shard_bytes(leaf, sharding)
        for leaf, sharding in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings), strict=True)
        if on_device(sharding) != in_host_memory
    )


def compile_train_step(trainer: Any) -> CompiledStep:
    """Lower and compile ``trainer``'s jitted train step (state donated) for its mesh's devices."""
    import time

    import jax

    from theseus.config import configuration
    from theseus.training.state import with_shardings

    state = with_shardings(trainer.abstract_state, trainer.state_shardings)
    batch = trainer.abstract_train_batch()
    key = jax.ShapeDtypeStruct(
        trainer.dropout_key.shape, trainer.dropout_key.dtype, sharding=trainer.sharding.replicated
    )
    started = time.perf_counter()
    with configuration(trainer.context.config):
        try:
            compiled = trainer.train_step_fn().trace(state, batch, key).lower().compile()
        except TheseusError:
            raise
        except Exception as exc:  # the compiler's refusal of this program, not a user mistake to hide
            from theseus.base.failures import out_of_memory

            if out_of_memory(exc):
                raise too_large(trainer, _first_line(exc)) from exc
            raise ConfigError(f"the training step does not compile for this target: {_first_line(exc)}") from exc
    seconds = time.perf_counter() - started
    memory = compiled.memory_analysis()
    params = trainer.abstract_state.params
    parameter_bytes = held_bytes(params, trainer.state_shardings.params)
    return CompiledStep(
        trainer=trainer,
        compiled=compiled,
        text=compiled.as_text(),
        parameters=sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params)),
        parameter_bytes=parameter_bytes,
        optimizer_bytes=held_bytes(trainer.abstract_state.opt_state, trainer.state_shardings.opt_state),
        gradient_bytes=parameter_bytes,
        batch_bytes=sum(held_bytes(leaf, leaf.sharding) for leaf in batch.values()),
        argument_bytes=int(memory.argument_size_in_bytes),
        output_bytes=int(memory.output_size_in_bytes),
        alias_bytes=int(memory.alias_size_in_bytes),
        temporary_bytes=int(memory.temp_size_in_bytes),
        compile_seconds=seconds,
        peak_bytes=int(getattr(memory, "peak_memory_in_bytes", 0) or 0),
        code_bytes=int(memory.generated_code_size_in_bytes or 0),
        platform=trainer.sharding.accelerator.platform,
        offloaded_bytes=held_bytes(
            trainer.abstract_state.opt_state, trainer.state_shardings.opt_state, in_host_memory=True
        ),
    )


def refused_sizes(refusal: str) -> tuple[int | None, int | None]:
    """(bytes needed, bytes available) as a compiler's out-of-memory ``refusal`` names them, in order
    (``Used 26.20G of 15.48G hbm``), or (None, None) when it names fewer than two."""
    sizes = [float(value) * _BINARY[unit] for value, unit in _COMPILER_SIZE.findall(refusal)]
    return (int(sizes[0]), int(sizes[1])) if len(sizes) >= 2 else (None, None)


def too_large(trainer: Any, refusal: str) -> StepTooLarge:
    """The error for a step the compiler refused for memory, with the sizes its ``refusal`` names."""
    return StepTooLarge(*refused_sizes(refusal), trainer)


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


__all__ = [
    "CompiledStep",
    "StepTooLarge",
    "compile_train_step",
    "held_bytes",
    "refused_sizes",
    "shard_bytes",
    "too_large",
]
