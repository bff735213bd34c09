"""Field constraints (min/max/above/below/choices) and nested mappings in ``configuration()``."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from omegaconf import OmegaConf

from tests.conftest import run_cli
from theseus.config import Schema, configuration, configure, field, resolve
from theseus.errors import ConfigError
from theseus.model.module import Module


class Scale(Module):
    factor: float = field("architecture/scale", default=1.0)

    @classmethod
    def components(cls) -> list[type]:
        return []

    def __call__(self, x: float) -> float:
        return x * self.factor


@dataclass
class Bounded:
    rate: float = field("demo/rate", default=0.5, min=0.0, below=1.0)
    lr: float = field("demo/lr", default=1e-3, above=0.0)
    steps: int = field("demo/steps", default=3, min=1, max=10)
    act: str | None = field("demo/act", default=None, choices=("gelu", "relu"))


@pytest.mark.parametrize(
    "nested",
    [
        {"architecture": {"scale": 3.0}},
        OmegaConf.create({"architecture": {"scale": 3.0}}),
        OmegaConf.create({"architecture": {"scale": "${factor}"}, "factor": 3.0}),
        {"architecture/scale": 3.0},
    ],
    ids=["dict", "dictconfig", "interpolated", "flat"],
)
def test_nested_and_flat_configurations_configure_a_module_alike(nested: object) -> None:
    with configuration(nested):  # type: ignore[arg-type]
        assert configure(Scale).factor == 3.0


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ([("architecture/scale", 3.0)], "needs a mapping of configuration keys to values"),
        ({"architecture": {1: 3.0}}, "key 1 (int) under 'architecture' is not a configuration name"),
        ({"architecture": {"scale": 2.0}, "architecture/scale": 3.0}, "'architecture/scale' is given twice"),
        (OmegaConf.create({"architecture": {"scale": "${nowhere}"}}), "cannot read the OmegaConf configuration"),
    ],
)
def test_an_unreadable_mapping_is_one_clear_error(bad: object, message: str) -> None:
    with pytest.raises(ConfigError, match=r"^configuration\(\)") as caught, configuration(bad):  # type: ignore[arg-type]
        pass
    assert message in str(caught.value)


def test_every_violation_is_one_line() -> None:
    schema = Schema.build([Bounded])
    with pytest.raises(ConfigError) as caught:
        resolve(schema, {"demo/rate": 1.0}, {"demo/lr": 0, "demo/steps": 11, "demo/act": "tanh"})
    lines = str(caught.value).split("\nerror: ")
    assert lines == [
        "demo/act='tanh' is not accepted; use one of: gelu, relu",
        "demo/lr=0.0 is out of range; it must be > 0",
        "demo/rate=1.0 is out of range; it must be >= 0 and < 1",
        "demo/steps=11 is out of range; it must be >= 1 and <= 10",
    ]
    ok = resolve(schema, {}, {"demo/rate": 0.0, "demo/steps": 10, "demo/act": "relu"})
    assert ok["demo/rate"] == 0.0 and ok["demo/act"] == "relu" and ok["demo/lr"] == 1e-3


@dataclass
class Counts:
    seed: int = field("demo/seed", default=0)
    skip: int = field("demo/skip", default=0, min=0)
    window: int = field("demo/window", default=2, above=1.5, below=10.5)


def test_an_integer_beyond_64_bits_is_out_of_range_whether_or_not_the_key_is_bounded() -> None:
    """Every integer key holds what an int64 holds: one line naming the key and the integers it accepts
    (no OverflowError from comparing a 400-digit integer with a float bound)."""
    schema = Schema.build([Counts])
    with pytest.raises(ConfigError) as caught:
        resolve(schema, {"demo/seed": -(2**63) - 1}, {"demo/skip": 10**400, "demo/window": 2**63})
    assert str(caught.value).split("\nerror: ") == [
        "demo/seed=-9223372036854775809 is out of range; it must be an integer from -9223372036854775808 "
        "to 9223372036854775807",
        f"demo/skip={'1' + '0' * 56}... (401 characters) is out of range; it must be an integer from 0 "
        "to 9223372036854775807",
        "demo/window=9223372036854775808 is out of range; it must be an integer from 2 to 10",
    ]
    ok = resolve(schema, {}, {"demo/seed": -(2**63), "demo/skip": 2**63 - 1})
    assert (ok["demo/seed"], ok["demo/skip"]) == (-(2**63), 2**63 - 1)


def test_configure_checks_constraints_of_the_active_values() -> None:
    with configuration({"demo": {"lr": -1.0}}), pytest.raises(ConfigError, match=r"demo/lr=-1\.0 is out of range"):
        configure(Bounded)
    with (
        configuration({"demo": {"lr": float("nan")}}),
        pytest.raises(ConfigError, match=r"^demo/lr=nan is not a number; it must be a finite number > 0$"),
    ):
        configure(Bounded)
    # a bounded key is a finite number (training/lr=inf used to train)
    with configuration({"demo": {"lr": float("inf")}}), pytest.raises(ConfigError, match="a finite number > 0"):
        configure(Bounded)


def test_nonsense_builtin_values_are_refused_before_training(tmp_path: object) -> None:
    done = run_cli(
        [
            "run",
            "train/pretrain",
            "training/lr=-1",
            "training/steps=0",
            "architecture/dropout=1.0",
            "optimizer/adamw/eps=0",
            "architecture/activation=gelu2",
            "--root",
            str(tmp_path),
        ]
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        "error: architecture/activation='gelu2' is not accepted; use one of: "
        "gelu, gelu_exact, relu, relu2, silu, swiglu, geglu",
        "error: architecture/dropout=1.0 is out of range; it must be >= 0 and < 1",
        "error: optimizer/adamw/eps=0.0 is out of range; it must be > 0",
        "error: training/lr=-1.0 is out of range; it must be > 0",
        "error: training/steps=0 is out of range; it must be >= 1",
    ]
    assert not (tmp_path / "runs").exists()  # type: ignore[operator]
