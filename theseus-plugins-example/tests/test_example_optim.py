"""The NAdamW optimizer and the inverse-square-root schedule (factory containers)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from theseus.config import configuration
from theseus.errors import ConfigError
from theseus.registry import resolve_component
from theseus.training.optimizers import Optimizer
from theseus.training.schedules import Schedule
from theseus_plugins_example.optim import NAdamW, NAdamWConfig, RSqrt, RSqrtConfig


def test_registered_by_name() -> None:
    assert resolve_component("optimizer", "example-nadamw") is NAdamW
    assert resolve_component("schedule", "schedule/example-rsqrt") is RSqrt
    assert isinstance(NAdamW, Optimizer) and isinstance(RSqrt, Schedule)


def test_rsqrt_warms_up_decays_and_cools_down() -> None:
    lr = RSqrt.create(1.0, 100)  # defaults: 10 warmup steps, cooldown over the last 10
    values = {step: float(lr(step)) for step in (0, 4, 9, 10, 39, 89, 90, 95, 99)}
    assert values[0] == pytest.approx(0.1) and values[4] == pytest.approx(0.5) and values[9] == pytest.approx(1.0)
    assert values[10] == pytest.approx(math.sqrt(10 / 11)) and values[39] == pytest.approx(0.5)
    assert values[89] == pytest.approx(math.sqrt(10 / 90))
    assert values[95] == pytest.approx(math.sqrt(10 / 96) * 0.5)
    assert values[99] == pytest.approx(math.sqrt(10 / 100) * 0.1, rel=1e-5)
    assert float(lr(100)) == 0.0


def test_rsqrt_reads_its_keys_and_rejects_bad_fractions() -> None:
    with configuration({"schedule/example-rsqrt/warmup_fraction": 0.5, "schedule/example-rsqrt/cooldown_fraction": 0}):
        lr = RSqrt.create(2.0, 10)
    assert float(lr(4)) == pytest.approx(2.0) and float(lr(9)) == pytest.approx(2.0 * math.sqrt(5 / 10))
    with pytest.raises(ConfigError, match="must not exceed 1"):
        RSqrt.create(1.0, 10, config=RSqrtConfig(warmup_fraction=0.6, cooldown_fraction=0.6))
    with pytest.raises(ConfigError, match="between 0 and 1"):
        RSqrt.create(1.0, 10, config=RSqrtConfig(warmup_fraction=1.5))


def test_nadamw_decays_matrices_only() -> None:
    tx = NAdamW.create(0.1, config=NAdamWConfig(weight_decay=0.5))
    params = {"w": jnp.ones((2, 2)), "b": jnp.ones(2)}
    zeros = {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}
    updates, _ = tx.update(zeros, tx.init(params), params)
    np.testing.assert_allclose(np.asarray(updates["w"]), -0.1 * 0.5 * np.ones((2, 2)), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(updates["b"]), np.zeros(2))


def test_nadamw_rejects_bad_betas() -> None:
    with pytest.raises(ConfigError, match="beta1"):
        NAdamW.create(0.1, config=NAdamWConfig(beta1=1.0))
