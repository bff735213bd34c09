"""``Module``: Flax Linen module with configuration discovery, dtypes, FLOPs and sharding."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flax.linen as nn
import jax.numpy as jnp

from theseus.base.accelerator import accelerator
from theseus.base.axis import ShardingPlan
from theseus.config import Configuration, configuration, current_configuration, field

if TYPE_CHECKING:
    from theseus.checkpoint.layers import StackEntry


def _with_own_configuration(setup: Callable[[Any], None]) -> Callable[[Any], None]:
    @functools.wraps(setup)
    def wrapped(self: Module) -> None:
        own = self.theseus_config
        if own is None or own is current_configuration():
            return setup(self)
        with configuration(own):
            return setup(self)

    wrapped.__theseus_wrapped__ = True  # type: ignore[attr-defined]
    return wrapped


class Module(nn.Module):
    """Base class of every configurable model component.

    ``field()`` attributes take their values from the configuration; ``components()``
    declares configurable child types (listing a type never instantiates it);
    ``gather()`` returns the class and every component type reachable from it.
    """

    param_dtype: str = field("model/param_dtype", default="float32", help="dtype of parameters")
    activation_dtype: str = field(
        "model/activation_dtype",
        default="auto",
        help="dtype of activations: auto (bfloat16 on GPUs and TPUs, float32 on CPUs), or a dtype such as float32",
    )
    #: The configuration this module was built under (set by ``configure``); children
    #: built in ``setup()`` are configured from it.
    theseus_config: Configuration | None = dataclasses.field(default=None, kw_only=True, repr=False, compare=False)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        setup = cls.__dict__.get("setup")
        if setup is not None and not getattr(setup, "__theseus_wrapped__", False):
            cls.setup = _with_own_configuration(setup)  # type: ignore[method-assign,assignment]
        super().__init_subclass__(**kwargs)

    @classmethod
    def components(cls) -> list[type[Any]]:
        """Configurable child types constructed by this module (``[]`` for a leaf)."""
        return []

    @classmethod
    def gather(cls) -> list[type[Any]]:
        """This class, its components depth first, and plugin contributions; deduplicated."""
        from theseus.plugins.gather import gather_classes

        return gather_classes(cls, lambda klass: klass.components() if hasattr(klass, "components") else [])

    @property
    def sharding(self) -> ShardingPlan:
        """How this module's logical axes map onto mesh axes (default: replicated)."""
        return ShardingPlan()

    def flops(self, seq: int) -> int:
        """Forward + backward FLOPs for one sequence of length ``seq`` (default 0)."""
        return 0

    @property
    def stacked_layers(self) -> tuple[StackEntry, ...]:
        """Variable entries that hold repeated layers stacked on a leading axis (a scanned layer
        stack; a :class:`~theseus.checkpoint.layers.LayerRun` for a stack held as several runs),
        ``()`` when every layer has entries of its own. Name-based code reads
        ``theseus.checkpoint.layers.per_layer(tree, module.stacked_layers)``."""
        return ()

    def read_params(self, read: Callable[[Any, Any, Any], Any], abstract: Any, shardings: Any) -> Any:
        """The parameters ``abstract`` names, placed on ``shardings``, from a checkpoint that
        ``read(module, abstract, shardings)`` reads as it is stored (float kernels). A module whose
        parameters are laid out otherwise (a quantized base) converts them here, as they are read."""
        return read(self, abstract, shardings)

    @property
    def _param_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def _activation_dtype(self) -> jnp.dtype:
        """``model/activation_dtype``; ``auto`` is chosen for the accelerator the program targets (the
        mesh's devices, :func:`theseus.base.accelerator.accelerator`)."""
        if self.activation_dtype == "auto":
            return jnp.dtype(jnp.bfloat16 if accelerator().half_precision else jnp.float32)
        return jnp.dtype(self.activation_dtype)
