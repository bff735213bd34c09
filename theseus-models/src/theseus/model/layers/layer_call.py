"""``LayerCall``: what a layer of the stack is called with besides its input, and ``StackLayer``: the
one definition of that call, which a layer that takes it (a transformer block, its attention) inherits."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax

from theseus.model.module import Module


class LayerCall(NamedTuple):
    """What every layer of one forward pass is called with after its input, in this order: ``layer(x, *call)``,
    or ``layer(x, *call, index)`` for a layer told its index (its window, RoPE base and cache shape). A layer's
    ``__call__`` takes them as positional parameters of these names, then ``layer`` (:class:`StackLayer`:
    the block and the attention layers); ``nn.remat`` and ``nn.scan`` address them by position
    (:data:`~theseus.model.stack.block.STATIC_ARGNUMS`)."""

    padding_mask: jax.Array | None = None
    positions: jax.Array | None = None
    deterministic: bool = False
    decode: bool = False

    @classmethod
    def split(cls, args: Sequence[Any]) -> tuple[LayerCall, tuple[Any, ...]]:
        """A layer's positional arguments after its input: this call, and what follows it (an index)."""
        count = len(cls._fields)
        return cls(*args[:count]), tuple(args[count:])


class StackLayer(Module):
    """A layer called as the stack calls its layers: ``layer(x, *call)`` or ``layer(x, *call, index)``
    (the fields of :class:`LayerCall`, then the layer's index). ``__call__`` gathers them into a
    :class:`LayerCall`; a subclass computes its output in :meth:`forward` (``@nn.compact`` there when
    it builds its parameters inline)."""

    def __call__(
        self,
        x: Any,
        padding_mask: jax.Array | None = None,
        positions: jax.Array | None = None,
        deterministic: bool = False,
        decode: bool = False,
        layer: int | jax.Array | None = None,
    ) -> Any:
        return self.forward(x, LayerCall(padding_mask, positions, deterministic, decode), layer)

    def forward(self, x: jax.Array, call: LayerCall, layer: int | jax.Array | None) -> jax.Array:
        """The layer's output for input ``x`` under ``call``; ``layer``: its index, or None."""
        raise NotImplementedError(f"{type(self).__name__} computes no forward pass")


__all__ = ["LayerCall", "StackLayer"]
