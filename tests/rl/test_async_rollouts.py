"""Rollouts made ahead on a worker thread (``rl/async_rollouts``): which parameters sample which step, the
synchronous run at staleness 0, and the sampling correction's metrics once the sampler is a step behind."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.reliability.conftest import error_line
from tests.rl.test_grpo import grpo, train_rows, untimed
from theseus.model.rl.rollout_producer import RolloutProducer

CORRECTION = "sampling/importance_sampling_ratio/mean"


def recording_producer(staleness: int) -> tuple[RolloutProducer[tuple[int, float]], list[str]]:
    threads: list[str] = []

    def make(params: dict, step: int) -> tuple[int, float]:
        threads.append(threading.current_thread().name)
        return step, float(params["w"])

    return RolloutProducer(make, staleness), threads


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_each_step_is_sampled_by_the_parameters_staleness_steps_before_it(staleness: int) -> None:
    producer, threads = recording_producer(staleness)
    start, seen = 3, []
    try:
        for step in range(start, start + 6):
            produced = producer.take(step, {"w": np.float32(step)})  # parameters of step s hold s
            seen.append((step, *produced.made, produced.staleness))
    finally:
        producer.close()
    for step, made_step, sampled_by, stale in seen:
        assert made_step == step
        assert sampled_by == max(step - staleness, start)  # the first steps after a start: its parameters
        assert stale == step - sampled_by
    assert set(threads) and all(name.startswith("theseus-rollouts") for name in threads)


def test_close_drops_the_steps_made_ahead_and_a_failure_reaches_the_trainer() -> None:
    def make(params: dict, step: int) -> int:
        if step == 1:
            raise ValueError("reward failed")
        return step

    producer = RolloutProducer(make, 2)
    assert producer.take(0, {"w": np.zeros(2)}).made == 0
    with pytest.raises(ValueError, match="reward failed"):
        producer.take(1, {"w": np.zeros(2)})
    producer.close()
    assert producer._pending == {} and producer._pool is None


def test_no_step_past_the_runs_last_is_made_ahead() -> None:
    made: list[int] = []

    def make(params: dict, step: int) -> int:
        made.append(step)
        return step

    producer = RolloutProducer(make, 2, last=3)
    try:
        assert [producer.take(step, {"w": np.zeros(2)}).made for step in range(4)] == [0, 1, 2, 3]
    finally:
        producer.close()
    assert sorted(made) == [0, 1, 2, 3]  # steps 4 and 5, two ahead of the last steps, are never sampled


ASYNC_RUN = ["training/steps=3", "training/lr=1e-2"]


def test_at_staleness_0_the_run_equals_the_synchronous_one(tmp_path: Path) -> None:
    assert grpo(tmp_path, *ASYNC_RUN, "run/name=sync") == 0
    assert grpo(tmp_path, *ASYNC_RUN, "rl/async_rollouts=true", "rl/max_staleness=0", "run/name=ahead") == 0
    sync, ahead = (train_rows(tmp_path / "runs" / name) for name in ("sync", "ahead"))
    assert untimed(ahead) == untimed(sync)
    assert [row["rollout_staleness"] for row in ahead] == [0, 0, 0]
    assert CORRECTION not in ahead[0]  # sampled by the parameters being trained: nothing to correct


def test_a_step_behind_the_sampler_is_weighed_by_the_correction(tmp_path: Path) -> None:
    assert grpo(tmp_path, *ASYNC_RUN, "run/name=sync") == 0
    assert grpo(tmp_path, *ASYNC_RUN, "rl/async_rollouts=true", "run/name=behind") == 0
    sync, behind = (train_rows(tmp_path / "runs" / name) for name in ("sync", "behind"))
    assert [row["rollout_staleness"] for row in behind] == [0, 1, 1]
    # step 1's rollouts are the initial parameters', as step 0's are: a new draw (seeded by the step) of them
    assert behind[0]["reward"] == sync[0]["reward"]
    assert behind[0]["grad_norm"] == pytest.approx(sync[0]["grad_norm"], rel=1e-4)  # float32 sums, two programs
    ratios = [row[CORRECTION] for row in behind]
    assert ratios[0] == pytest.approx(1.0, abs=1e-5)  # the sampler is the trained policy at the first step
    assert all(abs(r - 1.0) > 1e-4 for r in ratios[1:]), ratios  # one update (lr 1e-2) apart afterwards


def test_rollout_devices_must_leave_devices_to_train_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert grpo(tmp_path, "training/steps=1", "rl/rollout_devices=1", "run/name=none-left") == 2
    assert error_line(capsys.readouterr().err) == (
        "error: rl/rollout_devices=1 leaves none of the 1 devices to train on; leave it 0 on one device"
    )
