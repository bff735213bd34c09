"""Smaller reliability items: stopped and running runs in ``theseus runs``, YAML errors that name the
line, an empty ``--root``, hidden import/export folders, ``mesh/expert`` on a dense model, NaN in a
setting or in imported weights, and resuming after the data was prepared again."""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.reliability.conftest import BAD_JOB, SETTINGS, call_cli, error_line, train_args
from tests.training.conftest import write_byte_corpus
from theseus.data.format import read_header
from theseus.runs.lock import RunLock, holder
from theseus.training.preemption import EXIT_CODE

Cli = Callable[[list[str]], tuple[int, str]]

pytestmark = pytest.mark.usefixtures("compilation_cache")


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def listing(capsys: pytest.CaptureFixture[str], root: Path) -> dict[str, dict[str, Any]]:
    """``theseus runs --json`` as ``{name: row}``."""
    capsys.readouterr()
    assert call_cli(["runs", "--root", str(root), "--json"]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)}


@pytest.fixture(scope="module")
def stopped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, int, str]]:
    """A root whose run ``term`` got SIGTERM during update 3 (of 6): ``(root, exit code, stderr)``."""
    root = tmp_path_factory.mktemp("stopped-root")
    write_byte_corpus(root, "corpus", documents=32)
    err = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stderr(err):
        patch.setenv("THESEUS_TEST_KILL_AT", "step:3:TERM")
        code = call_cli(train_args(root, "run/name=term"))
    yield root, code, err.getvalue()


# -- 1. a run stopped by a signal is "stopped" -------------------------------------------------------


def test_a_run_stopped_by_sigterm_is_listed_as_stopped(
    stopped: tuple[Path, int, str], capsys: pytest.CaptureFixture[str]
) -> None:
    root, code, err = stopped
    assert code == EXIT_CODE, err
    row = listing(capsys, root)["term"]
    assert (row["status"], row["step"], row["checkpoint"], row["error"]) == ("stopped", 3, 3, None)
    status = json.loads((root / "runs" / "term" / "status.json").read_text())
    assert status["state"] == "stopped" and status["error"] is None


# -- 2. an active run is "running" -------------------------------------------------------------------


