"""Logical axis names and ``ShardingPlan``: how logical axes map onto mesh axes."""

from __future__ import annotations

import contextvars
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass

from theseus.base.scoped import bound

MeshAxes = str | tuple[str, ...] | None


class Axis:
    """Logical axis names that layers put on parameters and activations."""

    BATCH = "batch"
    SEQUENCE = "sequence"
    EMBED = "embed"
    MLP = "mlp"
    HEADS = "heads"
    KV_HEADS = "kv_heads"
    HEAD_DIM = "head_dim"
    VOCAB = "vocab"
    POSITION = "position"
    LAYERS = "layers"
    EXPERT = "expert"  # stacked experts of a mixture-of-experts layer
    NORM = "norm"


class MeshAxis:
    """Mesh axis names of the trainer's device mesh."""

    DATA = "data"
    EXPERT = "expert"  # experts of mixture layers; batches split over it too (expert parallelism)
    CONTEXT = "context"  # the sequence of each row (context parallelism)
    MODEL = "model"
    PIPELINE = "pipeline"  # consecutive layers of a scanned stack (pipeline parallelism)


#: How attention meets keys held by other devices of the ``context`` axis: gather them all, or pass
#: them round the ring one block at a time.
CONTEXT_ATTENTION = ("allgather", "ring")

_CONTEXT_ATTENTION: contextvars.ContextVar[str] = contextvars.ContextVar(
    "theseus_context_attention", default="allgather"
)


def context_attention() -> str:
    """The form of context-parallel attention the program being traced uses (:data:`CONTEXT_ATTENTION`)."""
    return _CONTEXT_ATTENTION.get()


def attending_with(form: str) -> AbstractContextManager[str]:
    """Trace the enclosed code with context-parallel attention of ``form``."""
    return bound(_CONTEXT_ATTENTION, form)


#: How the ``pipeline`` axis runs the layer stack.
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved")


@dataclass(frozen=True)
class Pipelining:
    """How a stack split over the ``pipeline`` axis runs: its ``schedule``, ``microbatches`` per micro
    batch (0: one per stage) and, for ``interleaved``, ``virtual`` stages per device."""

    schedule: str = "gpipe"
    microbatches: int = 0
    virtual: int = 2

    @property
    def pieces(self) -> int:
        """Pieces of the stack each stage holds (its virtual stages; 1 but for ``interleaved``)."""
        return self.virtual if self.schedule == "interleaved" else 1

    def microbatches_for(self, stages: int) -> int:
        """The micro-batches a step feeds through ``stages`` stages."""
        return self.microbatches or stages

    def bubble(self, stages: int) -> float:
        """The expected idle share of a step: ``(S - 1) / (M V + S - 1)`` (``V`` = :attr:`pieces`)."""
        if stages <= 1:
            return 0.0
        return (stages - 1) / (self.microbatches_for(stages) * self.pieces + stages - 1)


_PIPELINING: contextvars.ContextVar[Pipelining | None] = contextvars.ContextVar("theseus_pipelining", default=None)


def pipelining_of() -> Pipelining:
    """How the program being traced runs a stack split over the ``pipeline`` axis."""
    return _PIPELINING.get() or Pipelining()


def pipelining(plan: Pipelining) -> AbstractContextManager[Pipelining | None]:
    """Trace the enclosed code with stacks split over the ``pipeline`` axis run as ``plan`` says."""
    return bound(_PIPELINING, plan)


def _normalize(value: MeshAxes) -> MeshAxes:
    if isinstance(value, list):
        value = tuple(value)
    if isinstance(value, tuple) and len(value) == 1:
        return value[0]
    return value


class ShardingPlan(Mapping[str, MeshAxes]):
    """Maps logical axis names to mesh axis names (or None = replicated).

    The empty plan leaves every parameter replicated. Plans compose with ``|``; mapping
    one logical axis to two different mesh axes is an error naming the axis.
    """

    def __init__(
        self, rules: Mapping[str, MeshAxes] | Iterable[tuple[str, MeshAxes]] | None = None, **kwargs: MeshAxes
    ) -> None:
        items = dict(rules.items() if isinstance(rules, Mapping) else (rules or []))
        items.update(kwargs)
        self._rules: dict[str, MeshAxes] = {k: _normalize(v) for k, v in items.items()}

    def __getitem__(self, axis: str) -> MeshAxes:
        return self._rules[axis]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rules)

    def __len__(self) -> int:
        return len(self._rules)

    def __repr__(self) -> str:
        return f"ShardingPlan({self._rules!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardingPlan) and self._rules == other._rules

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._rules.items(), key=lambda kv: kv[0])))

    def __or__(self, other: ShardingPlan) -> ShardingPlan:
        return ShardingPlan.union(self, other)

    @staticmethod
    def union(*plans: ShardingPlan) -> ShardingPlan:
        """Merge plans; conflicting mappings of one logical axis raise ValueError."""
        merged: dict[str, MeshAxes] = {}
        for plan in plans:
            for axis, mesh in plan.items():
                if axis in merged and merged[axis] != mesh:
                    raise ValueError(f"sharding plans disagree on logical axis {axis!r}: {merged[axis]!r} vs {mesh!r}")
                merged[axis] = mesh
        return ShardingPlan(merged)

    def restricted(self, mesh_axes: Iterable[str]) -> ShardingPlan:
        """Keep only mappings onto ``mesh_axes`` (others become replicated)."""
        keep = set(mesh_axes)

        def filt(value: MeshAxes) -> MeshAxes:
            if value is None:
                return None
            names = (value,) if isinstance(value, str) else value
            kept = tuple(n for n in names if n in keep)
            return _normalize(kept) if kept else None

        return ShardingPlan({k: filt(v) for k, v in self._rules.items()})

    def rules(self) -> list[tuple[str, MeshAxes]]:
        """The plan as a rule list for ``flax.linen.logical_axis_rules``."""
        return list(self._rules.items())
