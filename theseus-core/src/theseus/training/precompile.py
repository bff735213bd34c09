"""Compile the training step on a worker thread while the train state is being created.

A fresh run's start-up is two compilations in a row: the parameter initialiser, then the training
step. The step needs only the state's shapes and shardings (known after ``setup()``), so it can be
traced and compiled for them while the initialiser compiles and runs; XLA compiles without the
interpreter lock, so on a machine with two or more cores the two overlap. The first update then
finds the step compiled (jax keeps it in memory, and in the persistent cache when that is on).
A failure here is ignored: the first update compiles again and reports it where it belongs.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import TYPE_CHECKING, Any

import jax

from theseus.training.state import with_shardings

if TYPE_CHECKING:
    from theseus.training.base import BaseTrainer


class StepPrecompile:
    """Starts compiling ``trainer``'s training step for update ``start``; ``wait()`` joins it."""

    def __init__(self, trainer: BaseTrainer, start: int) -> None:
        batch = trainer.device_train_batch(trainer.host_batch("train", position=start))
        key = trainer.step_key(start)
        state = with_shardings(trainer.abstract_state, trainer.state_shardings)
        step_fn = trainer.train_step_fn()
        context = contextvars.copy_context()  # the job's configuration is a context variable
        self._thread = threading.Thread(
            target=context.run, args=(self._compile, step_fn, state, batch, key), name="theseus-step-compile"
        )
        self._thread.start()

    @staticmethod
    def enabled() -> bool:
        """Only in a single-process run (processes that compile in different orders could wait on each other)."""
        return jax.process_count() == 1

    @staticmethod
    def _compile(step_fn: Any, state: Any, batch: Any, key: Any) -> None:
        with contextlib.suppress(Exception):
            step_fn.lower(state, batch, key).compile()

    def wait(self) -> None:
        self._thread.join()
