"""An optimizer and a learning-rate schedule as factory containers (a config type + a factory).

Neither is a subclass: ``Optimizer(name, config, factory)`` and ``Schedule(name, config, factory)``
wrap a dataclass of ``field()`` keys and a function. Registered in ``pyproject.toml`` as
``optimizer/example-nadamw`` and ``schedule/example-rsqrt``; a trainer declares them with
``OPTIMIZER = NAdamW`` / ``SCHEDULE = RSqrt`` or by those names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import optax

from theseus.config import field
from theseus.errors import ConfigError
from theseus.training.optimizers import LearningRate, Optimizer, decay_mask
from theseus.training.schedules import Schedule, ScheduleFn

# -- optimizer ------------------------------------------------------------------------------------


@dataclass
class NAdamWConfig:
    """Keys of the NAdamW optimizer."""

    beta1: float = field("optimizer/example-nadamw/beta1", default=0.9, help="first-moment decay")
    beta2: float = field("optimizer/example-nadamw/beta2", default=0.99, help="second-moment decay")
    eps: float = field("optimizer/example-nadamw/eps", default=1e-8)
    weight_decay: float = field(
        "optimizer/example-nadamw/weight_decay", default=0.05, help="decoupled weight decay of matrices"
    )


def make_nadamw(cfg: NAdamWConfig, learning_rate: LearningRate) -> optax.GradientTransformation:
    """AdamW with Nesterov momentum; biases and norm scales are not decayed."""
    if not 0.0 <= cfg.beta1 < 1.0 or not 0.0 <= cfg.beta2 < 1.0:
        raise ConfigError(
            f"optimizer/example-nadamw: beta1={cfg.beta1} and beta2={cfg.beta2} must lie in [0, 1); lower them"
        )
    return optax.nadamw(
        learning_rate, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay, mask=decay_mask
    )


NAdamW = Optimizer("example-nadamw", NAdamWConfig, make_nadamw)


# -- schedule -------------------------------------------------------------------------------------


@dataclass
class RSqrtConfig:
    """Keys of the inverse-square-root schedule."""

    warmup_fraction: float = field(
        "schedule/example-rsqrt/warmup_fraction", default=0.1, help="fraction of steps of linear warmup"
    )
    cooldown_fraction: float = field(
        "schedule/example-rsqrt/cooldown_fraction",
        default=0.1,
        help="fraction of steps at the end over which the lr falls linearly to 0",
    )


def make_rsqrt(cfg: RSqrtConfig, peak_lr: float, total_steps: int) -> ScheduleFn:
    """Linear warmup to ``peak_lr`` over ``W`` steps, then ``peak_lr * sqrt(W / (step + 1))``, and a
    linear cooldown to 0 at ``total_steps`` over the last ``cooldown_fraction`` of the run."""
    for key, value in (("warmup_fraction", cfg.warmup_fraction), ("cooldown_fraction", cfg.cooldown_fraction)):
        if not 0.0 <= value <= 1.0:
            raise ConfigError(f"schedule/example-rsqrt/{key} must be between 0 and 1, got {value}")
    if cfg.warmup_fraction + cfg.cooldown_fraction > 1.0:
        raise ConfigError("schedule/example-rsqrt: warmup_fraction + cooldown_fraction must not exceed 1")
    warmup = max(1, round(cfg.warmup_fraction * total_steps))
    cooldown = round(cfg.cooldown_fraction * total_steps)
    cooldown_start = total_steps - cooldown

    def schedule(step: Any) -> Any:
        step = jnp.asarray(step, jnp.float32)
        rise = peak_lr * jnp.minimum(1.0, (step + 1.0) / warmup)
        fall = peak_lr * jnp.sqrt(warmup / jnp.maximum(step + 1.0, warmup))
        lr = jnp.minimum(rise, fall)
        if cooldown == 0:
            return lr
        return lr * jnp.where(step >= cooldown_start, (total_steps - step) / cooldown, 1.0)

    return schedule


RSqrt = Schedule("example-rsqrt", RSqrtConfig, make_rsqrt)
