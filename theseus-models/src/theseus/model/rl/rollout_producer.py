"""``RolloutProducer``: rollouts sampled ahead of the updates that learn from them (``rl/async_rollouts``).

A worker thread makes each step's rollouts while the trainer's thread runs the updates before it. The
rollouts of step ``s`` are made from a copy of the parameters of step ``s - rl/max_staleness`` (the
parameters the trainer held when it asked for step ``s - rl/max_staleness``'s batch), so which parameters
sample which step does not depend on timing and a run is as repeatable as a synchronous one. The first
``rl/max_staleness`` steps after the run starts (or resumes) are sampled by the parameters it starts with.

At staleness 0 each step's rollouts are made from the current parameters, after the update before it, as
without the producer. A copy is taken because the trainer donates its live parameters to the next update;
with staleness ``N`` up to ``N + 1`` copies are alive at once.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import jax
import jax.numpy as jnp

Made = TypeVar("Made")


@dataclass(frozen=True)
class Produced(Generic[Made]):
    """What the producer made for a step: ``made``, ``staleness`` (how many steps older than the step the
    parameters that sampled it are) and ``waited`` (seconds the trainer waited for it)."""

    made: Made
    staleness: int
    waited: float


def _copied(params: Any) -> Any:
    return jax.tree.map(jnp.copy, params)


class RolloutProducer(Generic[Made]):
    """Calls ``make(params, step)`` on a worker thread for the steps ahead, up to step ``last`` (the run's
    last; None: no end), each with ``copy`` (default: a copy on the same devices) of the parameters of the
    step ``staleness`` steps before it."""

    def __init__(
        self,
        make: Callable[[Any, int], Made],
        staleness: int,
        copy: Callable[[Any], Any] | None = None,
        last: int | None = None,
    ) -> None:
        if staleness < 0:
            raise ValueError(f"staleness must be >= 0, got {staleness}")
        self.make, self.staleness, self.last = make, staleness, last
        self.copy = copy or _copied
        self._pool: ThreadPoolExecutor | None = None
        self._pending: dict[int, tuple[Future[Made], int]] = {}

    def take(self, step: int, params: Any) -> Produced[Made]:
        """Step ``step``'s rollouts, waiting for them if they are not ready; ``params``: the parameters of
        ``step`` (those after the update before it). Steps up to ``step + staleness`` (never past ``last``)
        not yet asked for are handed to the worker with a copy of ``params``."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="theseus-rollouts")
        end = step + self.staleness if self.last is None else max(step, min(step + self.staleness, self.last))
        for ahead in range(step, end + 1):
            if ahead not in self._pending:
                copy = self.copy(params)  # the live parameters are donated to the next update
                context = contextvars.copy_context()  # the worker sees the configuration the trainer's thread sees
                self._pending[ahead] = (self._pool.submit(context.run, self.make, copy, ahead), step)
        future, sampled_at = self._pending.pop(step)
        began = time.perf_counter()
        made = future.result()
        return Produced(made, step - sampled_at, time.perf_counter() - began)

    def close(self) -> None:
        """Drop the rollouts not yet taken and end the worker, without waiting for a rollout it is making
        (a failed or stopped run is not held up by a generation whose result nobody takes)."""
        for future, _ in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


__all__ = ["Produced", "RolloutProducer"]
