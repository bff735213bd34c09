"""``theseus runs``: statuses of real runs, show, compare, rm, stable JSON, and no jax import."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env
from tests.reliability.conftest import call_cli
from tests.tracking.conftest import JOB_FILE, Runs
from theseus.tracking.runs import ROW_KEYS

pytestmark = pytest.mark.slow


def theseus(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = call_cli(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def listing(capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> list[dict]:
    code, out, err = theseus(capsys, "runs", "--root", str(root), "--json", *args)
    assert code == 0, err
    return json.loads(out)


def test_statuses_of_real_runs(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    assert runs.first_invocation_status["state"] == "stopped"
    assert runs.first_invocation_status["step"] == 3
    # A run started from the command line, watched while it trains, then killed with SIGKILL.
    env = clean_env(PYTHONPATH=str(REPO))
    command = [sys.executable, "-m", "theseus.cli.main", "--load", str(JOB_FILE), "run", "test/tracking/tiny"]
    settings = ["training/steps=100000", "training/batch_size=8", "training/lr=0.01", "training/eval_batches=0"]
    settings += [
        "training/progress=false",
        "training/checkpoint_interval=0",
        "training/log_interval=1",
        "run/name=live",
    ]
    log = (runs.root / "live.log").open("w")
    process = subprocess.Popen(
        [*command, "--root", str(runs.root), *settings], env=env, stdout=subprocess.DEVNULL, stderr=log
    )
    try:
        metrics = runs.root / "runs" / "live" / "metrics.jsonl"
        deadline = time.monotonic() + 240
        while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
            assert process.poll() is None, (runs.root / "live.log").read_text()
            assert time.monotonic() < deadline, "the live run did not start training"
            time.sleep(0.2)
        rows = {r["name"]: r for r in listing(capsys, runs.root)}
        assert rows["live"]["status"] == "running"
        assert rows["live"]["total_steps"] == 100000
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        log.close()
    rows = {r["name"]: r for r in listing(capsys, runs.root)}
    assert {name: row["status"] for name, row in rows.items()} == {
        "tracked": "completed",
        "stopped": "stopped",
        "live": "crashed",
    }
    assert rows["stopped"]["step"] == 3 and rows["stopped"]["total_steps"] == 6
    assert rows["tracked"]["step"] == 6 and rows["tracked"]["tokens"] == 6 * 8 * 16
    assert rows["tracked"]["best_val_loss"] == pytest.approx(
        min(json.loads(line)["loss"] for line in metrics_lines(runs.root, "tracked") if '"val"' in line)
    )
    code, out, _ = theseus(capsys, "runs", "--root", str(runs.root), "--sort", "name")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:4] == ["NAME", "JOB", "STATUS", "STEP"]
    assert lines[1].startswith("live ") and " crashed " in lines[1]
    assert lines[2].startswith("stopped ") and "stopped at step 3" in lines[2] and " 3/6 " in lines[2]
    assert lines[3].startswith("tracked ") and " completed " in lines[3] and " 6/6 " in lines[3]
    assert [r["name"] for r in listing(capsys, runs.root, "--status", "crashed")] == ["live"]
    assert [r["name"] for r in listing(capsys, runs.root, "--job", "test/track*")] == ["live"]
    by_step = [r["name"] for r in listing(capsys, runs.root, "--sort", "step") if r["name"] != "live"]
    assert by_step == ["tracked", "stopped"]


def metrics_lines(root: Path, name: str) -> list[str]:
    return (root / "runs" / name / "metrics.jsonl").read_text().splitlines()


def test_json_listing_is_stable(runs: Runs, capsys: pytest.CaptureFixture[str]) -> None:
    first = theseus(capsys, "runs", "--root", str(runs.root), "--json", "--status", "completed")[1]
    second = theseus(capsys, "runs", "--json", "--root", str(runs.root), "--status", "completed")[1]
    assert first == second
    # scripts written for the earlier name of the state still select the same runs
    assert theseus(capsys, "runs", "--json", "--root", str(runs.root), "--status", "complete")[1] == first
    rows = json.loads(first)
    assert [r["name"] for r in rows] == ["tracked"]
    assert tuple(rows[0]) == ROW_KEYS
    assert rows[0]["job"] == "TinyTrainer" and rows[0]["error"] is None and rows[0]["checkpoint"] == 6


def test_show_prints_configuration_provenance_metrics_and_checkpoints(
    runs: Runs, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = theseus(capsys, "runs", "--root", str(runs.root), "show", "tracked")
    assert code == 0, err
    assert "status      completed" in out
    assert "training/steps = 6" in out and "metrics/sinks = jsonl,tensorboard,wandb,mlflow" in out
    assert "job class   tests.training.tiny:TinyTrainer" in out and "theseus-core" in out
    assert "objective   theseus.training.objective:CrossEntropy" in out
    assert "train (step 6): loss " in out and "val (step 6): loss " in out
    wandb_id = json.loads((runs.root / "runs" / "tracked" / "wandb.json").read_text())["id"]
    assert f"wandb        run id {wandb_id}" in out and "tensorboard  tensorboard --logdir " in out
    checkpoints = [line.split() for line in out.splitlines() if line.startswith("  step ")]
    assert [c[1] for c in checkpoints] == ["3", "6"] and checkpoints[-1][-1] == "best"
    shown = json.loads(theseus(capsys, "runs", "show", "tracked", "--root", str(runs.root), "--json")[1])
    assert shown["run"]["status"] == "completed"
    assert [c["step"] for c in shown["checkpoints"]] == [3, 6]
    assert shown["config"]["training/eval_interval"] == 3
    code, _, err = theseus(capsys, "runs", "--root", str(runs.root), "show", "traked")
    assert code == 2 and err.strip().splitlines()[-1].startswith("error: no run 'traked'")
    assert "did you mean 'tracked'?" in err


def test_compare_writes_an_overlay_png_and_the_differing_keys(
    runs: Runs, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    out_png = tmp_path / "cmp.png"
    args = ["runs", "--root", str(runs.root), "compare", "tracked", "stopped", "--metric", "train/loss"]
    code, out, err = theseus(capsys, *args, "--x", "tokens", "--out", str(out_png))
    assert code == 0, err
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out_png.stat().st_size > 5000
    lines = out.splitlines()
    assert lines[0].split() == ["RUN", "POINTS", "LAST", "train/loss", "MIN", "train/loss"]
    assert lines[1].split()[:2] == ["tracked", "6"] and lines[2].split()[:2] == ["stopped", "3"]
    diff = {line.split()[0]: line.split()[1:] for line in lines if line.startswith("training/")}
    assert diff == {"training/lr": ["0.01", "0.02"]}
    assert not any(line.startswith("run/name") for line in lines)
    code, _, err = theseus(capsys, "runs", "--root", str(runs.root), "compare", "tracked", "stopped", "--metric", "x/y")
    assert code == 2 and "no run has metric 'x/y'; recorded metrics: " in err and "train/loss" in err


def test_rm_asks_first(runs: Runs, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    copy = runs.root / "runs" / "copy"
    shutil.copytree(runs.root / "runs" / "stopped", copy)
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("n\n"))
    code, out, _ = theseus(capsys, "runs", "--root", str(runs.root), "rm", "copy")
    assert code == 0 and "nothing removed" in out and copy.is_dir()
    code, out, _ = theseus(capsys, "runs", "--root", str(runs.root), "rm", "copy", "--yes")
    assert code == 0 and out.startswith("removed run 'copy' (stopped at step 3, 1 checkpoints") and not copy.exists()
    code, _, err = theseus(capsys, "runs", "--root", str(runs.root), "rm", "copy", "--yes")
    assert code == 2 and "error: no run 'copy'" in err


def test_a_bad_tracker_fails_the_run_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--load", str(JOB_FILE), "run", "test/tracking/tiny", "--root", str(tmp_path), "training/steps=2"]
    code, _, err = theseus(capsys, *args, "metrics/sinks=jsonl,tensorbord")
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "error: unknown metrics sink 'tensorbord' in metrics/sinks; choose from jsonl, tensorboard, wandb, mlflow "
        "(other trackers are added by plugins through the theseus_metrics_sinks hook)"
    )
    assert not (tmp_path / "runs").exists()


def test_runs_does_not_import_jax(runs: Runs) -> None:
    code = (
        "import sys\nfrom theseus.cli.main import cli\n"
        f"cli.main(['runs', '--root', {str(runs.root)!r}], standalone_mode=False)\n"
        "print('JAX' if 'jax' in sys.modules else 'NOJAX')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "NOJAX"
    assert "tracked" in result.stdout


def test_a_running_run_is_not_removed_and_old_runs_are_listed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import platform

    alive = tmp_path / "runs" / "alive"
    alive.mkdir(parents=True)
    status = {"state": "running", "step": 7, "total_steps": 10, "pid": os.getpid(), "host": platform.node()}
    (alive / "status.json").write_text(json.dumps(status))
    old = tmp_path / "runs" / "old"  # written before status.json existed
    (old / "checkpoints" / "4").mkdir(parents=True)
    (old / "config.yaml").write_text("training:\n  steps: 8\n")
    # an older theseus also called the targets a validation scored "tokens": only training's count
    records = [
        {"step": 4, "split": "train", "loss": 2.7, "tokens": 512},
        {"step": 4, "split": "val", "loss": 2.5, "tokens": 4096},
    ]
    (old / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    rows = {r["name"]: r for r in listing(capsys, tmp_path)}
    assert (rows["alive"]["status"], rows["alive"]["step"]) == ("running", 7)
    assert (rows["old"]["status"], rows["old"]["step"], rows["old"]["total_steps"]) == ("stopped", 4, 8)
    assert rows["old"]["best_val_loss"] == 2.5 and rows["old"]["tokens"] == 512
    code, _, err = theseus(capsys, "runs", "--root", str(tmp_path), "rm", "alive", "--yes")
    assert code == 2 and err.strip().startswith("error: run 'alive' is running; stop it before removing")
    assert alive.is_dir()
