"""What a trainer optimises: an objective, a small declared object the one train step runs.

An objective says what it reads (:class:`Needs`: one output of the model, batch entries, and
whether it compares with the frozen base, a teacher or the policy that sampled the batch),
turns what the step computed (:class:`Scores`) into a loss and metrics (``__call__``), and says
what a micro-batch weighs when accumulated gradients are averaged (``weight_of``). The step
(:func:`theseus.training.steps.train_step`) computes the scores, adds the model's auxiliary
losses (mixture-of-experts balancing) in training, accumulates micro-batches, keeps a LoRA or
quantized base frozen, and repeats ``updates`` updates on one batch, whatever the objective.

A trainer declares its objective with ``OBJECTIVE``, the one way to choose it; the trainer builds it
once (:meth:`Objective.for_trainer`: from the objective's own ``objective/<name>/`` keys, or from the
trainer's keys for an objective bound to its trainer, as ``train/dpo``, ``train/grpo`` and the
distillation jobs declare). A run may select another registered one (``objective=<name>``, components
``objective/<name>``) where the declared objective is :attr:`~Objective.selectable`. The trainer passes it to its
step functions as an argument, ``objective=`` (:mod:`theseus.training.step_calls`). Its settings are
plain attributes, compiled into the step; its arrays (a teacher's parameters: fields made with
:func:`array_field`) are arguments of the jitted step, given with every call, never constants of it.

This module imports no jax at import time: listing and ``theseus components`` stay light.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from theseus.errors import ConfigError

if TYPE_CHECKING:
    import jax

Batch = Mapping[str, Any]
Metrics = dict[str, Any]
#: What an objective reads from the model: its own loss (cross-entropy, chunked by
#: ``model/loss_chunk``), the full logits, the targets' log-probabilities (chunked as well), or one
#: scalar per row from the model's ``rewards`` method (a reward model's score of each sequence).
Reads = Literal["loss", "logits", "target_logps", "rewards"]
#: The prefix of the batch entries that carried a teacher's parameters into the step before objectives held
#: them (:func:`with_teacher`, deprecated): still taken out of a batch before it is split.
TEACHER_ENTRY = "teacher/"
#: The metadata of an objective's dataclass field that holds arrays (:func:`array_field`).
ARRAY = "theseus_array"


@dataclass(frozen=True)
class Needs:
    """What an objective reads; the step computes exactly this for it.

    ``model``: the model's own loss (``Scores.loss``, auxiliary losses included in training), the
    full logits (``Scores.logits``), the targets' log-probabilities (``Scores.logps``, with
    ``entropy`` the per-position entropy too), or the model's ``rewards(x, padding_mask,
    deterministic)``, one scalar per row (``Scores.rewards``). ``batch``: entries the objective reads besides
    ``x``, ``y`` and ``padding_mask`` (a batch without one is refused when the step is traced).
    ``frozen_base``: the targets' log-probabilities under the frozen base, the model with its LoRA
    adapters switched off (``Scores.base_logps``). ``teacher``: the teacher's model, whose logits
    (``Scores.teacher_logits``) come from the objective's ``teacher_params`` (an :func:`array_field`).
    ``old_policy``: the log-probabilities of the policy that sampled the batch (``Scores.old_logps``;
    computed once before ``updates`` > 1 updates, else the current ones without gradient).
    """

    model: Reads = "loss"
    entropy: bool = False
    batch: tuple[str, ...] = ()
    frozen_base: bool = False
    teacher: Any = None
    old_policy: bool = False

    def __post_init__(self) -> None:
        if self.old_policy and self.model != "target_logps":
            raise ConfigError(
                f"Needs(old_policy=True) compares target log-probabilities, but model={self.model!r}; "
                "declare Needs('target_logps', old_policy=True)"
            )


@dataclass(frozen=True)
class Scores:
    """What the step computed for an objective on one micro-batch (``None`` where it was not asked).

    ``logits`` ``[B, T, V]`` (dropped from the compiled program when nothing reads them), ``loss``
    the model's own loss, ``logps``/``entropy``/``base_logps``/``old_logps`` ``[B, T]`` float32
    (0 where a target is not scored), ``teacher_logits`` ``[B, T, V]`` without gradient, ``rewards``
    ``[B]`` float32.
    """

    logits: Any = None
    loss: Any = None
    logps: Any = None
    entropy: Any = None
    base_logps: Any = None
    old_logps: Any = None
    teacher_logits: Any = None
    rewards: Any = None


class Objective:
    """The base of objectives: override ``__call__`` (and ``needs``, ``weight_of`` where they differ).

    A plugin's objective is usually a dataclass whose ``field()`` keys sit under
    ``objective/<name>/``; it is built from the run's configuration when a trainer uses it.
    """

    #: Whether a run may select another registered objective in its place (``objective=<name>``) on a trainer
    #: that declares this one. An objective bound to its trainer (built from the trainer's keys and parts in
    #: :meth:`for_trainer`: a preference, policy or divergence loss) says False, and brings no keys of its own.
    selectable: ClassVar[bool] = True
    #: Optimizer updates taken on each batch (several: against ``Needs.old_policy``).
    updates: int = 1
    #: What :meth:`weight_of` counts, where validation reports it beside the targets (e.g. ``"pairs"``).
    weight_name: str | None = None
    #: The parameters of ``Needs.teacher``'s model (an objective that reads a teacher declares it with
    #: :func:`array_field`; the trainer sets it, see :meth:`with_arrays`).
    teacher_params: Any = None

    @classmethod
    def for_trainer(cls, trainer: Any) -> Objective:
        """This objective as ``trainer`` optimises it, built once per trainer under the run's configuration:
        by default from its own ``field()`` keys. An objective bound to its trainer (:attr:`selectable` False)
        overrides this to read the trainer's keys and parts (``trainer.args``, its teacher, its rollouts)."""
        from theseus.config import configure

        return configure(cls) if dataclasses.is_dataclass(cls) else cls()

    def arrays(self) -> dict[str, Any]:
        """The objective's arrays by field name: its :func:`array_field` fields (none by default). The
        trainer's jitted steps take them as an argument (:meth:`with_arrays` puts them back inside)."""
        if not dataclasses.is_dataclass(self):
            return {}
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.metadata.get(ARRAY)}

    def with_arrays(self, arrays: Mapping[str, Any]) -> Objective:
        """This objective holding ``arrays`` (field name -> arrays) in place of its own."""
        return dataclasses.replace(self, **arrays) if arrays else self  # type: ignore[type-var]

    @property
    def metric(self) -> str:
        """The name the objective's own loss is logged under beside the targets' cross-entropy (``loss``):
        the class name in snake case, ending in ``_loss`` (``LabelSmoothing`` logs ``label_smoothing_loss``,
        ``ZLossCrossEntropy`` ``z_loss_cross_entropy_loss``)."""
        import re

        name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", type(self).__name__).lower()
        return name if name.endswith("loss") else f"{name}_loss"

    @property
    def needs(self) -> Needs:
        """What the objective reads (by default, the model's own loss)."""
        return Needs()

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, Metrics]:
        """``(loss, metrics)`` of one micro-batch: a scalar to minimise and scalars to log."""
        raise NotImplementedError(f"{type(self).__qualname__} does not define __call__(scores, batch)")

    def weight_of(self, batch: Batch) -> jax.Array:
        """What a micro-batch weighs when accumulated gradients are averaged: its count of targets
        (the loss is a mean per target). A loss that is a mean over something else says so here."""
        return target_count(batch)