def test_a_run_whose_lock_is_held_is_listed_as_running(
    tmp_path: Path, cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "runs" / "live"
    run.mkdir(parents=True)
    record = {"state": "running", "host": "elsewhere", "pid": 1, "updated": 0.0, "step": 2, "total_steps": 6}
    (run / "status.json").write_text(json.dumps(record))
    starting = tmp_path / "runs" / "starting"  # a writer that has taken its lock and written nothing else yet
    starting.mkdir()
    assert holder(run) is None and listing(capsys, tmp_path)["live"]["status"] == "crashed"
    assert "starting" not in listing(capsys, tmp_path)
    lock, early = RunLock(run).acquire(), RunLock(starting).acquire()
    try:
        assert (holder(run) or {}).get("pid") == os.getpid()
        rows = listing(capsys, tmp_path)
        assert (rows["live"]["status"], rows["starting"]["status"]) == ("running", "running")
        assert call_cli(["runs", "show", "live", "--root", str(tmp_path)]) == 0
        shown = [line for line in capsys.readouterr().out.splitlines() if line.startswith("status")]
        since = json.loads((run / "lock").read_text())["since"]
        assert shown == [f"status      running (process {os.getpid()} on {platform.node()} since {since} UTC)"]
    finally:
        lock.release()
        early.release()
    assert holder(run) is None and listing(capsys, tmp_path)["live"]["status"] == "crashed"


# -- 3. YAML errors name the line --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("training:\n  steps: 3\n  lr: 0.1\n  steps: 4\n", "key 'training/steps' given twice, at lines 2 and 4"),
        ("training:\n\tsteps: 3\n", "a tab character at line 2, column 1; YAML indents with spaces"),
    ],
    ids=["duplicate-key", "tab"],
)
def test_yaml_errors_name_the_line(text: str, problem: str, cli: Cli, root: Path, tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(text)
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2
    assert error_line(err) == (
        f"error: config file '{config}' is not valid YAML ({problem}); "
        "fix the file or regenerate it with 'theseus configure'"
    )
    assert not (root / "runs").exists()


# -- 4. an empty --root --------------------------------------------------------------------------------


def test_an_empty_root_is_refused(cli: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    expected = (
        "error: --root is empty (''); give a directory (--root DIR), "
        "or leave --root out to use $THESEUS_ROOT or ~/.theseus"
    )
    for args in (
        ["--load", str(BAD_JOB), "run", "test/reliability/train", "--root", "", *SETTINGS],
        ["runs", "--root", ""],
    ):
        code, err = cli(args)
        assert (code, error_line(err)) == (2, expected)
    assert list(tmp_path.iterdir()) == []


# -- 7. mesh/expert on a dense model ------------------------------------------------------------------


def test_expert_axis_on_a_dense_model_is_refused(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "mesh/layout=ep", "mesh/expert=4"))
    assert code == 2
    assert error_line(err) == (
        "error: mesh/expert=4 but the model has no mixture-of-experts layers to split over the expert axis; "
        "set mesh/expert=1 (the devices then go to mesh/data), or choose a model with experts"
    )
    assert not (root / "runs").exists()


# -- 8. NaN settings -----------------------------------------------------------------------------------


def test_nan_settings_are_refused_in_a_whole_line(cli: Cli, root: Path) -> None:
    code, err = cli(train_args(root, "training/lr=nan"))
    assert (code, error_line(err)) == (2, "error: training/lr=nan is not a number; it must be a finite number > 0")
    code, err = cli(["run", "generate", "generate/run=any", "generate/temperature=nan", "--root", str(root)])
    expected = "error: generate/temperature=nan is not a number; it must be a finite number"
    assert (code, error_line(err)) == (2, expected)
    assert not (root / "runs").exists()


# -- 9. resuming after the data was prepared again ------------------------------------------------------


def test_resuming_on_data_prepared_again_is_refused(stopped: tuple[Path, int, str], cli: Cli, tmp_path: Path) -> None:
    root = tmp_path / "root"
    shutil.copytree(stopped[0] / "data", root / "data")
    shutil.copytree(stopped[0] / "runs", root / "runs")
    before = read_header(root / "data" / "corpus")
    shutil.rmtree(root / "data" / "corpus")
    write_byte_corpus(root, "corpus", documents=16, seed=1)  # as data/force=true would, with other documents
    now = read_header(root / "data" / "corpus")
    run = root / "runs" / "term"
    kept = snapshot(run)

    def sizes(header: Any) -> str:
        return ", ".join(f"{name} {split.tokens:,} tokens" for name, split in sorted(header.splits.items()))

    problem = (
        f"run 'term' was trained on data 'corpus' as prepared {before.created} ({sizes(before)}); "
        f"it was prepared again since ({sizes(now)} now)"
    )
    code, err = cli(train_args(root, "run/name=term"))
    assert code == 2
    assert error_line(err) == (
        f"error: {problem}; prepare it as it was, start a new run with run/name=<new name>, "
        "or resume on this data with training/accept_new_data=true"
    )
    assert snapshot(run) == kept  # nothing written
    code, err = cli(train_args(root, "run/name=term", "training/accept_new_data=true"))
    assert code == 0, err
    assert f"warning: {problem}; resuming on this data (training/accept_new_data=true)" in err.splitlines()
    recorded = json.loads((run / "data.json").read_text())["datasets"]["corpus"]
    assert recorded["created"] == now.created and recorded["splits"]["train"]["tokens"] == now.splits["train"].tokens


# -- 5, 6, 10. Hugging Face import and export ----------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama saved by transformers (float32 safetensors, a tokenizer)."""
    from tests.huggingface.conftest import save_model

    folder = tmp_path_factory.mktemp("hf") / "llama"
    save_model(folder, "llama")
    return folder


def hf(cli: Cli, root: Path, *args: str) -> tuple[int, str]:
    return cli(["run", args[0], "--root", str(root), *args[1:]])


def poison(folder: Path, tensor: str) -> None:
    """Set the first value of float32 ``tensor`` in ``model.safetensors`` to NaN."""
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    start = 8 + length + json.loads(data[8 : 8 + length])[tensor]["data_offsets"][0]
    data[start : start + 4] = np.array([np.nan], np.float32).tobytes()
    path.write_bytes(bytes(data))


def test_weights_with_nan_are_refused_naming_the_tensor(checkpoint: Path, cli: Cli, tmp_path: Path) -> None:
    folder = tmp_path / "nan"
    shutil.copytree(checkpoint, folder)
    poison(folder, "model.layers.1.mlp.down_proj.weight")
    code, err = hf(cli, tmp_path / "root", "hf/import", f"hf/source={folder}", "run/name=x")
    assert code == 2
    assert error_line(err) == (
        f"error: tensor 'model.layers.1.mlp.down_proj.weight' in {folder / 'model.safetensors'} holds NaN "
        "(1 of 1536 values); these weights are damaged, use an intact copy of the checkpoint "
        "(download or convert it again)"
    )
    runs = tmp_path / "root" / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_import_removes_abandoned_staging_and_export_keeps_user_folders(
    checkpoint: Path, cli: Cli, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    runs = root / "runs"
    abandoned = runs / ".x.importing-killed"  # an import SIGKILLed midway: its lock names a writer long gone
    abandoned.mkdir(parents=True)
    (abandoned / "lock").write_text(json.dumps({"host": platform.node(), "pid": 1, "since": "2020-01-01T00:00:00"}))
    active = runs / ".y.importing-active"  # an import being written now
    active.mkdir()
    lock = RunLock(active).acquire()
    try:
        code, err = hf(cli, root, "hf/import", f"hf/source={checkpoint}", "run/name=x")
        assert code == 0, err
        assert sorted(p.name for p in runs.iterdir()) == [".y.importing-active", "x"]
        assert (runs / "x" / "lock").read_text() == ""  # the import's own lock, let go
    finally:
        lock.release()
    out = tmp_path / "export"
    mine = tmp_path / "export.exporting"  # a user's folder whose name the export once used for staging
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    killed = tmp_path / ".other.exporting-killed"  # an export SIGKILLed midway: swept as imports' are
    killed.mkdir()
    (killed / "model.safetensors").write_bytes(b"partial")
    (killed / "lock").write_text(json.dumps({"host": platform.node(), "pid": 1, "since": "2020-01-01T00:00:00"}))
    code, err = hf(cli, root, "hf/export", "hf/run=x", f"hf/out={out}")
    assert code == 0, err
    assert (mine / "notes.txt").read_text() == "keep me"
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert not (out / "lock").exists()  # the staging folder's lock is not part of the export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "export.exporting", "root"]
