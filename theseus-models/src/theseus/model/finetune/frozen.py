"""A quantized frozen base (``model/quantize``) through the generic train step and optimizer.

Quantized kernels (``<name>_nf4`` / ``<name>_int8``, see :mod:`theseus.model.layers.quantization`)
hold integer codes, which cannot be differentiated. They stay in ``state.params`` (so sharding,
checkpoints and loading see one parameter tree), but the train step differentiates and updates the
rest: :data:`QUANTIZED` is what a trainer's ``HELD_OUT`` names, so every update, whatever its
objective, sees parameters without them and a model call that puts them back
(:func:`theseus.training.steps.holding_out`), and :func:`excluding_quantized` gives the optimizer the
same view, so the quantized base has no gradient, no optimizer state and comes out of every step bit
for bit as it went in.
"""

from __future__ import annotations

from typing import Any

import optax

from theseus.model.layers import quantization


def excluding_quantized(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """``tx`` over the parameters without their quantized kernels (it never sees the integer codes)."""
    strip = quantization.without_quantized

    def init(params: Any) -> Any:
        return tx.init(strip(params))

    def update(updates: Any, state: Any, params: Any = None) -> Any:
        return tx.update(strip(updates), state, None if params is None else strip(params))

    return optax.GradientTransformation(init, update)


class QuantizedBase:
    """The quantized kernels of a base, held out of every update (``HELD_OUT = QUANTIZED``)."""

    def split(self, params: Any) -> tuple[Any, Any]:
        """``(quantized kernels, the rest)`` of ``params``."""
        return quantization.split(params)

    def join(self, rest: Any, held: Any) -> Any:
        """The parameters again, from :meth:`split`'s two parts."""
        return quantization.join(rest, held)


#: What fine-tuning trainers hold out of the update: a quantized base's integer kernels.
QUANTIZED = QuantizedBase()


__all__ = ["QUANTIZED", "QuantizedBase", "excluding_quantized"]
