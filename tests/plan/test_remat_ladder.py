"""``theseus plan`` with ``model/remat=auto`` plans what a run on the target would choose: the first pass of
the ladder (``none`` and ``dots`` at the configured micro batch, ``dots`` at half of it, ``full``), in a run's
order, the first whose step fits the chip. The compiles
are stood in for by steps of given sizes (tests/plan's matrices compile the real ones)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from theseus.config.configuration import Configuration
from theseus.plan import report
from theseus.plan.build import StepTooLarge
from theseus.plan.targets import parse_target
from theseus.training import compiled

GB = 10**9
V5E = parse_target("v5e:1")  # 16.91 GB a program may use


@dataclass
class Step:
    total_bytes: int
    batch_bytes: int = 0

    def fits_in(self, limit: int) -> bool:
        return self.total_bytes + self.batch_bytes <= limit


@dataclass
class Trainer:
    """What the ladder reads and sets of a trainer: its configuration, batch and micro batch."""

    config: dict[str, Any]
    batch_size: int = 8
    compiled: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.context = type("Context", (), {"config": Configuration(self.config)})()
        self.args = type("Args", (), {"batch_size": self.batch_size, "micro_batch_size": 0})()
        self.sequence_length = 512
        self.sharding = type("Sharding", (), {"data_size": 1, "feed_count": 1, "pipeline_size": 1})()

    def reconfigure(self, values: dict[str, Any]) -> None:
        self.context.config = self.context.config.with_values(values)


def ladder(monkeypatch: pytest.MonkeyPatch, sizes: dict[str, int | None]) -> Trainer:
    """A trainer whose step under each policy takes ``sizes[policy]`` bytes at 8 rows a pass and
    ``sizes[policy/4]`` at 4 (half of ``sizes[policy]`` where not given; None: the compiler refuses)."""
    trainer = Trainer({"model/remat": "auto", "training/batch_size": 8})

    def compile_train_step(t: Trainer) -> Step:
        policy = t.context.config["model/remat"]
        rows = t.context.config.get("training/micro_batch_size") or t.batch_size
        name = policy if rows == t.batch_size else f"{policy}/{rows}"
        t.compiled.append(name)
        size = sizes.get(name, None if sizes[policy] is None else int(sizes[policy] or 0) // 2)
        if size is None:
            raise StepTooLarge(int(20 * GB), V5E.chip.memory_bytes, t)
        return Step(int(size))

    monkeypatch.setattr(report, "compile_train_step", compile_train_step)  # a named policy
    monkeypatch.setattr(compiled, "compile_train_step", compile_train_step)  # the ladder's (training.memory)
    return trainer


def test_auto_plans_the_first_policy_that_fits_the_chip(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = ladder(monkeypatch, {"none": None, "dots": 36 * GB, "full": 9 * GB})
    step, line = report.compiled_as_run(trainer, V5E)
    assert trainer.compiled == ["none", "dots", "dots/4", "full"] and step.total_bytes == 9 * GB
    assert line == (
        "model/remat=auto: chose remat=full, micro_batch_size=8: peak 9 GB of 16.9 GB (what a program may use on "
        "one TPU v5 lite); none at 8 rows needs 20 GB; dots at 8 rows needs 36 GB; dots at 4 rows needs 18 GB"
    )
    assert report.compiled_remat(report_plan(step, trainer)) == ["model/remat=full"]


def test_two_micro_batches_with_dots_come_before_full_remat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 350M Llama shape on a v5e: ``dots`` at 8 x 2048 needs 17.4 GB, at 4 rows a pass it fits, and
    ran 1.28x faster than ``full`` at 8 rows."""
    trainer = ladder(monkeypatch, {"none": 36 * GB, "dots": 17 * GB, "dots/4": 13 * GB, "full": 8 * GB})
    step, line = report.compiled_as_run(trainer, V5E)
    assert trainer.compiled == ["none", "dots", "dots/4"] and step.total_bytes == 13 * GB
    assert line.startswith("model/remat=auto: chose remat=dots, micro_batch_size=4: peak 13 GB")


def test_auto_stops_at_the_fastest_policy_that_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = ladder(monkeypatch, {"none": 12 * GB, "dots": 8 * GB, "full": 6 * GB})
    step, line = report.compiled_as_run(trainer, V5E)
    assert trainer.compiled == ["none"] and step.total_bytes == 12 * GB
    assert line.startswith("model/remat=auto: chose remat=none, micro_batch_size=8: peak 12 GB")


def test_nothing_fitting_plans_full_and_says_what_a_run_does_next(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = ladder(monkeypatch, {"none": 40 * GB, "dots": 40 * GB, "full": 20 * GB})
    step, line = report.compiled_as_run(trainer, V5E)
    assert step.total_bytes == 20 * GB
    assert line == (
        "model/remat=auto: nothing fits 16.9 GB (what a program may use on one TPU v5 lite) at 8 rows a pass "
        "(none at 8 rows needs 40 GB; dots at 8 rows needs 40 GB; dots at 4 rows needs 20 GB; full at 8 rows "
        "needs 20 GB); planned as "
        "remat=full, and a run would go on to halve training/micro_batch_size (plan that by naming it)"
    )


def test_the_refusal_of_full_is_the_plans_and_names_no_policy_left(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = ladder(monkeypatch, {"none": None, "dots": None, "full": None})
    with pytest.raises(StepTooLarge) as refused:
        report.compiled_as_run(trainer, V5E)
    assert trainer.compiled == ["none", "dots", "dots/4", "full"]
    assert "model/remat=full" not in str(refused.value) and "training/batch_size=4" in str(refused.value)
    assert report.compiled_remat(refused.value) == ["model/remat=full"]


def test_a_named_policy_compiles_once(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer = ladder(monkeypatch, {"none": None, "dots": 30 * GB, "full": 9 * GB})
    trainer.reconfigure({"model/remat": "dots"})
    step, line = report.compiled_as_run(trainer, V5E)
    assert (trainer.compiled, line, step.total_bytes) == (["dots"], "", 30 * GB)


def report_plan(step: Step, trainer: Trainer) -> report.Plan:
    step.trainer = trainer  # type: ignore[attr-defined]
    return report.Plan("train/pretrain", V5E, step, None, None, 0.0, 8, 512)  # type: ignore[arg-type]
