"""The harness on two processes (``jax.distributed`` over gloo, 2 CPU devices each): process 0 drives
lm-eval while both compute, in training (``evaluation=harness``) and in ``eval/harness``, with the
parameters sharded over all four devices. Each measures what one process on one device measures.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import clean_env, run_joined, xla_flags
from tests.harness.conftest import Imported, logliks, theseus_main
from tests.harness.test_training import TINY

TASKS = "tiny_choice,tiny_generate,tiny_rolling"


def two_processes(args: list[str], offline: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """``theseus ARGS`` as processes 0 and 1 of one run, 2 CPU devices each; both must succeed."""
    env = clean_env(XLA_FLAGS=xla_flags(devices=2), **offline)
    done = run_joined(args, env=lambda _: env)
    for index, process in enumerate(done):
        assert process.returncode == 0, f"process {index}:\n{process.stderr[-3000:]}"
    return done


def samples(out: Path, task: str) -> dict[int, Any]:
    return {row["doc_id"]: row for row in map(json.loads, (out.parent / f"samples_{task}.jsonl").open())}


@pytest.fixture(scope="module")
def measured(imported: Imported, offline: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    folder = tmp_path_factory.mktemp("processes")
    root = ["--root", str(folder / "root")]
    tasks = [f"eval/tasks={TASKS}", f"eval/include_path={imported.tasks}", "eval/log_samples=true"]
    harness = [
        "evaluation=harness",
        "evaluation/harness/tasks=tiny_choice,tiny_rolling",
        f"evaluation/harness/include_path={imported.tasks}",
        "evaluation/harness/batch_size=4",
    ]
    steps = ["training/steps=2", "training/evaluation_interval=2", "mesh/layout=fsdp"]
    training = two_processes(["run", "train/pretrain", *TINY, *steps, *harness, "run/name=two", *root], offline)
    two = folder / "two" / "harness.json"
    sharded = ["eval/run=two", *tasks, f"eval/out={two}", "eval/layout=fsdp+tp", "eval/mesh_model=2"]
    job = two_processes(["run", "eval/harness", *sharded, *root], offline)
    one = folder / "one" / "harness.json"
    assert theseus_main("run", "eval/harness", "eval/run=two", *tasks, f"eval/out={one}", *root) == 0
    run = folder / "root" / "runs" / "two"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {"training": training, "job": job, "records": records, "one": one, "two": two}


def test_eval_harness_on_two_processes_equals_one_device(measured: dict[str, Any]) -> None:
    one, two = measured["one"], measured["two"]
    assert "fsdp+tp over 4 devices (data 2 x model 2)" in measured["job"][0].stderr
    ours, theirs = json.loads(two.read_text())["results"], json.loads(one.read_text())["results"]
    for task in TASKS.split(","):
        for name, value in theirs[task].items():
            if isinstance(value, float):
                assert ours[task][name] == pytest.approx(value, rel=1e-5, abs=1e-6), (task, name)
        sharded, single = samples(two, task), samples(one, task)
        assert sharded.keys() == single.keys()
        for doc, row in single.items():
            if task == "tiny_generate":
                assert sharded[doc]["resps"] == row["resps"], doc  # the same generated strings
            else:
                assert logliks(sharded[doc]["resps"]) == pytest.approx(logliks(row["resps"]), abs=1e-5), (task, doc)
    # only process 0 writes results and prints lm-eval's table
    assert "|tiny_choice" in measured["job"][0].stdout and "|tiny_choice" not in measured["job"][1].stdout


def test_training_evaluation_on_two_processes_logs_what_one_device_measures(measured: dict[str, Any]) -> None:
    (logged,) = [r for r in measured["records"] if r["split"] == "eval"]
    assert logged["step"] == 2
    results = json.loads(measured["one"].read_text())["results"]
    checked = 0
    for name, value in logged.items():
        if name.startswith("harness/") and not name.endswith("/samples"):
            task, metric = name.removeprefix("harness/").split("/")
            assert results[task][f"{metric},none"] == pytest.approx(value, rel=1e-5), name
            checked += 1
    assert checked == 7  # acc, acc_norm and their stderr; three rolling perplexities
