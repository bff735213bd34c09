"""``evaluation=harness`` on a pretraining run: lm-eval metrics in the run's metrics.jsonl, equal to
``eval/harness`` on the checkpoint the run ends with."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.harness.conftest import Imported, theseus_main

#: One layer, 32 wide, 64 positions, 3 steps on 16 documents of the offline corpus.
TINY = [
    "architecture/n_layers=1",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=64",
    "training/batch_size=4",
    "training/steps=3",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/checkpoint_interval=0",
    "training/async_checkpoints=false",
    "training/progress=false",
    "training/plots=false",
    "training/compilation_cache=false",
    "training/peak_flops=1e12",
    "data/max_documents=16",
    "data/val_fraction=0.125",
]
TASKS = "tiny_choice,tiny_rolling"


def test_training_logs_harness_metrics_equal_to_the_job(
    imported: Imported, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = ["--root", str(tmp_path / "root")]
    harness = [
        "evaluation=harness",
        f"evaluation/harness/tasks={TASKS}",
        f"evaluation/harness/include_path={imported.tasks}",
        "evaluation/harness/batch_size=4",
    ]
    assert theseus_main("run", "train/pretrain", *TINY, *harness, "run/name=trained", *root) == 0
    assert "step 3: harness: tiny_choice/acc " in capsys.readouterr().err
    run = tmp_path / "root" / "runs" / "trained"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["split"] == "eval"]
    assert logged["step"] == 3
    metrics = {k.removeprefix("harness/"): v for k, v in logged.items() if k.startswith("harness/")}
    assert set(metrics) == {
        "tiny_choice/acc",
        "tiny_choice/acc_stderr",
        "tiny_choice/acc_norm",
        "tiny_choice/acc_norm_stderr",
        "tiny_choice/samples",
        "tiny_rolling/word_perplexity",
        "tiny_rolling/byte_perplexity",
        "tiny_rolling/bits_per_byte",
        "tiny_rolling/samples",
    }
    assert metrics["tiny_choice/samples"] == 6 and metrics["tiny_rolling/samples"] == 3

    # the job on the run's final checkpoint measures the same (the same parameters and context)
    out = tmp_path / "job.json"
    job = ["eval/run=trained", f"eval/tasks={TASKS}", f"eval/include_path={imported.tasks}", f"eval/out={out}"]
    assert theseus_main("run", "eval/harness", *job, *root) == 0
    results = json.loads(out.read_text())["results"]
    for name, value in metrics.items():
        task, metric = name.split("/")
        if metric != "samples":
            assert results[task][f"{metric},none"] == pytest.approx(value, rel=1e-6), name
    shown = capsys.readouterr().out  # lm-eval's table
    assert "|tiny_choice " in shown and "|bits_per_byte" in shown
