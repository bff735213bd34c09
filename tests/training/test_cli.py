"""``theseus --load FILE run JOB``: a full run in a subprocess, then the same command again."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_cli

JOB_FILE = Path(__file__).with_name("cli_job.py")


def test_full_run_through_the_cli(tmp_path: Path) -> None:
    args = [
        "--load",
        str(JOB_FILE),
        "run",
        "test/tiny/train",
        "--root",
        str(tmp_path),
        "architecture/vocab_size=257",
        "training/steps=4",
        "training/batch_size=4",
        "training/log_interval=2",
        "training/eval_interval=2",
        "training/eval_batches=1",
        "training/checkpoint_interval=2",
        "training/keep_checkpoints=1",
        "evaluation/perplexity/batches=1",
        "evaluation/multiple_choice/limit=4",
    ]
    done = run_cli(args, timeout=300)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "test-tiny-train"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["split"]) for r in rows if r["split"] in ("train", "val")] == [
        (1, "train"),
        (2, "train"),
        (2, "val"),
        (4, "train"),
        (4, "val"),
    ]
    evaluation = next(r for r in rows if r["split"] == "eval")
    assert evaluation["step"] == 4 and evaluation["multiple_choice/questions"] == 4
    assert 0.0 <= evaluation["multiple_choice/acc"] <= 1.0 and evaluation["perplexity/perplexity"] > 1.0
    assert (run / "loss.png").stat().st_size > 1000
    assert (run / "analysis" / "activations" / "step_00000004.json").is_file()
    assert (run / "analysis" / "activations" / "step_00000004.png").is_file()
    assert (run / "checkpoints" / "4" / "state").is_dir()
    assert "training" in (run / "config.yaml").read_text()
    provenance = json.loads((run / "provenance.json").read_text())
    assert provenance["job"] == "test/tiny/train"
    assert provenance["job_class"].endswith(":TinyJob")
    assert "theseus-core" in provenance["distributions"] and provenance["versions"]["jax"]
    assert provenance["devices"][0]["platform"] == "cpu"

    again = run_cli(args, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "already completed (4/4 steps)" in again.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == len(rows)


def test_cli_reports_a_bad_batch_geometry_in_one_line(tmp_path: Path) -> None:
    done = run_cli(
        ["--load", str(JOB_FILE), "run", "test/tiny/train", "--root", str(tmp_path), "training/micro_batch_size=5"],
        timeout=300,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "error: training/batch_size=32 is not divisible by training/micro_batch_size=5; "
        "choose a micro batch that divides the global batch"
    )
    assert "Traceback" not in done.stderr
