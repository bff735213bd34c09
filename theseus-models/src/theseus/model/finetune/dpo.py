"""``DPOTrainer``: preference tuning (DPO, IPO, SimPO) on pairs of responses, fully or with LoRA.

The policy starts from ``training/init_from`` (else the model's own initialisation) and the
reference is that same start, frozen. Where the reference log-probabilities come from:

* with ``dpo/precompute_reference=true`` they are computed once, before the first update, for every
  document of the data, and kept in the run folder (``reference/``; a resumed run reads them);
* with LoRA (``model/lora/rank`` > 0) they come from the policy with its adapters switched off, in
  the same compiled step: no second copy of the weights;
* otherwise a frozen copy of the starting parameters computes them beside each step;
* SimPO (``dpo/loss=simpo``) has no reference.

Chosen and rejected responses run in one forward pass: a batch holds pairs in consecutive rows
(the ``"pairs"`` style of ``dataset/preference``), so ``training/batch_size`` counts sequences, two
per pair. Exports, LoRA checkpoints, resume and every sharding layout work as in ``SFTTrainer``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, ClassVar

import click
import jax
import jax.numpy as jnp
import numpy as np

from theseus.config import field
from theseus.errors import ConfigError, DataError
from theseus.model.finetune.preference import LOSSES, Preference
from theseus.model.finetune.reference import (
    REFERENCE_DIR,
    compute_table,
    load_table,
    manifest,
    reference_fn,
    save_table,
)
from theseus.model.finetune.trainer import SFTConfig, SFTTrainer
from theseus.runs.layout import run_path
from theseus.training import adapters
from theseus.training.base import Batch
from theseus.training.flywheel.strategy import Sampling


@dataclass
class DPOConfig(SFTConfig):
    """The preference objective; the policy and the reference start from ``training/init_from``."""

    beta: float = field("dpo/beta", default=0.1, above=0.0, help="strength of the preference against the reference")
    loss: str = field("dpo/loss", default="sigmoid", choices=LOSSES, help="sigmoid (DPO) | ipo | simpo")
    label_smoothing: float = field(
        "dpo/label_smoothing",
        default=0.0,
        min=0.0,
        below=0.5,
        help="assumed share of flipped labels (conservative DPO)",
    )
    simpo_gamma: float = field("dpo/simpo_gamma", default=0.5, help="SimPO's target margin (gamma)")
    precompute_reference: bool = field(
        "dpo/precompute_reference",
        default=False,
        help="compute the reference log-probabilities once, before training, and keep them in the run folder",
    )


class DPOTrainer(SFTTrainer):
    """Preference tuning on ``dataset/preference`` (pairs), from ``training/init_from``, optionally with LoRA.

    Subclass it to change the model or the data, as with ``SFTTrainer``.
    """

    CONFIG: ClassVar[type] = DPOConfig
    DATASET: ClassVar[Any] = Sampling("preference", 1.0, "pairs")
    OBJECTIVE: ClassVar[Any] = Preference  # built from dpo/* (Preference.for_trainer)

    def __init__(self, context: Any) -> None:
        super().__init__(context)
        self._reference_params: Any = None
        self._table: dict[str, np.ndarray] | None = None

    # -- the objective -------------------------------------------------------------------------
    @property
    def reference_source(self) -> str:
        """Where the objective's reference comes from (``Preference.reference``): the batch, the base
        with its adapters off, or nowhere."""
        objective = self.objective()
        assert isinstance(objective, Preference)
        return objective.reference

    def setup(self) -> None:
        if self._ready:
            return
        super().setup()
        check_pairs(self)

    # -- the reference -------------------------------------------------------------------------
    def reference_params(self) -> Any:
        """The frozen starting point: ``training/init_from`` (or the seeded initialisation), adapters off."""
        return adapters.switched_off(self.init_state().params)

    def _ensure_reference(self) -> None:
        """Build what the reference needs once: the stored table or the frozen parameters."""
        self.setup()
        if self.reference_source != "batch" or self._table is not None or self._reference_params is not None:
            return
        if self.args.precompute_reference:
            self._table = self._precomputed()
        else:
            self._reference_params = self.reference_params()

    def _precomputed(self) -> dict[str, np.ndarray]:
        source = self._open_flywheel().sources[0]
        splits = tuple(source.prepared.splits)
        folder = run_path(self.context.root, self.run_name) / REFERENCE_DIR
        description = manifest(source, splits, str(self.args.init_from))
        table = load_table(folder, description)
        if table is not None:
            return table
        begun = time.perf_counter()
        documents = sum(description["documents"].values())
        click.echo(f"reference: log-probabilities of {documents // 2} pairs ({', '.join(splits)})", err=True)
        fn = self.compiled("reference", lambda: reference_fn(self.model, self.sharding, leading=False))
        params = self.reference_params()
        table = {split: compute_table(fn, params, source, split, self.eval_rows, self.sharding) for split in splits}
        del params
        if jax.process_index() == 0:
            save_table(folder, table, description)
        click.echo(f"reference: kept in {folder} ({time.perf_counter() - begun:.1f} s)", err=True)
        return table

    def host_batch(self, slice: str = "train", position: int | None = None) -> dict[str, np.ndarray]:
        batch = super().host_batch(slice, position)
        if self.args.precompute_reference and self.reference_source == "batch":
            self._ensure_reference()
            assert self._table is not None
            batch["reference_logps"] = self._table[slice][batch["document"]]
        return batch

    def _with_reference(self, batch: dict[str, jax.Array], *, leading: bool) -> dict[str, jax.Array]:
        if self.reference_source != "batch" or "reference_logps" in batch:
            return batch
        self._ensure_reference()
        name = "reference_train" if leading else "reference_val"
        fn = self.compiled(name, lambda: reference_fn(self.model, self.sharding, leading=leading))
        return {**batch, "reference_logps": fn(self._reference_params, batch)}

    def device_train_batch(self, host: Batch) -> dict[str, jax.Array]:
        return self._with_reference(super().device_train_batch(host), leading=True)

    def abstract_train_batch(self) -> dict[str, jax.ShapeDtypeStruct]:
        batch = super().abstract_train_batch()
        if self.reference_source == "batch":
            rows = (self.accumulate_steps, self.micro_rows)
            sharding = self.sharding.batch_sharding(len(rows), leading=1)
            batch["reference_logps"] = jax.ShapeDtypeStruct(rows, jnp.float32, sharding=sharding)
        return batch

    def device_eval_batch(self, host: Batch) -> dict[str, jax.Array]:
        return self._with_reference(super().device_eval_batch(host), leading=False)

    def close(self) -> None:
        """Release the data loader and the reference (built again when next needed)."""
        super().close()
        self._reference_params = None


def check_pairs(trainer: Any) -> None:
    """Refuse data not read as pairs and micro batches that split a pair; say how many responses the row
    length cuts (their tail is then not compared). For any trainer on ``dataset/preference`` pairs."""
    flywheel = trainer.flywheel
    if flywheel is not None and not flywheel.paired:
        raise DataError(
            f"{type(trainer).__qualname__} trains on preference pairs; read them in the 'pairs' style "
            "(dataset=preference:1:pairs after data/tokenize data/dataset=preference)"
        )
    if flywheel is not None:
        source = flywheel.sources[0]
        index = source.view("train").index
        cut = int(np.count_nonzero(index[:, 1] > source.block_size + 1))
        if cut and jax.process_index() == 0:
            click.echo(
                f"note: {cut} of {index.shape[0]} training responses are longer than training/sequence_length="
                f"{source.block_size} and are cut; raise it (and architecture/block_size) to compare them whole",
                err=True,
            )
    if trainer.micro_rows % 2:
        raise ConfigError(
            f"a micro batch of {trainer.micro_rows} rows splits a preference pair (2 rows: chosen, rejected); "
            "make training/batch_size and training/micro_batch_size even"
        )


__all__ = ["DPOConfig", "DPOTrainer", "check_pairs"]
