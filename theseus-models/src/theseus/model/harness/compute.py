"""The two computations behind every lm-eval request, on the devices the parameters live on:
scoring a batch of rows and generating continuations of a batch of prompts.

``Devices`` runs them on one process's arrays (the default device) or on a mesh (``sharding``:
rows are split over its data axis, the parameters keep their layout). ``Compute`` is what the
request code asks; :mod:`.lockstep` puts several processes behind the same interface.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from theseus.model.generation.decode import generate_tokens
from theseus.model.generation.sampling import SamplingParams

if TYPE_CHECKING:
    from theseus.model.harness.scoring import ScoreFn
    from theseus.training.sharding import TrainerSharding


@dataclass(frozen=True)
class Generation:
    """One batch of prompts to continue: ``rows`` of token ids and how to continue them."""

    rows: list[list[int]]
    max_new_tokens: int
    sampling: SamplingParams
    seed: int
    eot_id: int | None
    width: int

    def record(self) -> dict[str, Any]:
        """Plain values (to send to other processes); :meth:`from_record` reads them back."""
        return {**asdict(self), "sampling": asdict(self.sampling)}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Generation:
        return cls(**{**record, "sampling": SamplingParams(**record["sampling"])})


class Compute(Protocol):
    """Scores rows (``ids``/``targets`` ``[B, W]``, targets -1 where nothing is scored: summed
    log-probability and all-greedy per row) and generates (the new tokens of each row)."""

    def score(self, ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def generate(self, request: Generation) -> list[list[int]]: ...


@dataclass
class Devices:
    """``model`` with ``params`` on this process's devices: one device, or the mesh of ``sharding``."""

    model: Any
    params: Any
    score_fn: ScoreFn
    sharding: TrainerSharding | None = None

    def score(self, ids: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.sharding is None:
            total, greedy = jax.device_get(self.score_fn(self.params, jnp.asarray(ids), jnp.asarray(targets)))
            return np.asarray(total), np.asarray(greedy)
        real, extra = len(ids), -len(ids) % self.sharding.data_size
        ids = np.concatenate([ids, np.zeros((extra, ids.shape[1]), ids.dtype)])
        targets = np.concatenate([targets, np.full((extra, targets.shape[1]), -1, targets.dtype)])
        placed = self.sharding.put_global({"ids": ids, "targets": targets})
        with self.sharding.context():
            found = self.score_fn(self.params, placed["ids"], placed["targets"])
        total, greedy = self.sharding.fetch(found)
        return np.asarray(total)[:real], np.asarray(greedy)[:real]

    def generate(self, request: Generation) -> list[list[int]]:
        done = generate_tokens(
            self.model,
            self.params,
            request.rows,
            request.max_new_tokens,
            sampling=request.sampling,
            seed=request.seed,
            eot_id=request.eot_id,
            width=request.width,
            sharding=self.sharding,
        )
        return [completion.tokens for completion in done]


__all__ = ["Compute", "Devices", "Generation"]
