"""Loop callbacks: when each event comes and what it sees, stopping from a callback (and resuming
from there exactly), callbacks declared by a trainer with their own keys, and the plugin hook."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.tiny import TinyTrainer
from theseus.config import Schema, field
from theseus.errors import ConfigError, PluginError
from theseus.plugins import hookimpl, plugins, register_hooks
from theseus.tracking.status import read_status
from theseus.training.callbacks import EVENTS, Callback, StepInfo, callback

TIMING = {"tokens_per_sec", "mfu", "step_time"}


def rows(root: Path, name: str) -> list[dict[str, Any]]:
    path = root / "runs" / name / "metrics.jsonl"
    found = [json.loads(line) for line in path.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in found]


@dataclass
class Recorder(Callback):
    """Every event, and every ``test/every``-th update (a key of its own, in the job's schema)."""

    every: int = field("test/callbacks/every", default=3, help="record every N updates")
    on = EVENTS

    def __post_init__(self) -> None:
        self.seen: list[tuple[str, int, int, bool, str | None]] = []

    def __call__(self, info: StepInfo) -> None:
        validated = info.validation is not None
        self.seen.append((info.event, info.step, info.metrics_step, validated, info.reason))
        if info.event == "every":
            assert int(info.state.step) == info.step and info.metrics["loss"] > 0
            info.log(
                "recorder",
                {"norm": float(sum(np.abs(np.asarray(p)).sum() for p in jax.tree.leaves(info.state.params)))},
            )


class Recorded(TinyTrainer):
    CALLBACKS = [Recorder]

    def callbacks(self) -> list[Any]:
        self.recorder, *rest = super().callbacks()
        return [self.recorder, *rest]


def test_events_come_in_order_with_the_metrics_they_promise(tmp_path: Path) -> None:
    assert "test/callbacks/every" in Schema.build(Recorded.config())
    settings = quick(
        training__steps=7, training__eval_batches=1, training__eval_interval=3, training__checkpoint_interval=3
    )
    trainer = Recorded.create(tmp_path, {**settings, "test/callbacks/every": 2, "run/name": "events"})
    trainer.run()
    seen = trainer.recorder.seen
    assert seen[0] == ("start", 0, 0, False, None) and seen[-1] == ("end", 7, 7, True, "completed")
    # "every": each 2nd update, that update's own metrics; the built-in validation ran before it at 6
    assert [s[1:4] for s in seen if s[0] == "every"] == [(2, 2, False), (4, 4, False), (6, 6, True)]
    # "step": every update, without waiting for it: the newest metrics fetched (one update late unless
    # something at that step waited for it)
    steps = [s[1:3] for s in seen if s[0] == "step"]
    assert steps == [(1, 0), (2, 2), (3, 3), (4, 4), (5, 4), (6, 6), (7, 6)]
    # the built-ins are callbacks too: validation at 3, 6 and the end; checkpoints at 3, 6 and the end
    assert [s[1] for s in seen if s[0] == "validation"] == [3, 6, 7]
    assert [s[1] for s in seen if s[0] == "checkpoint"] == [3, 6, 7]
    assert [r["step"] for r in rows(tmp_path, "events") if r["split"] == "recorder"] == [2, 4, 6]
    assert [r["step"] for r in rows(tmp_path, "events") if r["split"] == "train"] == list(range(1, 8))


class StopAt(Callback):
    """Stops the run at ``step`` (once: a resumed invocation starts past it)."""

    on = ("step",)

    def __init__(self, step: int) -> None:
        self.step = step

    def __call__(self, info: StepInfo) -> None:
        if info.step == self.step:
            info.stop(f"asked to stop at {self.step}")


class Stopped(TinyTrainer):
    CALLBACKS = [StopAt(3)]


def test_a_callback_stops_the_run_and_the_same_command_resumes_exactly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = quick(
        training__steps=6, training__eval_batches=1, training__eval_interval=4, **{"architecture/dropout": 0.2}
    )
    straight = TinyTrainer.create(tmp_path, {**settings, "run/name": "straight"})
    straight.run()

    stopped = Stopped.create(tmp_path, {**settings, "run/name": "stopped"})
    stopped.run()
    err = capsys.readouterr().err
    assert "trained 'stopped' to step 3/6" in err and "stopped: asked to stop at 3" in err
    assert [r["step"] for r in rows(tmp_path, "stopped") if r["split"] == "train"] == [1, 2, 3]
    checkpoints = tmp_path / "runs" / "stopped" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) == ["3"]
    assert (read_status(tmp_path / "runs" / "stopped") or {})["state"] == "stopped"

    stopped.run()  # the same command: resumes at 3 and runs to the end
    assert "resuming run 'stopped' from step 3" in capsys.readouterr().err
    for a, b in zip(jax.tree.leaves(straight.state), jax.tree.leaves(stopped.state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert rows(tmp_path, "stopped") == rows(tmp_path, "straight")


class HookPlugin:
    def __init__(self, result: list[Any]) -> None:
        self.result = result
        self.trainers: list[Any] = []

    @hookimpl
    def theseus_callbacks(self, trainer: Any) -> list[Any]:
        self.trainers.append(trainer)
        return self.result


def test_plugins_add_callbacks_after_the_trainers_own(tmp_path: Path) -> None:
    order: list[str] = []

    @callback(on="end")
    def from_plugin(info: StepInfo) -> None:
        order.append(f"plugin {info.reason}")

    class Own(TinyTrainer):
        CALLBACKS = [Callback(lambda info: order.append(f"trainer {info.reason}"), on=("end",))]

    plugin = HookPlugin([from_plugin])
    register_hooks(plugin, name="test-loop-callbacks")
    try:
        trainer = Own.create(tmp_path, quick(training__steps=2, training__stop_after=1))
        trainer.run()
    finally:
        plugins().manager.unregister(name="test-loop-callbacks")
    assert plugin.trainers == [trainer]
    assert order == ["trainer stop_after", "plugin stop_after"]


def test_a_callback_that_cannot_run_fails_before_anything_is_written(tmp_path: Path) -> None:
    class Never(TinyTrainer):
        CALLBACKS = [Callback(print)]

    with pytest.raises(ConfigError, match=r"from Never.callbacks\(\) has neither every=N nor on="):
        Never.create(tmp_path, quick(run__name="never")).run()

    class Misspelt(TinyTrainer):
        CALLBACKS = [Callback(print, on="ends")]

    with pytest.raises(ConfigError, match="unknown event 'ends'; did you mean 'end'"):
        Misspelt.create(tmp_path, quick(run__name="misspelt")).run()

    register_hooks(HookPlugin([print]), name="test-bad-loop-callbacks")
    try:
        with pytest.raises(PluginError, match=r"from the theseus_callbacks hook of .* has neither every=N"):
            TinyTrainer.create(tmp_path, quick(run__name="hooked")).run()
    finally:
        plugins().manager.unregister(name="test-bad-loop-callbacks")
    assert not (tmp_path / "runs").exists()
