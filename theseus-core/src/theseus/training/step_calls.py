"""How the trainer calls its ``train_step`` and ``val_step``: the objective is an argument, ``objective=``.

A trainer's step functions receive what they optimise explicitly (``objective=``, with ``sharding`` and the
training options), so a step jitted by hand runs the objective it is given, and one called without an
objective fails at once instead of training something else. An override keeps ``**kwargs`` and passes them
on to ``super()``::

    @classmethod
    def val_step(cls, state, batch, **kwargs):
        loss_sum, count, meta = super().val_step(state, batch, **kwargs)
        return loss_sum, count, {**meta, "valid_tokens": count}

An override written to the older signature, keyword-only ``sharding`` (and training options) with no
``objective`` and no ``**kwargs``, still runs for this minor release, with one warning: the trainer
lends its objective to the base's step for the duration of the call (:func:`lent_objective`). That
path goes in theseus-core 0.2.
"""

from __future__ import annotations

import contextvars
import inspect
import warnings
from collections.abc import Callable
from typing import Any

from theseus.base.scoped import bound
from theseus.training.objective import Objective

#: The release from which a step override must accept ``objective=`` (or ``**kwargs``).
REQUIRED_FROM = "theseus-core 0.2"

_lent: contextvars.ContextVar[Objective | None] = contextvars.ContextVar("theseus_lent_objective", default=None)
_warned: set[Callable[..., Any]] = set()


def takes_objective(method: Callable[..., Any]) -> bool:
    """Whether ``method`` accepts ``objective=`` (by name, or through ``**kwargs``)."""
    parameters = inspect.signature(method).parameters.values()
    return any(p.name == "objective" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def call_step(method: Callable[..., Any], *args: Any, objective: Objective, **options: Any) -> Any:
    """``method(*args, objective=objective, **options)``; an override without ``objective`` (the older
    signature) is called without it, after one warning, while the objective is lent to the base's step."""
    if takes_objective(method):
        return method(*args, objective=objective, **options)
    name = getattr(method, "__qualname__", repr(method))
    function = getattr(method, "__func__", method)  # one warning per override, whichever class calls it
    if function not in _warned:
        _warned.add(function)
        stem = name.rsplit(".", 1)[-1]
        warnings.warn(
            f"{name} takes no objective=: give it **kwargs and pass them to super().{stem}(...); "
            f"the signature without them stops working in {REQUIRED_FROM}",
            DeprecationWarning,
            stacklevel=2,
        )
    with bound(_lent, objective):
        return method(*args, **options)


class WithObjectiveArrays:
    """A jitted step function whose last argument is the objective's arrays (a teacher's parameters, its
    :meth:`~theseus.training.objective.Objective.arrays`): ``arrays()`` gives them with every call, so they
    are arguments of the compiled program, never constants in it; ``abstract()`` gives their shapes where
    the step is traced or lowered without running (``theseus plan``)."""

    def __init__(self, jitted: Any, arrays: Callable[[], Any], abstract: Callable[[], Any]) -> None:
        self.jitted, self.arrays, self.abstract = jitted, arrays, abstract

    def __call__(self, *args: Any) -> Any:
        return self.jitted(*args, self.arrays())

    def trace(self, *args: Any) -> Staged:
        return Staged(self.jitted.trace(*args, self.abstract()), self.arrays)

    def lower(self, *args: Any) -> Staged:
        return Staged(self.jitted.lower(*args, self.abstract()), self.arrays)


class Staged:
    """A traced, lowered or compiled stage of a :class:`WithObjectiveArrays` step: jax's own stage (its other
    attributes, ``memory_analysis()`` or ``as_text()``, pass through), whose next stage is wrapped alike and
    whose compiled program, called with the step's arguments, is given the objective's arrays too."""

    def __init__(self, stage: Any, arrays: Callable[[], Any]) -> None:
        self.stage, self.arrays = stage, arrays

    def lower(self, *args: Any, **kwargs: Any) -> Staged:
        return Staged(self.stage.lower(*args, **kwargs), self.arrays)

    def compile(self, *args: Any, **kwargs: Any) -> Staged:
        return Staged(self.stage.compile(*args, **kwargs), self.arrays)

    def __call__(self, *args: Any) -> Any:
        return self.stage(*args, self.arrays())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stage, name)


def lent_objective(step: str) -> Objective:
    """The objective the trainer lent to an override of the older signature (:func:`call_step`); a step
    called with no objective otherwise is a TypeError naming the argument."""
    objective = _lent.get()
    if objective is None:
        raise TypeError(
            f"{step}() needs objective=: the objective to optimise, e.g. objective=trainer.objective() "
            "(a trainer's own step functions, trainer.train_step_fn() and trainer.val_step_fn(), pass it)"
        )
    return objective


__all__ = ["REQUIRED_FROM", "Staged", "WithObjectiveArrays", "call_step", "lent_objective", "takes_objective"]
