"""The hook implementations: the CSV metrics sink and the gathered ``metrics/csv`` section."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from theseus.config import Schema
from theseus.training.base import BaseTrainer
from theseus.training.pretrain import Pretrain
from theseus_plugins_example.hooks import CsvMetricsConfig, CsvMetricsSink
from theseus_plugins_example.trainers import ExampleTrainer, StepMetrics


def rows(path: Path) -> list[list[str]]:
    with path.open(newline="") as handle:
        return list(csv.reader(handle))


def test_sink_writes_rows_and_a_resumed_run_continues_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run" / "metrics.csv"
    sink = CsvMetricsSink(path)
    for step in (1, 2, 3, 4):
        sink.write(step, {"train/loss": 5.0 - step, "train/lr": 0.1})
    sink.close()
    assert rows(path)[0] == ["step", "name", "value"] and len(rows(path)) == 9
    assert rows(path)[5] == ["3", "train/loss", "2.0"]
    # a new invocation resumed from step 2 writes step 3 again: the interrupted rows go
    resumed = CsvMetricsSink(path)
    resumed.write(3, {"train/loss": 1.5})
    resumed.close()
    assert [r[0] for r in rows(path)[1:]] == ["1", "1", "2", "2", "3"]
    assert rows(path)[-1] == ["3", "train/loss", "1.5"]


def test_gather_adds_the_section_to_opted_in_trainers_only() -> None:
    assert CsvMetricsConfig in ExampleTrainer.config() and CsvMetricsConfig in StepMetrics.config()
    schema = Schema.build(ExampleTrainer.config())
    assert schema["metrics/csv/enabled"].default is True and schema["metrics/csv/file"].default == "metrics.csv"
    assert "metrics/csv/enabled" not in Schema.build(Pretrain.config())

    class MyTrainer(BaseTrainer):
        MODEL = "gpt"
        CSV_METRICS = True

    assert "metrics/csv/file" in Schema.build(MyTrainer.config())


def test_the_plugin_module_is_light() -> None:
    code = "import sys, theseus_plugins_example.hooks\nprint([m for m in ('jax', 'flax', 'optax') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
