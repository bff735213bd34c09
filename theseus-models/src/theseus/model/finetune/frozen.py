"""A quantized frozen base (``model/quantize``) through the generic train step and optimizer.

Quantized kernels (``<name>_nf4`` / ``<name>_int8``, see :mod:`theseus.model.layers.quantization`)
hold integer codes, which cannot be differentiated. They stay in ``state.params`` (so sharding,
checkpoints and loading see one parameter tree), but the train step differentiates and updates the
rest: :func:`step` hands the step a state whose parameters lack them and whose model call puts them
back, and :func:`excluding_quantized` gives the optimizer the same view, so the quantized base has
no gradient, no optimizer state and comes out of every step bit for bit as it went in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import optax

from theseus.model.layers import quantization
from theseus.training.state import TrainState


def excluding_quantized(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` over the parameters without their quantized kernels (it never sees the integer codes)."""
    strip = quantization.without_quantized

    def init(params: Any) -> Any:
        return tx.init(strip(params))

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        return tx.update(strip(updates), state, None if params is None else strip(params))

    return optax.GradientTransformation(init, update)


def step(
    run: Callable[[TrainState], tuple[TrainState, Any, Any, Any]], state: TrainState
) -> tuple[TrainState, Any, Any, Any]:
    """``run(state)`` (a train step) with the quantized kernels of ``state.params`` held out of the
    differentiated parameters and given back to the model at each call."""
    if not quantization.has_quantized(state.params):
        return run(state)
    held, rest = quantization.split(state.params)
    apply = state.apply_fn

    def apply_fn(variables: Any, *args: Any, **kwargs: Any) -> Any:
        params = quantization.join(variables["params"], held)
        return apply({**variables, "params": params}, *args, **kwargs)

    new, loss, meta, grad_norm = run(state.replace(params=rest, apply_fn=apply_fn))
    return new.replace(params=quantization.join(new.params, held), apply_fn=apply), loss, meta, grad_norm


def objective_step(
    objective: Any,
    state: TrainState,
    batch: Any,
    key: Any,
    accumulate_steps: int,
    *,
    sharding: Any,
    skip_nonfinite: bool = False,
) -> tuple[TrainState, Any, Any, Any]:
    """``steps.train_step`` of ``objective`` (an object with ``forward`` and ``loss_weight``, as a trainer
    class has) through :func:`step`: the update of a fine-tuning trainer with its own loss."""
    from theseus.training import steps

    def run(inner: TrainState) -> tuple[TrainState, Any, Any, Any]:
        return steps.train_step(
            objective, inner, batch, key, accumulate_steps, sharding=sharding, skip_nonfinite=skip_nonfinite
        )

    return step(run, state)


__all__ = ["excluding_quantized", "objective_step", "step"]
