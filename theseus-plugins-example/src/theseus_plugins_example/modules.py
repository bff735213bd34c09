"""The model components of the "Extend a Module" guide, as the guide writes them.

``Scale`` is a leaf with one configuration key; ``FeedForward`` builds a configurable child (the
theseus ``MLP``) and declares it in ``components()``; ``ReplicatedFeedForward`` supplies an explicit
(empty) sharding plan; ``CountedFeedForward`` reports its FLOPs by delegating to its child.
"""

from __future__ import annotations

from theseus.base.axis import ShardingPlan
from theseus.config import configure, field
from theseus.model.layers import MLP
from theseus.model.module import Module


class Scale(Module):
    """Multiplies its input by ``architecture/scale``."""

    factor: float = field("architecture/scale", default=1.0, help="factor applied by Scale modules")

    @classmethod
    def components(cls):
        return []  # No configurable child modules.

    def __call__(self, x):
        return x * self.factor


class FeedForward(Module):
    """A position-wise feed-forward layer: the theseus ``MLP``, configured from ``architecture/*``."""

    @classmethod
    def components(cls):
        return [MLP]

    def setup(self):
        self.mlp = configure(MLP)

    def __call__(self, x, deterministic=False):
        return self.mlp(x, deterministic=deterministic)


class ReplicatedFeedForward(FeedForward):
    """A ``FeedForward`` whose plan maps no logical axis: on its own, its parameters stay replicated."""

    @property
    def sharding(self):
        return ShardingPlan()


class CountedFeedForward(FeedForward):
    """A ``FeedForward`` that reports its child's FLOPs (the module must be bound)."""

    def flops(self, seq):
        return self.mlp.flops(seq)
