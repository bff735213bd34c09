"""The example's jobs: ``ExampleTrainer`` and the four variations of the "Extend a Trainer" guide.

``ExampleTrainer`` declares everything a trainer can declare (model, data, optimizer, schedule,
evaluation, analysis) and trains ``ScaledGPT`` on the prepared, byte-level ``python-stdlib`` corpus.
Each variation overrides one method and is registered as its own job in ``pyproject.toml``:

=======================================  ===========================  ==============================
job                                      class                        overrides
=======================================  ===========================  ==============================
``example/gpt/train``                    ``ExampleTrainer``           (declarations only)
``example/gpt/ignore-first-target``      ``IgnoreFirstTarget``        ``batch``
``example/gpt/logit-rms``                ``LogitRMS``                 ``forward``
``example/gpt/step-metrics``             ``StepMetrics``              ``train_step`` / ``val_step``
``example/gpt/deterministic-inspection`` ``DeterministicInspection``  ``trace``
=======================================  ===========================  ==============================

Prepare the data once: ``theseus run data/tokenize data/dataset=python-stdlib``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.config import field
from theseus.data.datasets import PythonStdlib
from theseus.runs.directory import RunDirectory
from theseus.training.base import BaseTrainer, BaseTrainerConfig
from theseus.training.flywheel.strategy import Sampling
from theseus_plugins_example.analysis import PredictionEntropy
from theseus_plugins_example.evaluation import NextTokenAccuracy
from theseus_plugins_example.models import ScaledGPT
from theseus_plugins_example.optim import NAdamW, RSqrt


@dataclass
class ExampleConfig(BaseTrainerConfig):
    """The trainer keys with small defaults (a demo that runs in about a minute on a laptop CPU),
    plus one key of the example's own, read through ``self.args``."""

    steps: int = field("training/steps", default=200, help="optimizer steps of the whole run")
    batch_size: int = field("training/batch_size", default=8, help="global rows (sequences) per optimizer step")
    sequence_length: int = field(
        "training/sequence_length", default=64, help="tokens per row (0 = the model's architecture/block_size)"
    )
    lr: float = field("training/lr", default=3e-3, above=0.0, help="peak learning rate (the schedule scales it)")
    log_interval: int = field("training/log_interval", default=10, help="write training metrics every N steps")
    eval_interval: int = field(
        "training/eval_interval", default=50, help="validate every N steps and at the end (0 = only at the end)"
    )
    eval_batches: int = field("training/eval_batches", default=2, help="batches per validation (0 = no validation)")
    checkpoint_interval: int = field(
        "training/checkpoint_interval", default=100, help="checkpoint every N steps (0 = only the final checkpoint)"
    )
    keep_checkpoints: int = field(
        "training/keep_checkpoints", default=1, help="latest checkpoints kept, besides the best one (0 = keep all)"
    )
    summary: bool = field(
        "example/summary", default=True, help="print validation loss (bits per byte) and accuracy at the end"
    )


class ExampleTrainer(BaseTrainer):
    """``ScaledGPT`` on the byte-level Python standard library, with NAdamW, an inverse-square-root
    schedule, next-token accuracy and a prediction-entropy analysis.

    ``CSV_METRICS = True`` opts the trainer (and its subclasses) into the ``metrics/csv/*`` section
    and CSV sink of this distribution's hooks; ``EARLY_STOP = True`` into ``early_stop/*`` and the
    early-stop loop callback.
    """

    CONFIG = ExampleConfig
    MODEL = ScaledGPT
    DATASET = Sampling(PythonStdlib, 1.0, "pmd")
    OPTIMIZER = NAdamW
    SCHEDULE = RSqrt
    EVALUATION = [NextTokenAccuracy]
    ANALYSIS = [PredictionEntropy]
    CSV_METRICS: ClassVar[bool] = True
    EARLY_STOP: ClassVar[bool] = True

    def run(self) -> None:
        super().run()
        if self.args.summary and jax.process_index() == 0:
            print(self.summary())

    def summary(self) -> str:
        """One line: the last validation loss (nats and bits per byte) and next-token accuracy."""
        run = RunDirectory(self.context.root, self.run_name)
        last: dict[str, dict[str, Any]] = {}
        if run.metrics_file.is_file():
            for line in run.metrics_file.read_text(encoding="utf-8").splitlines():
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                last[record.get("split", "")] = record
        parts = [f"{self.run_name}: step {last.get('train', {}).get('step', 0)}/{self.args.steps}"]
        val = last.get("val", {})
        if isinstance(val.get("loss"), (int, float)):
            parts.append(f"val loss {val['loss']:.4f} ({val['loss'] / math.log(2):.3f} bits/byte)")
        accuracy = last.get("eval", {}).get("next_token/accuracy")
        if isinstance(accuracy, (int, float)):
            parts.append(f"next-token accuracy {accuracy:.1%}")
        parts.append(f"run dir {run.path}")
        return "; ".join(parts)


# -- the guide's variations, each registered as a job ---------------------------------------------


class IgnoreFirstTarget(ExampleTrainer):
    """Removes the first token of each sequence from the loss (and from every measurement)."""

    def batch(self, slice="train"):
        batch = dict(super().batch(slice))
        batch["y"] = batch["y"].copy()
        batch["y"][..., 0] = -1
        return batch


class LogitRMS(ExampleTrainer):
    """Adds ``logit_rms`` to the training and validation metrics."""

    @staticmethod
    def forward(state, params, batch, key=None, deterministic=False, intermediates=False):
        logits, loss, meta = ExampleTrainer.forward(
            state,
            params,
            batch,
            key=key,
            deterministic=deterministic,
            intermediates=intermediates,
        )
        rms = jnp.sqrt(jnp.mean(logits.astype(jnp.float32) ** 2))
        return logits, loss, {**meta, "logit_rms": rms}


class StepMetrics(ExampleTrainer):
    """Adds ``grad_norm_squared`` to training metrics and ``valid_tokens`` to validation metrics."""

    @classmethod
    def train_step(cls, state, batch, key, accumulate_steps, **kwargs):
        state, loss, meta, grad_norm = super().train_step(
            state,
            batch,
            key,
            accumulate_steps,
            **kwargs,
        )
        return state, loss, {**meta, "grad_norm_squared": grad_norm**2}, grad_norm

    @classmethod
    def val_step(cls, state, batch, **kwargs):
        loss_sum, count, meta = super().val_step(state, batch, **kwargs)
        return loss_sum, count, {**meta, "valid_tokens": count}


class DeterministicInspection(ExampleTrainer):
    """Runs the inspection trace (used by the entropy analysis) without dropout."""

    @classmethod
    def trace(cls, state, batch, key, *, sharding):
        with (
            jax.sharding.use_abstract_mesh(sharding.mesh.abstract_mesh),
            nn.logical_axis_rules(sharding.parameter_fwdbwd_mapping),
        ):
            return cls.forward(state, state.params, batch, key=key, deterministic=True)
