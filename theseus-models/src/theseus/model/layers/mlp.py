"""``MLP``: the position-wise feed-forward layer (GELU or gated SwiGLU/GeGLU)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from theseus.base.axis import Axis, MeshAxis, ShardingPlan
from theseus.errors import ConfigError
from theseus.model.layers import lora, quantization
from theseus.model.layers._common import (
    ACTIVATIONS,
    GATED,
    INIT_STD,
    architecture_field,
    cast,
    check_activation,
    child,
    constrain,
    layer_width,
)
from theseus.model.layers.dense import Dense

if TYPE_CHECKING:  # the mixture's layer builds on the MLP
    from theseus.model.layers.moe import MoESpec


#: The ``layer_types`` entry of a layer that is a feed-forward branch alone (Nemotron-H's ``mlp`` layers).
MLP_LAYER = "mlp"


def hidden_size(n_embd: int, d_ff: int | None, mlp_ratio: float | None, multiple_of: int = 1) -> int:
    """``d_ff`` if given, else ``mlp_ratio * n_embd`` (default ratio 4) rounded up to ``multiple_of``."""
    if d_ff is not None:
        return d_ff
    ratio = 4.0 if mlp_ratio is None else mlp_ratio
    width = math.ceil(round(ratio * n_embd, 6))
    return multiple_of * math.ceil(width / multiple_of)


@dataclass(frozen=True)
class FeedForwardSpec:
    """The feed-forward branch of every layer: an MLP of hidden width ``d_ff`` and ``activation``, with
    biases when ``bias``; with ``moe``, the mixture of experts of the layers from ``moe.first_k_dense``
    on (the layers before it keep the MLP)."""

    d_ff: int
    activation: str = "gelu"
    bias: bool = True
    moe: MoESpec | None = None

    @property
    def gated(self) -> bool:
        return self.activation in GATED

    def validate(self, n_layers: int) -> FeedForwardSpec:
        if not isinstance(self.d_ff, int) or self.d_ff < 1:
            raise ConfigError(f"architecture/d_ff must be a positive integer, got {self.d_ff!r}")
        check_activation(self.activation)
        if self.moe is not None:
            self.moe.validate(n_layers)
        return self


class MLP(lora.LoRAKeys):
    """Feed-forward layer: ``down(act(up(x)))``, or ``down(act(gate(x)) * up(x))`` for gated activations.

    Config keys (``None`` = decided by the surrounding model, or the layer default):
    ``architecture/n_embd`` (input width; inferred from the input when ``None``),
    ``architecture/d_ff`` (hidden width; default ``mlp_ratio * n_embd``),
    ``architecture/mlp_ratio`` (default 4.0), ``architecture/activation``
    (gelu | gelu_exact | relu | relu2 (squared ReLU) | silu | swiglu | geglu; default gelu, the tanh
    approximation GPT-2 uses),
    ``architecture/dropout`` (on the output, training only), and the LoRA keys ``model/lora/*``
    (adapters on ``up`` / ``gate`` / ``down`` when named in ``model/lora/targets``), and
    ``model/quantize`` (the frozen kernels stored as nf4 / int8, with LoRA only).

    Parameters: ``up`` / ``gate`` kernels ``[embed, mlp]``, ``down`` kernel ``[mlp, embed]``,
    biases ``[mlp]`` / ``[embed]`` when ``use_bias``.
    """

    n_embd: int | None = architecture_field("n_embd")
    d_ff: int | None = architecture_field("d_ff")
    mlp_ratio: float | None = architecture_field("mlp_ratio")
    activation: str | None = architecture_field("activation")
    dropout: float = architecture_field("dropout")
    quantize: str = quantization.quantize_field()
    use_bias: bool = True
    multiple_of: int = 1
    init_std: float = INIT_STD
    out_std: float | None = None
    #: mup-style multipliers (Falcon-H1's): the gate's output before the activation, and the output.
    gate_multiplier: float = 1.0
    down_multiplier: float = 1.0

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan({Axis.EMBED: MeshAxis.DATA, Axis.MLP: MeshAxis.MODEL})

    @property
    def resolved_activation(self) -> str:
        return check_activation(self.activation or "gelu")

    @property
    def gated(self) -> bool:
        return self.resolved_activation in GATED

    def _width(self) -> int:
        def read(params: Any) -> Any:
            return nn.unbox(params["down"]["kernel"]).shape[-1] if "down" in params else None

        return layer_width(self, read)

    def matmul_params(self) -> int:
        """Number of weights used in matrix multiplications."""
        n_embd = self._width()
        width = hidden_size(n_embd, self.d_ff, self.mlp_ratio, self.multiple_of)
        return (3 if self.gated else 2) * n_embd * width

    def flops(self, seq: int) -> int:
        """Forward + backward matmul FLOPs for ``seq`` tokens: ``6 * seq * matmul_params``."""
        return 6 * seq * self.matmul_params()

    def _dense(
        self, name: str, x: jax.Array, features: int, axes: tuple[str, str], std: float, deterministic: bool
    ) -> jax.Array:
        adapted = self.lora_rank > 0 and name in lora.check_targets(self.lora_targets)
        dense = child(
            self,
            Dense,
            features=features,
            axes=axes,
            std=std,
            use_bias=self.use_bias,
            lora_rank=self.lora_rank if adapted else 0,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            quantize=quantization.check(self.quantize, self.lora_rank),
            name=name,
        )
        return dense(x, deterministic)

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool = False) -> jax.Array:
        n_embd = x.shape[-1]
        if self.n_embd is not None and self.n_embd != n_embd:
            raise ConfigError(f"MLP input width {n_embd} does not match architecture/n_embd={self.n_embd}")
        width = hidden_size(n_embd, self.d_ff, self.mlp_ratio, self.multiple_of)
        act = ACTIVATIONS[self.resolved_activation]
        x = cast(x, self._activation_dtype)
        up = self._dense("up", x, width, (Axis.EMBED, Axis.MLP), self.init_std, deterministic)
        if self.gated:
            gate = self._dense("gate", x, width, (Axis.EMBED, Axis.MLP), self.init_std, deterministic)
            if self.gate_multiplier != 1.0:
                gate = gate * jnp.asarray(self.gate_multiplier, gate.dtype)
            h = act(gate) * up
        else:
            h = act(up)
        h = constrain(h, (Axis.BATCH, Axis.SEQUENCE, Axis.MLP))
        out_std = self.init_std if self.out_std is None else self.out_std
        out = self._dense("down", h, n_embd, (Axis.MLP, Axis.EMBED), out_std, deterministic)
        if self.down_multiplier != 1.0:
            out = out * jnp.asarray(self.down_multiplier, out.dtype)
        if self.dropout > 0.0 and not deterministic:
            out = nn.Dropout(rate=self.dropout)(out, deterministic=False)
        return out
