"""``SmolLM3``: Llama with no rotary embedding on some layers (NoPE): by default every fourth one.

The NoPE layers are :class:`SmolLM3Block` s whose :class:`SmolLM3Attention` leaves queries and keys
unrotated; which layers they are is the block's ``nope`` option (per layer, from
``architecture/no_rope_layers``), so a scanned model runs one period of the pattern per scan step.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import jax

from theseus.config import field
from theseus.model.layers._common import optional_key
from theseus.model.layers.attention import CausalSelfAttention
from theseus.model.layers.rotary import rope_layer_flags
from theseus.model.models.llama.model import Llama
from theseus.model.stack.architecture import Architecture, Preset
from theseus.model.stack.block import Block

SMOLLM3_PRESETS: dict[str, Preset] = {
    "tiny": Preset(
        n_layers=4,
        n_heads=4,
        n_kv_heads=2,
        n_embd=128,
        mlp_ratio=3.0,
        description="4 layers (NoPE at 3), 128 wide; tests and demos",
    ),
    # HuggingFaceTB/SmolLM3-3B's config.json: 36 layers (every 4th NoPE), 16 query and 4 key/value heads
    # of 128, 2048 wide, intermediate 11008, tied head; 3.075B parameters at vocab 128256 (transformers'
    # count on the meta device).
    "smollm3-3b": Preset(
        n_layers=36,
        n_heads=16,
        n_kv_heads=4,
        n_embd=2048,
        mlp_ratio=11008 / 2048,
        description="SmolLM3-3B's shape: 3.075B parameters at vocab 128256",
    ),
}


@dataclass(frozen=True)
class SmolLM3Architecture(Architecture):
    """An :class:`Architecture` with, per layer, whether it rotates its queries and keys (``rope_layers``:
    False for a NoPE layer)."""

    rope_layers: tuple[bool, ...] = ()


class SmolLM3Attention(CausalSelfAttention):
    """:class:`CausalSelfAttention` that rotates nothing when ``nope`` (a NoPE layer); otherwise Llama's RoPE."""

    nope: bool = False

    def _rotate(
        self, q: jax.Array, k: jax.Array, positions: jax.Array | None, layer: int | jax.Array | None
    ) -> tuple[jax.Array, jax.Array]:
        if self.nope:
            return q, k
        return super()._rotate(q, k, positions, layer)


class SmolLM3Block(Block):
    """:class:`Block` of :class:`SmolLM3Attention`, a NoPE layer when ``nope``."""

    ATTENTION: ClassVar[type[CausalSelfAttention]] = SmolLM3Attention

    nope: bool = False

    def attention_options(self) -> dict[str, Any]:
        return {"nope": self.nope}


class SmolLM3(Llama):
    """SmolLM3: :class:`Llama` (RMSNorm pre-norm blocks, grouped-query attention, SwiGLU) with a tied head
    by default and NoPE layers: a layer whose ``architecture/no_rope_layers`` entry is 0 applies no
    rotary embedding (None: every ``architecture/no_rope_layer_interval``-th layer, default 4, the last of
    each). The RoPE layers rotate as Llama's (``architecture/rope_theta``, ``rope_scaling``); the releases
    set ``architecture/rope_theta=5e6`` (``hf/import`` reads it from ``config.json``).

    ``architecture.rope_layers`` holds the pattern (a :class:`SmolLM3Architecture`); each layer is a
    :class:`SmolLM3Block` with the option ``nope``, so a scanned model runs one period of the pattern
    per scan step (its parameters still stacked per layer).

    Presets (``architecture/preset``): ``tiny`` (4 layers, NoPE at 3) and ``smollm3-3b`` (the published
    SmolLM3-3B shape: 3.075B parameters at ``architecture/vocab_size=128256``). ``hf/import`` of a
    ``model_type: smollm3`` checkpoint builds this model.
    """

    PRESETS: ClassVar[dict[str, Preset]] = SMOLLM3_PRESETS
    FAMILY: ClassVar[str] = "SmolLM3"
    TIED_EMBEDDINGS: ClassVar[bool] = True
    BLOCK = SmolLM3Block

    no_rope_layers: tuple[int, ...] | None = optional_key(
        "architecture/no_rope_layers",
        "per layer 1 (RoPE) or 0 (NoPE)",
        "the family's pattern; SmolLM3: no_rope_layer_interval",
    )
    no_rope_layer_interval: int = field(
        "architecture/no_rope_layer_interval",
        default=4,
        min=1,
        help="SmolLM3: every this many layers one is NoPE, the last of each (when no_rope_layers is None)",
    )

    def resolve_architecture(self) -> Architecture:
        arch = super().resolve_architecture()
        flags = rope_layer_flags(self.no_rope_layers, arch.n_layers, self.no_rope_layer_interval)
        values = {f.name: getattr(arch, f.name) for f in dataclasses.fields(arch)}
        return SmolLM3Architecture(**values, rope_layers=flags).validate()

    def _layer_options(self, layer: int) -> dict[str, Any]:
        arch = self.architecture
        rope = arch.rope_layers if isinstance(arch, SmolLM3Architecture) else ()
        return {"nope": not rope[layer]} if rope else {}

    def _run_kind(self, options: dict[str, Any]) -> str:
        """``nope_blocks`` / ``rope_blocks``: the stacks of a scanned model whose pattern does not repeat."""
        return "nope" if options.get("nope") else "rope"


__all__ = ["SMOLLM3_PRESETS", "SmolLM3", "SmolLM3Architecture", "SmolLM3Attention", "SmolLM3Block"]
