"""A GPT whose every layer ends with an extra, scaled feed-forward branch.

``ScaledGPT`` keeps GPT's embeddings, attention, presets and call contract and only swaps the layer
class (``BLOCK``). ``ScaledBlock`` adds two configurable children, declared in ``components()`` so
their keys (``architecture/scale`` and the MLP's) are part of every job that trains the model.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax

from theseus.base.axis import ShardingPlan
from theseus.config import configure
from theseus.model.models import GPT, Block
from theseus_plugins_example.modules import CountedFeedForward, ReplicatedFeedForward, Scale


class ExtraFeedForward(CountedFeedForward, ReplicatedFeedForward):
    """The extra branch: counts its FLOPs like ``CountedFeedForward`` and adds no mappings of its own
    to the model's sharding plan, like ``ReplicatedFeedForward``."""


class ScaledBlock(Block):
    """A GPT layer followed by ``x + scale(feed_forward(x))``.

    With ``architecture/scale=0`` the block computes exactly what GPT's ``Block`` computes.
    """

    FEED_FORWARD: ClassVar[type[Any]] = ExtraFeedForward

    @classmethod
    def components(cls) -> list[type]:
        return [*super().components(), Scale, cls.FEED_FORWARD]

    def setup(self) -> None:
        super().setup()
        self.extra = configure(self.FEED_FORWARD)
        self.scale = configure(Scale)

    def __call__(
        self,
        x: jax.Array,
        padding_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
        layer: int | jax.Array | None = None,
    ) -> jax.Array:
        x = super().__call__(x, padding_mask, positions, deterministic, decode, layer)
        return x + self.scale(self.extra(x, deterministic=deterministic))

    @property
    def sharding(self) -> ShardingPlan:
        return ShardingPlan.union(super().sharding, self.FEED_FORWARD().sharding)

    def flops(self, seq: int, layer: int | None = None) -> int:
        """The GPT layer's FLOPs plus the extra branch's. The model counts its layers before any
        parameter exists, when the branch's MLP (configured from the keys alone) does not know its
        input width yet: it is the layer's, so the branch is counted at that width."""
        if self.scope is None:
            return self.bind({}).flops(seq, layer)
        extra = self.extra.mlp.clone(parent=None, n_embd=self.arch.n_embd)
        return super().flops(seq, layer) + extra.flops(seq)


class ScaledGPT(GPT):
    """GPT with ``ScaledBlock`` layers (every GPT key and preset applies, plus ``architecture/scale``).
    Its ``flops(seq)`` is GPT's: the head plus each layer's count, which ``ScaledBlock`` extends."""

    BLOCK: ClassVar[type[Block]] = ScaledBlock
