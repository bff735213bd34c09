"""Trackers as metrics sinks, read back with their own readers: each holds what metrics.jsonl holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.tracking.conftest import TABLE, TABLE_COLUMNS, Runs, table_rows
from tests.tracking.readers import (
    close,
    jsonl_scalars,
    raw_tensorboard_points,
    tensorboard_scalars,
    tensorboard_tables,
    wandb_offline_run,
)
from theseus.errors import ConfigError

pytestmark = pytest.mark.slow


def test_tensorboard_holds_every_scalar_once_at_the_jsonl_steps(runs: Runs) -> None:
    run_dir = runs.root / "runs" / "tracked"
    expected = jsonl_scalars(run_dir)
    found = tensorboard_scalars(run_dir)
    assert set(found) == set(expected)
    assert {"train/loss", "train/lr", "train/grad_norm", "train/tokens", "val/loss"} <= set(found)
    for tag, points in expected.items():
        steps = [s for s, _ in found[tag]]
        assert steps == [s for s, _ in points], tag  # no step twice, although an invocation died after step 5
        for (_, want), (_, got) in zip(points, found[tag], strict=True):
            assert close(want, got, rel=1e-6), (tag, want, got)  # TensorBoard keeps float32
    assert [s for s, _ in found["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert 99.0 not in [v for _, v in found["train/loss"]]
    # The files themselves hold each (tag, step) once: the resumed run removed the crashed invocation's steps.
    raw = [point for point in raw_tensorboard_points(run_dir) if point[0] != TABLE]
    assert len(raw) == len(set(raw)) == sum(len(points) for points in expected.values())
    assert len(list(run_dir.glob("events.out.tfevents.*"))) == 3  # two invocations and the crashed one


def test_wandb_offline_history_equals_metrics_jsonl_and_resume_keeps_the_run(runs: Runs) -> None:
    run_dir = runs.root / "runs" / "tracked"
    run_id = json.loads((run_dir / "wandb.json").read_text())["id"]
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one per invocation, both of the same W&B run
    invocations = [wandb_offline_run(f) for f in files]
    assert [i["id"] for i in invocations] == [run_id, run_id]
    history: dict[int, dict] = {}
    for invocation in invocations:
        for step, row in invocation["history"].items():
            history.setdefault(step, {}).update(row)
    expected: dict[int, dict] = {}
    for name, points in jsonl_scalars(run_dir).items():
        for step, value in points:
            expected.setdefault(step, {})[name] = value
    assert sorted(history) == sorted(expected) == [1, 2, 3, 4, 5, 6]
    for step, row in expected.items():
        assert {key for key in history[step] if not key.startswith(f"{TABLE}/")} == set(row), step
        assert all(close(history[step][k], v) for k, v in row.items()), step
    config = invocations[0]["config"]
    assert config["training/steps"] == 6 and config["metrics/sinks"] == "jsonl,tensorboard,wandb,mlflow"
    assert config["provenance"]["job_class"] == "tests.training.tiny:TinyTrainer"


def test_mlflow_file_store_has_params_and_metrics_by_step(runs: Runs) -> None:
    from mlflow.tracking import MlflowClient

    run_dir = runs.root / "runs" / "tracked"
    stored = json.loads((run_dir / "mlflow.json").read_text())
    assert stored["tracking_uri"] == (runs.root.resolve() / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=stored["tracking_uri"])
    run = client.get_run(stored["run_id"])
    assert run.info.status == "FINISHED"
    assert run.data.params["training/steps"] == "6"
    assert run.data.params["provenance/job_class"] == "tests.training.tiny:TinyTrainer"
    assert client.get_experiment(run.info.experiment_id).name == "TinyTrainer"
    runs_in_store = client.search_runs([run.info.experiment_id])
    assert len(runs_in_store) == 1  # the resumed invocation continued the same MLflow run
    for name, points in jsonl_scalars(run_dir).items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, name))
        assert [s for s, _ in history] == [s for s, _ in points], name
        assert all(close(a, b) for (_, a), (_, b) in zip(history, points, strict=True)), name


def expected_table(step: int) -> list[list[str]]:
    return [[str(cell) for cell in row] for row in table_rows(step)]


def test_tables_reach_every_tracker_once_a_step(runs: Runs) -> None:
    """``StepInfo.log_table`` at each update: a TensorBoard text summary (the crashed invocation's removed on
    resume), a W&B Table in the offline run's files, an MLflow artifact per step; each holds the rows sent."""
    from mlflow.tracking import MlflowClient

    from theseus.tracking.mlflow import table_artifact

    run_dir = runs.root / "runs" / "tracked"
    steps = [1, 2, 3, 4, 5, 6]
    tables = tensorboard_tables(run_dir, TABLE)
    assert sorted(tables) == steps
    assert all(tables[step] == [TABLE_COLUMNS, *expected_table(step)] for step in steps)
    assert [step for tag, step in raw_tensorboard_points(run_dir) if tag == TABLE] == steps  # each once, in order

    logged: dict[int, dict] = {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for step, row in wandb_offline_run(path)["history"].items():
            if f"{TABLE}/path" in row:  # the history holds the table file's reference, its keys nested
                assert row[f"{TABLE}/_type"] == "table-file"
                logged[step] = json.loads((path.parent / "files" / row[f"{TABLE}/path"]).read_text())
    assert sorted(logged) == steps
    for step, table in logged.items():
        assert table["columns"] == TABLE_COLUMNS and table["data"] == table_rows(step), step

    stored = json.loads((run_dir / "mlflow.json").read_text())
    client = MlflowClient(tracking_uri=stored["tracking_uri"])
    names = [entry.path for entry in client.list_artifacts(stored["run_id"], TABLE)]
    assert names == [table_artifact(TABLE, step) for step in steps]
    for step in steps:
        local = client.download_artifacts(stored["run_id"], table_artifact(TABLE, step), str(runs.root / "mlflow-out"))
        assert json.loads(Path(local).read_text()) == {"columns": TABLE_COLUMNS, "data": table_rows(step)}


def test_a_failing_sink_warns_once_and_training_goes_on(runs: Runs) -> None:
    run_dir = runs.root / "runs" / "stopped"
    warnings = [line for line in runs.log.splitlines() if "metrics sink exploding failed" in line]
    assert len(warnings) == 1
    assert "at step 2 (ConnectionError: quota exceeded)" in warnings[0]
    assert "metrics.jsonl keeps every record" in warnings[0]
    steps = [s for s, _ in jsonl_scalars(run_dir)["train/loss"]]
    assert steps == [1, 2, 3]


def test_unknown_or_missing_tracker_is_one_line_before_anything_is_written(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    import importlib.util

    from theseus.tracking import sinks

    with pytest.raises(ConfigError, match=r"unknown metrics sink 'tensorbord' in metrics/sinks; choose from jsonl"):
        sinks.selected_sinks({"metrics/sinks": "jsonl, tensorbord"})
    real = importlib.util.find_spec
    with pytest.raises(ConfigError, match=r"metrics/wandb/mode must be one of online, offline, disabled"):
        sinks.selected_sinks({"metrics/sinks": "wandb", "metrics/wandb/mode": "ofline"})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError) as info:
        sinks.selected_sinks({"metrics/sinks": "tensorboard,wandb"})
    assert str(info.value) == (
        "metrics/sinks selects wandb but wandb is not installed; pip install 'theseus-core[wandb]'"
    )
    assert sinks.selected_sinks({"metrics/sinks": "jsonl"}) == []
    assert sinks.selected_sinks({"metrics/sinks": " TensorBoard ,jsonl"}) == ["tensorboard"]


def test_a_sink_failing_on_a_table_warns_once_and_one_without_tables_gets_none() -> None:
    from theseus.tracking.sinks import GuardedSink

    class Tables:
        def __init__(self) -> None:
            self.tables: list[tuple] = []

        def write(self, step: int, metrics: dict) -> None:
            pass

        def write_table(self, step: int, name: str, columns: list, rows: list) -> None:
            if step == 2:
                raise ConnectionError("payload too large")
            self.tables.append((step, name, columns, rows))

    warnings: list[str] = []
    tables = Tables()
    guarded = GuardedSink("tables", tables, warnings.append)
    for step in (1, 2, 3):
        guarded.write_table(step, "rollouts", ["a"], [["x"]])
    assert tables.tables == [(1, "rollouts", ["a"], [["x"]])]
    assert warnings == [
        "warning: metrics sink tables failed writing the table rollouts at step 2 (ConnectionError: payload too "
        "large); training goes on without it and metrics.jsonl keeps every record"
    ]
    GuardedSink("scalars only", object(), warnings.append).write_table(1, "rollouts", ["a"], [["x"]])
    assert len(warnings) == 1
