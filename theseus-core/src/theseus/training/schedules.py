"""Learning-rate schedules as factory containers: a config dataclass and a factory function.

A factory takes ``(config, peak_lr, total_steps)`` and returns an ``optax`` schedule
(``step -> learning rate``). Warmup and decay lengths are fractions of ``total_steps`` so a
schedule keeps its shape when the run length changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import optax

from theseus.config import configure, field
from theseus.errors import ConfigError

ScheduleFn = Callable[[Any], Any]


@dataclass(frozen=True)
class Schedule:
    """A learning-rate schedule: ``config`` (dataclass with ``field()`` keys) and ``factory``.

    ``factory(config_instance, peak_lr, total_steps)`` returns ``step -> lr``.
    """

    name: str
    config: type
    factory: Callable[[Any, float, int], ScheduleFn]

    def create(self, peak_lr: float, total_steps: int, config: Any | None = None) -> ScheduleFn:
        """Build the schedule from the active configuration (or ``config``)."""
        cfg = config if config is not None else configure(self.config)
        return self.factory(cfg, float(peak_lr), int(total_steps))


def _check_fraction(key: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{key} must be between 0 and 1, got {value}")


def _warmup_steps(fraction: float, total_steps: int) -> int:
    return round(fraction * total_steps)


def _warmup(step: Any, warmup: int, peak_lr: float) -> Any:
    """Linear warmup reaching ``peak_lr`` at step ``warmup`` (step 0 has lr peak/warmup)."""
    return peak_lr * jnp.minimum(1.0, (step + 1.0) / max(warmup, 1))


def _warmup_then(
    key: str, fraction: float, peak_lr: float, total_steps: int, after: Callable[[Any], Any]
) -> ScheduleFn:
    """Linear warmup over ``fraction`` (config key ``key``) of ``total_steps``, then ``after(progress)``
    with ``progress`` going from 0 at the warmup's end to 1 at ``total_steps``."""
    _check_fraction(key, fraction)
    warmup = _warmup_steps(fraction, total_steps)
    span = max(total_steps - warmup, 1)

    def schedule(step: Any) -> Any:
        step = jnp.asarray(step, jnp.float32)
        progress = jnp.clip((step - warmup) / span, 0.0, 1.0)
        return jnp.where(step < warmup, _warmup(step, warmup, peak_lr), after(progress))

    return schedule


# -- warmup, stable, decay ------------------------------------------------------------------


@dataclass
class WSDConfig:
    warmup_fraction: float = field(
        "schedule/wsd/warmup_fraction", default=0.05, help="fraction of steps spent warming up"
    )
    decay_fraction: float = field(
        "schedule/wsd/decay_fraction", default=0.2, help="fraction of steps of the final decay"
    )
    min_lr_ratio: float = field("schedule/wsd/min_lr_ratio", default=0.0, help="final lr as a fraction of training/lr")


def make_wsd(cfg: WSDConfig, peak_lr: float, total_steps: int) -> ScheduleFn:
    """Linear warmup, constant plateau, then linear decay to ``min_lr_ratio * peak_lr``."""
    _check_fraction("schedule/wsd/warmup_fraction", cfg.warmup_fraction)
    _check_fraction("schedule/wsd/decay_fraction", cfg.decay_fraction)
    if cfg.warmup_fraction + cfg.decay_fraction > 1.0:
        raise ConfigError("schedule/wsd: warmup_fraction + decay_fraction must not exceed 1")
    warmup = _warmup_steps(cfg.warmup_fraction, total_steps)
    decay = _warmup_steps(cfg.decay_fraction, total_steps)
    decay_start = total_steps - decay
    final = peak_lr * cfg.min_lr_ratio

    def schedule(step: Any) -> Any:
        step = jnp.asarray(step, jnp.float32)
        progress = jnp.clip((step - decay_start) / max(decay, 1), 0.0, 1.0)
        stable_or_decay = jnp.where(step < decay_start, peak_lr, peak_lr + (final - peak_lr) * progress)
        return jnp.where(step < warmup, _warmup(step, warmup, peak_lr), stable_or_decay)

    return schedule


WSD = Schedule("wsd", WSDConfig, make_wsd)


# -- cosine ---------------------------------------------------------------------------------


@dataclass
class CosineConfig:
    warmup_fraction: float = field(
        "schedule/cosine/warmup_fraction", default=0.05, help="fraction of steps spent warming up"
    )
    min_lr_ratio: float = field(
        "schedule/cosine/min_lr_ratio", default=0.1, help="final lr as a fraction of training/lr"
    )


def make_cosine(cfg: CosineConfig, peak_lr: float, total_steps: int) -> ScheduleFn:
    """Linear warmup, then cosine decay to ``min_lr_ratio * peak_lr`` at ``total_steps``."""
    final = peak_lr * cfg.min_lr_ratio

    def cosine(progress: Any) -> Any:
        return final + 0.5 * (peak_lr - final) * (1.0 + jnp.cos(jnp.pi * progress))

    return _warmup_then("schedule/cosine/warmup_fraction", cfg.warmup_fraction, peak_lr, total_steps, cosine)


Cosine = Schedule("cosine", CosineConfig, make_cosine)


# -- linear ---------------------------------------------------------------------------------


@dataclass
class LinearConfig:
    warmup_fraction: float = field(
        "schedule/linear/warmup_fraction", default=0.0, help="fraction of steps spent warming up"
    )
    final_lr_ratio: float = field(
        "schedule/linear/final_lr_ratio", default=0.0, help="lr at the last step as a fraction of training/lr"
    )


def make_linear(cfg: LinearConfig, peak_lr: float, total_steps: int) -> ScheduleFn:
    """Linear warmup, then a straight line from ``peak_lr`` to ``final_lr_ratio * peak_lr``."""
    final = peak_lr * cfg.final_lr_ratio

    def line(progress: Any) -> Any:
        return peak_lr + (final - peak_lr) * progress

    return _warmup_then("schedule/linear/warmup_fraction", cfg.warmup_fraction, peak_lr, total_steps, line)


Linear = Schedule("linear", LinearConfig, make_linear)


# -- constant -------------------------------------------------------------------------------


@dataclass
class ConstantConfig:
    warmup_fraction: float = field(
        "schedule/constant/warmup_fraction", default=0.0, help="fraction of steps spent warming up"
    )


def make_constant(cfg: ConstantConfig, peak_lr: float, total_steps: int) -> ScheduleFn:
    """``peak_lr`` throughout, after an optional linear warmup."""
    _check_fraction("schedule/constant/warmup_fraction", cfg.warmup_fraction)
    warmup = _warmup_steps(cfg.warmup_fraction, total_steps)
    if warmup == 0:
        return optax.constant_schedule(peak_lr)

    def schedule(step: Any) -> Any:
        return _warmup(jnp.asarray(step, jnp.float32), warmup, peak_lr)

    return schedule


Constant = Schedule("constant", ConstantConfig, make_constant)

__all__ = [
    "WSD",
    "Constant",
    "ConstantConfig",
    "Cosine",
    "CosineConfig",
    "Linear",
    "LinearConfig",
    "Schedule",
    "WSDConfig",
]
