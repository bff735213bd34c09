"""What the training loop and the pieces a trainer is built from use of a trainer.

``theseus.training.base.BaseTrainer`` implements :class:`Trainer`. The loop
(``theseus.training.loop``), ``training/init_from`` (``theseus.training.init_from``), ``model/remat=auto``
(``theseus.training.memory``) and activation capture (``theseus.training.capture``) are written against
this protocol, not against ``BaseTrainer``, so ``theseus.training.base`` imports them and none of them
imports it back.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

if TYPE_CHECKING:  # annotations only: this module imports neither jax nor the trainer
    import jax
    import numpy as np
    import optax

    from theseus.base.job import JobContext
    from theseus.training.sharding import TrainerSharding
    from theseus.training.state import TrainState

#: A batch as a step reads it: ``x``, ``y``, ``padding_mask`` and what else a trainer adds.
Batch = Mapping[str, Any]


class Trainer(Protocol):
    """A training job as the loop drives it: its settings, the pieces ``setup()`` builds, the state, data
    and compiled step it gives, and the hooks it may override (see ``BaseTrainer`` for each)."""

    PLOTTED: ClassVar[Sequence[str]]
    args: Any
    context: JobContext
    #: The update being run (the data position of ``train``).
    step: int
    #: The live train state (None before a run).
    state: TrainState | None
    model: Any
    sharding: TrainerSharding
    tx: optax.GradientTransformation | None
    flywheel: Any
    evaluations: list[Any]
    analyses: list[Any]
    abstract_state: Any
    state_shardings: Any
    init_key: Any
    sequence_length: int
    accumulate_steps: int

    @property
    def run_name(self) -> str: ...

    @property
    def tokens_per_step(self) -> int: ...

    def setup(self) -> None: ...

    def prepare_to_run(self) -> None: ...

    def reconfigure(self, values: Mapping[str, Any]) -> None: ...

    def fit_memory(self) -> Any: ...

    def init_state(self) -> TrainState: ...

    def load_base(self, source: Any, abstract: Any, shardings: Any) -> Any: ...

    def abstract_checkpoint_tree(self) -> dict[str, Any]: ...

    def state_from_checkpoint(self, tree: Mapping[str, Any]) -> TrainState: ...

    def callbacks(self) -> list[Any]: ...

    def tokenizer(self) -> Any: ...

    def host_batch(self, slice: str = "train", position: int | None = None) -> dict[str, np.ndarray]: ...

    def device_train_batch(self, host: Batch) -> dict[str, jax.Array]: ...

    def step_key(self, step: int) -> jax.Array: ...

    def train_step_fn(self) -> Any: ...

    def objective(self) -> Any: ...

    def compiled(self, name: str, build: Any) -> Any: ...

    def close(self) -> None: ...

    @classmethod
    def trace(cls, state: TrainState, batch: Batch, key: jax.Array, *, sharding: TrainerSharding) -> Any: ...


__all__ = ["Batch", "Trainer"]
