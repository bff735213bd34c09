"""Each schedule's learning rates equal its closed form at chosen steps."""

from __future__ import annotations

import math

import pytest

from theseus.config import configuration, configure
from theseus.errors import ConfigError
from theseus.training.assembly import per_step
from theseus.training.schedules import (
    WSD,
    Constant,
    ConstantConfig,
    Cosine,
    CosineConfig,
    Linear,
    LinearConfig,
    WSDConfig,
)

PEAK, TOTAL = 0.01, 100


def values(schedule, config, steps):
    fn = schedule.create(PEAK, TOTAL, config)
    return [float(fn(s)) for s in steps]


def test_wsd_closed_form() -> None:
    cfg = WSDConfig(warmup_fraction=0.1, decay_fraction=0.2, min_lr_ratio=0.1)
    steps = [0, 4, 9, 10, 50, 79, 80, 90, 99, 100, 150]
    final = PEAK * 0.1

    def expected(s: int) -> float:
        if s < 10:
            return PEAK * (s + 1) / 10
        if s < 80:
            return PEAK
        return PEAK + (final - PEAK) * min((s - 80) / 20, 1.0)

    assert values(WSD, cfg, steps) == pytest.approx([expected(s) for s in steps], rel=1e-6)


def test_cosine_closed_form() -> None:
    cfg = CosineConfig(warmup_fraction=0.05, min_lr_ratio=0.1)
    steps = [0, 2, 4, 5, 20, 52, 99, 100, 120]
    final = PEAK * 0.1

    def expected(s: int) -> float:
        if s < 5:
            return PEAK * (s + 1) / 5
        progress = min((s - 5) / 95, 1.0)
        return final + 0.5 * (PEAK - final) * (1 + math.cos(math.pi * progress))

    assert values(Cosine, cfg, steps) == pytest.approx([expected(s) for s in steps], rel=1e-5)


def test_linear_closed_form() -> None:
    cfg = LinearConfig(warmup_fraction=0.2, final_lr_ratio=0.5)
    steps = [0, 10, 19, 20, 60, 100]

    def expected(s: int) -> float:
        if s < 20:
            return PEAK * (s + 1) / 20
        return PEAK + (0.5 * PEAK - PEAK) * min((s - 20) / 80, 1.0)

    assert values(Linear, cfg, steps) == pytest.approx([expected(s) for s in steps], rel=1e-6)


def test_constant_with_and_without_warmup() -> None:
    assert values(Constant, ConstantConfig(), [0, 50, 99]) == pytest.approx([PEAK] * 3)
    warm = ConstantConfig(warmup_fraction=0.1)
    assert values(Constant, warm, [0, 4, 9, 10, 99]) == pytest.approx([PEAK / 10, PEAK / 2, PEAK, PEAK, PEAK])


def test_several_updates_per_step_share_the_steps_learning_rate() -> None:
    """A trainer taking 3 optimizer updates per step (GRPO's rl/updates_per_rollout) gives updates 3k..3k+2
    the learning rate of step k, so the schedule still spans training/steps."""
    fn = Cosine.create(PEAK, TOTAL, CosineConfig(warmup_fraction=0.1))
    three = per_step(fn, 3)
    assert [float(three(u)) for u in (0, 1, 2, 3, 299)] == pytest.approx([float(fn(s)) for s in (0, 0, 0, 1, 99)])
    assert per_step(fn, 1) is fn


def test_schedules_read_their_keys_from_the_configuration() -> None:
    with configuration({"schedule/wsd/warmup_fraction": 0.5, "schedule/wsd/decay_fraction": 0.5}):
        cfg = configure(WSDConfig)
        fn = WSD.create(PEAK, TOTAL)
    assert (cfg.warmup_fraction, cfg.decay_fraction) == (0.5, 0.5)
    assert float(fn(49)) == pytest.approx(PEAK)
    assert float(fn(75)) == pytest.approx(PEAK * 0.5)


def test_bad_fractions_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="warmup_fraction"):
        WSD.create(PEAK, TOTAL, WSDConfig(warmup_fraction=1.5))
    with pytest.raises(ConfigError, match="must not exceed 1"):
        WSD.create(PEAK, TOTAL, WSDConfig(warmup_fraction=0.6, decay_fraction=0.6))
