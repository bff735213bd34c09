"""``Dense``: a projection whose kernel and bias carry logical axis names."""

from __future__ import annotations

import flax.linen as nn
import jax

from theseus.base.axis import Axis
from theseus.model.layers import lora, quantization
from theseus.model.layers._common import INIT_STD, cast, normal, param
from theseus.model.layers.matmul import project
from theseus.model.module import Module


class Dense(Module):
    """``x @ kernel (+ bias)`` computed in the activation dtype.

    ``kernel`` is ``[in, features]`` with logical axes ``axes``; ``bias`` is ``[features]`` with ``axes[1]``.
    No configuration keys: the enclosing layer decides the sizes, and whether the projection carries
    a LoRA adapter (``lora_rank > 0``: parameters ``lora_a`` / ``lora_b``, see
    :mod:`theseus.model.layers.lora`), and whether the kernel is stored quantized (``quantize``:
    ``nf4`` / ``int8``, the parameter ``kernel_<method>``; see :mod:`theseus.model.layers.quantization`).
    """

    features: int = 0
    axes: tuple[str, str] = (Axis.EMBED, Axis.MLP)
    std: float = INIT_STD
    use_bias: bool = True
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    quantize: str = "none"

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs need the input width; known only once bound."""
        kernel = nn.unbox(self.variables["params"]["kernel"])
        return 6 * seq * int(kernel.shape[0]) * int(kernel.shape[1])

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = True) -> jax.Array:
        dtype = self._activation_dtype
        shape = (x.shape[-1], self.features)
        kernel = quantization.kernel(self, "kernel", normal(self.std), shape, self.axes, self.quantize)
        y = project("...i,io->...o", x, kernel, dtype)
        if self.lora_rank > 0:
            axes = ((self.axes[0],), (self.axes[1],))
            y = y + lora.layer_adapter(
                self, self.name or "dense", x, (x.shape[-1],), (self.features,), axes, deterministic, prefix=""
            )
        if self.use_bias:
            bias = param(self, "bias", nn.initializers.zeros_init(), (self.features,), self.axes[1:])
            y = y + cast(bias, dtype)
        return y
