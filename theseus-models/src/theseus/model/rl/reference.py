"""The frozen reference of full fine-tuning with a KL penalty (``rl/beta > 0`` without LoRA): a copy of
the policy's initial parameters (those of ``training/init_from``, else the run's seeded initialisation,
the same again on resume), placed like the policy's, whose log-probabilities of each rollout's targets
are computed once, before its updates, and travel with the batch (``ref_logps``). LoRA runs need no
copy: their reference is the policy with its adapters off."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

from theseus.training import packing, steps

#: The batch entry holding the reference's log-probabilities of the targets, ``[rows, T]``.
REF_LOGPS = "ref_logps"
MODEL_KEYS = ("x", "y", "padding_mask")


class TargetLogps:
    """A jitted function of a trainer's policy: the log-probability of each target of some rows under the
    parameters passed, without dropout or gradient (the reference's, or the sampler's of rollouts made
    ahead), on ``sharding``'s mesh (default: the trainer's)."""

    def __init__(self, trainer: Any, sharding: Any = None) -> None:
        self.sharding = sharding or trainer.sharding
        call = steps.ModelCall(trainer.model, trainer.model.apply)
        mesh = self.sharding

        def logps(params: Any, batch: Mapping[str, Any]) -> jax.Array:
            with mesh.context():
                found = steps.target_scores(call, params, packing.model_rows(batch), deterministic=True)[1]
                return jax.lax.stop_gradient(packing.unpack(found, batch))

        self._fn = jax.jit(logps)

    def __call__(self, params: Any, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """``params``' log-probability of each target of ``rows`` ``[rows, T]`` (every process passes all rows),
        scored on their packed rows where they carry them (:mod:`theseus.training.packing`)."""
        read = (*packing.PACKED_ROWS, packing.PACKED_INDEX) if packing.is_packed(rows) else MODEL_KEYS
        placed = self.sharding.put_global({k: rows[k] for k in read})
        return np.asarray(self.sharding.fetch(self._fn(params, placed)), np.float32)


class Reference:
    """The initial parameters of a trainer's policy and their target log-probabilities."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self._params: Any = None
        self._logps = TargetLogps(trainer)

    @property
    def params(self) -> Any:
        """The initial parameters, on the policy's shardings, read once."""
        if self._params is None:
            t = self.trainer
            if t.init_source is not None:
                self._params = t.load_base(t.init_source, t.abstract_state.params, t.state_shardings.params)
            else:
                self._params = t.init_state().params
        return self._params

    def logps(self, rows: Mapping[str, np.ndarray]) -> np.ndarray:
        """The reference's log-probability of each target of ``rows`` (every process passes all rows)."""
        return self._logps(self.params, rows)


__all__ = ["REF_LOGPS", "Reference", "TargetLogps"]