class CrossEntropy(Objective):
    """The mean cross-entropy of the targets that count (``y != -1``, not padding), as the model
    computes it: pretraining's loss, and supervised fine-tuning's (its masked targets are ``-1``)."""

    def __call__(self, scores: Scores, batch: Batch) -> tuple[jax.Array, Metrics]:
        return scores.loss, {}


def target_count(batch: Batch) -> jax.Array:
    """Number of positions that count towards the loss (``y != -1`` and not padding)."""
    import jax.numpy as jnp

    valid = batch["y"] != -1
    mask = batch.get("padding_mask")
    if mask is not None:
        valid = valid & mask.astype(bool)
    return jnp.sum(valid, dtype=jnp.int32)


def array_field(default: Any = None) -> Any:
    """A dataclass field of an objective that holds arrays (a teacher's parameters): left out of the
    objective's equality and hash, and given to the jitted step as an argument (:meth:`Objective.arrays`)."""
    return dataclasses.field(default=default, compare=False, repr=False, metadata={ARRAY: True})


# -- a teacher's parameters in a batch (deprecated) ------------------------------------------------
def with_teacher(batch: Batch, params: Any) -> dict[str, Any]:
    """``batch`` with one ``teacher/<path>`` entry per leaf of the teacher's parameters. Deprecated: an
    objective holds its teacher's parameters (``teacher_params``, an :func:`array_field`); this goes in
    theseus-core 0.2."""
    import warnings

    import jax

    warnings.warn(
        "with_teacher(batch, params) is deprecated: give the objective its teacher's parameters "
        "(teacher_params, an array_field); batches with teacher/ entries stop working in theseus-core 0.2",
        DeprecationWarning,
        stacklevel=2,
    )

    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    entries = {TEACHER_ENTRY + "/".join(str(k.key) for k in path): leaf for path, leaf in flat}
    return {**batch, **entries}


def split_teacher(batch: Batch) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(the teacher's parameter tree, the rest of the batch)``: the inverse of :func:`with_teacher`."""
    teacher: dict[str, Any] = {}
    rest: dict[str, Any] = {}
    for name, value in batch.items():
        if not name.startswith(TEACHER_ENTRY):
            rest[name] = value
            continue
        *parents, leaf = name[len(TEACHER_ENTRY) :].split("/")
        node = teacher
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return teacher, rest


__all__ = [
    "ARRAY",
    "TEACHER_ENTRY",
    "CrossEntropy",
    "Needs",
    "Objective",
    "Reads",
    "Scores",
    "array_field",
    "split_teacher",
    "target_count",
    "with_teacher",
]
