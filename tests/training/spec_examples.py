"""The examples of ``extend-a-trainer.md``, verbatim, built on a given ``MyTrainer``.

``examples(MyTrainer)`` returns the four example classes defined exactly as the guide writes
them (formatting included), so the same text can be checked on the guide's GPT + FineWeb
trainer and on a custom-batch trainer.
"""

# ruff: noqa: I001

from __future__ import annotations

from typing import Any


def examples(MyTrainer: Any) -> dict[str, type]:
    # fmt: off
    import jax.numpy as jnp

    class IgnoreFirstTarget(MyTrainer):
        def batch(self, slice="train"):
            batch = dict(super().batch(slice))
            batch["y"] = batch["y"].copy()
            batch["y"][..., 0] = -1
            return batch

    class LogitRMS(MyTrainer):
        @staticmethod
        def forward(state, params, batch, key=None, deterministic=False, intermediates=False):
            logits, loss, meta = MyTrainer.forward(
                state, params, batch, key=key,
                deterministic=deterministic, intermediates=intermediates,
            )
            rms = jnp.sqrt(jnp.mean(logits.astype(jnp.float32) ** 2))
            return logits, loss, {**meta, "logit_rms": rms}

    class StepMetrics(MyTrainer):
        @classmethod
        def train_step(cls, state, batch, key, accumulate_steps, **kwargs):
            state, loss, meta, grad_norm = super().train_step(
                state, batch, key, accumulate_steps, **kwargs,
            )
            return state, loss, {**meta, "grad_norm_squared": grad_norm ** 2}, grad_norm

        @classmethod
        def val_step(cls, state, batch, *, sharding):
            loss_sum, count, meta = super().val_step(state, batch, sharding=sharding)
            return loss_sum, count, {**meta, "valid_tokens": count}

    import jax
    import flax.linen as nn

    class DeterministicInspection(MyTrainer):
        @classmethod
        def trace(cls, state, batch, key, *, sharding):
            with (
                jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh),
                nn.logical_axis_rules(sharding.parameter_fwdbwd_mapping),
            ):
                return cls.forward(state, state.params, batch, key=key, deterministic=True)
    # fmt: on

    return {
        "IgnoreFirstTarget": IgnoreFirstTarget,
        "LogitRMS": LogitRMS,
        "StepMetrics": StepMetrics,
        "DeterministicInspection": DeterministicInspection,
    }
