"""A language model with a scalar reward head: ``scored(GPT)`` is GPT with one more parameter.

The reward of a row is ``reward_head · h`` where ``h`` is the final-normed hidden state of the row's
last non-padding token (``padding_mask``), as ``AutoModelForSequenceClassification`` pools a
sequence; ``reward_head`` is ``[n_embd, 1]``, without bias, beside the model's own parameters (which
keep their names, so a run or a Hugging Face checkpoint of the base model loads into it). The class of
a run's provenance (``<Model>Reward`` in this module) is rebuilt from the registered model it extends.
"""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp

from theseus.base.axis import Axis
from theseus.model.layers._common import INIT_STD, normal, param
from theseus.model.stack.transformer import TransformerLM

#: The name of the scalar head among the model's parameters.
HEAD = "reward_head"
SUFFIX = "Reward"
_SCORED: dict[type, type] = {}


def last_positions(padding_mask: jax.Array | None, rows: int, steps: int) -> jax.Array:
    """The index of each row's last non-padding position ``[rows]`` (the last one without a mask; 0 for
    a row without any)."""
    if padding_mask is None:
        return jnp.full((rows,), steps - 1, jnp.int32)
    positions = jnp.where(padding_mask != 0, jnp.arange(steps, dtype=jnp.int32)[None, :], -1)
    return jnp.maximum(jnp.max(positions, axis=1), 0)


def pooled_rewards(normed: jax.Array, head: jax.Array, padding_mask: jax.Array | None) -> jax.Array:
    """``[B]`` float32: ``head`` ``[E, 1]`` applied to ``normed`` ``[B, T, E]`` at each row's last token."""
    rows, steps = normed.shape[:2]
    last = last_positions(padding_mask, rows, steps)
    picked = jnp.take_along_axis(normed, last[:, None, None], axis=1)[:, 0]
    return jnp.einsum("be,eo->bo", picked.astype(jnp.float32), head.astype(jnp.float32))[:, 0]


def scored(base: type) -> type:
    """``base`` (a ``TransformerLM``) with the scalar reward head and a ``rewards`` method."""
    if HEAD in getattr(base, "__dict__", {}) or getattr(base, "IS_REWARD_MODEL", False):
        return base
    if base in _SCORED:
        return _SCORED[base]
    if not (isinstance(base, type) and issubclass(base, TransformerLM)):
        from theseus.errors import ConfigError

        raise ConfigError(
            f"train/reward builds on a TransformerLM (GPT, Llama, ...); {getattr(base, '__name__', base)} is not one"
        )

    class Scored(base):  # type: ignore[valid-type, misc]
        IS_REWARD_MODEL = True

        def setup(self) -> None:
            super().setup()
            embed = self.architecture.n_embd
            self.reward_head = param(self, HEAD, normal(INIT_STD), (embed, 1), (Axis.EMBED, None))

        def rewards(self, x: jax.Array, padding_mask: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
            """One reward per row ``[B]`` (float32): the head on the last non-padding token's hidden state."""
            normed = self.final_norm(self.hidden(x, padding_mask, deterministic, False)[0])
            return pooled_rewards(normed, self.reward_head, padding_mask)

    name = f"{base.__name__}{SUFFIX}"
    Scored.__name__ = Scored.__qualname__ = name
    Scored.__module__ = __name__
    Scored.__doc__ = f"{base.__name__} with a scalar reward head (``rewards``), trained by ``train/reward``."
    _SCORED[base] = Scored
    return Scored


def __getattr__(name: str) -> Any:
    """``<Model>Reward``: the reward model of a registered model, as a run's provenance names it."""
    if name.endswith(SUFFIX) and not name.startswith("_"):
        for cls in list(_SCORED):
            if f"{cls.__name__}{SUFFIX}" == name:
                return _SCORED[cls]
        from theseus.registry import get_registry

        for entry in get_registry().components_of("model"):
            module, _, attribute = str(entry.target).partition(":")
            if attribute.rpartition(".")[2] + SUFFIX != name:
                continue
            found: Any = importlib.import_module(module)
            for part in attribute.split("."):
                found = getattr(found, part)
            return scored(found)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HEAD", "last_positions", "pooled_rewards", "scored"]
