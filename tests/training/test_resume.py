"""Runs resume exactly: N steps straight == N/2, stop, resume, N/2; checkpoints keep latest and best."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.training.conftest import quick
from tests.training.tiny import PaddedTinyTrainer
from theseus.checkpoint import CheckpointStore
from theseus.errors import CheckpointError
from theseus.runs.layout import checkpoint_steps
from theseus.training.schedules import WSD

TIMING = {"tokens_per_sec", "mfu", "step_time"}


class Trainer(PaddedTinyTrainer):
    SCHEDULE = WSD


def settings(name: str, **extra) -> dict:
    values = {
        "training__steps": 6,
        "training__eval_batches": 1,
        "training__eval_interval": 3,
        "training__async_checkpoints": True,
        "run__name": name,
        "architecture/dropout": 0.2,
        "schedule/wsd/warmup_fraction": 0.34,
        "schedule/wsd/decay_fraction": 0.5,
    }
    return quick(**{**values, **extra})


def metric_rows(root: Path, name: str) -> list[dict]:
    rows = [json.loads(line) for line in (root / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def test_stop_and_resume_matches_an_uninterrupted_run(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    straight = Trainer.create(tmp_path, settings("straight"))
    straight.run()

    first = Trainer.create(tmp_path, settings("split", training__stop_after=3))
    first.run()
    checkpoints = tmp_path / "runs" / "split" / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.isdigit()) == ["3"]
    # A crash after step 3 may have left metrics of steps that are redone after resuming.
    with (tmp_path / "runs" / "split" / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"step": 4, "split": "train", "loss": 123.0}) + "\n" + '{"step": 5, "spl')

    # The same command again resumes. (The trainer object is reused so its compiled step is too;
    # everything else - state, optimizer, dropout key, data position - comes from the checkpoint.)
    resumed = first
    resumed.args.stop_after = 0
    resumed.run()
    assert "resuming run 'split' from step 3" in capsys.readouterr().err

    assert int(resumed.state.step) == int(straight.state.step) == 6
    for a, b in zip(jax.tree.leaves(straight.state.params), jax.tree.leaves(resumed.state.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    for a, b in zip(jax.tree.leaves(straight.state.opt_state), jax.tree.leaves(resumed.state.opt_state), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert metric_rows(tmp_path, "split") == metric_rows(tmp_path, "straight")

    store = CheckpointStore(checkpoints)
    assert store.steps() == [3, 6]
    assert store.meta(6)["data_position"] == 6
    store.close()

    # Running the finished run again says so and changes nothing.
    again = Trainer.create(tmp_path, settings("split"))
    again.run()
    assert "already completed (6/6 steps)" in capsys.readouterr().err
    assert again.state is None

    # Continuing with a different model configuration names the mismatching parameter.
    wider = Trainer.create(tmp_path, settings("split", training__steps=8, **{"architecture/width": 48}))
    with pytest.raises(CheckpointError, match=r"parameter '.*' of shape \(.*\) but the configured model expects"):
        wider.run()


def test_store_keeps_latest_and_best(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "ckpt", keep=2, async_save=False)
    for step, val in zip(range(1, 6), [3.0, 1.0, 2.0, None, None], strict=False):
        store.save(step, {"params": {"w": jnp.full((2,), float(step))}}, {"step": step}, val_loss=val)
    store.wait()
    assert store.steps() == [2, 4, 5]
    assert store.best_step() == 2
    tree, meta = store.restore(2, {"params": {"w": jax.ShapeDtypeStruct((2,), jnp.float32)}})
    assert meta == {"step": 2} and np.array_equal(np.asarray(tree["params"]["w"]), [2.0, 2.0])
    with pytest.raises(CheckpointError, match=r"parameter 'w' of shape \(2,\) but the configured model expects \(3,\)"):
        store.check_shapes(2, {"w": jax.ShapeDtypeStruct((3,), jnp.float32)})
    store.close()


def test_a_folder_named_like_a_step_is_not_a_checkpoint(tmp_path: Path) -> None:
    """``mkdir checkpoints/99`` used to make a run at step 2 report itself complete at step 99."""
    store = CheckpointStore(tmp_path / "run" / "checkpoints", keep=3, async_save=False)
    for step in (1, 2):
        store.save(step, {"params": {"w": jnp.full((2,), float(step))}}, {"step": step})
    store.wait()
    store.close()
    (tmp_path / "run" / "checkpoints" / "99").mkdir()
    (tmp_path / "run" / "checkpoints" / "98" / "state").mkdir(parents=True)  # a state without its commit marker
    reopened = CheckpointStore(tmp_path / "run" / "checkpoints")
    assert reopened.steps() == [1, 2] and reopened.latest_step() == 2
    reopened.close()
    assert checkpoint_steps(tmp_path / "run") == [1, 2]
