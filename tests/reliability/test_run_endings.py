"""How runs ended, as ``status.json`` records it and ``theseus runs`` prints it: ``completed``, ``stopped at
step N`` (a signal, during set-up too), ``failed: <the one line>`` and ``crashed``; records written before
these names still list. The staging folders of killed exports are swept as killed imports' are.

Runs that fail or are signalled mid-training are checked where they already run
(``test_bad_input.py``, ``test_crash_resume.py``).
"""

from __future__ import annotations

import json
import platform
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import call_cli, train_args

Cli = Callable[[list[str]], tuple[int, str]]
RUN = "test-reliability-train"


def listed(cli: Cli, capsys: pytest.CaptureFixture[str], root: Path, *args: str) -> str:
    """What ``theseus runs ARGS --root ROOT`` printed."""
    capsys.readouterr()
    code = call_cli(["runs", *args, "--root", str(root)])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize(("name", "code"), [("TERM", 75), ("INT", 130)])
def test_a_signal_during_set_up_stops_the_run_at_step_0(
    cli: Cli, root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, code: int
) -> None:
    # Ctrl-C as in a terminal, whatever this test process's earlier tests or its runner left for SIGINT
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
        monkeypatch.setenv("THESEUS_TEST_KILL_AT", f"setup:0:{name}")  # after its records, before anything compiles
        exit_code, err = cli(train_args(root))
        assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert exit_code == code, err
    assert "Traceback" not in err
    last = err.strip().splitlines()[-1]
    if name == "TERM":
        assert last == "SIGTERM: stopped during set-up, before the first update; run the same command to continue"
    else:
        assert last == "aborted"  # Ctrl-C, as click reports it
    record = json.loads((root / "runs" / RUN / "status.json").read_text())
    assert (record["state"], record["step"], record["error"], record["total_steps"]) == ("stopped", 0, None, 6)
    [row] = json.loads(listed(cli, capsys, root, "--json"))
    assert (row["status"], row["step"], row["error"]) == ("stopped", 0, None)
    assert "stopped at step 0" in listed(cli, capsys, root)


def _status(run: Path, **fields: object) -> None:
    run.mkdir(parents=True)
    record = {"run": run.name, "job": "train/pretrain", "total_steps": 8, "pid": 1, "host": "elsewhere", **fields}
    (run / "status.json").write_text(json.dumps(record))


def test_every_ending_is_listed_and_shown(
    cli: Cli, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = tmp_path / "runs"
    line = "non-finite loss (nan) at step 3; lower training/lr and run again to resume from step 2" + " x" * 20
    _status(runs / "done", state="completed", step=8)
    _status(runs / "old", state="complete", step=8)  # written before "completed"
    _status(runs / "halted", state="stopped", step=4, checkpoint=4)
    _status(runs / "bad", state="failed", step=3, error=line)
    _status(runs / "broke", state="crashed", step=2, error="ValueError: what nothing caught")
    _status(runs / "lost", state="running", step=5, updated=0.0)  # its process is gone
    _status(runs / "older-crash", state="crashed", step=1, error="DataError: as records said before")
    rows = {r["name"]: r for r in json.loads(listed(cli, capsys, tmp_path, "--json"))}
    assert {name: (r["status"], r["error"]) for name, r in rows.items()} == {
        "done": ("completed", None),
        "old": ("completed", None),
        "halted": ("stopped", None),
        "bad": ("failed", line),
        "broke": ("crashed", "ValueError: what nothing caught"),
        "lost": ("crashed", None),
        "older-crash": ("crashed", "DataError: as records said before"),
    }
    table = {row.split()[0]: row for row in listed(cli, capsys, tmp_path).splitlines()[1:]}
    assert " completed " in table["done"] and " completed " in table["old"]
    assert " stopped at step 4 " in table["halted"]
    assert f" failed: {line[:49]}... " in table["bad"]  # the table keeps the status column 60 wide
    assert [r["name"] for r in json.loads(listed(cli, capsys, tmp_path, "--json", "--status", "failed"))] == ["bad"]

    shown = listed(cli, capsys, tmp_path, "show", "bad").splitlines()
    assert f"status      failed: {line}" in shown
    assert not any(s.startswith("error ") for s in shown)  # the line is said once
    shown = listed(cli, capsys, tmp_path, "show", "broke").splitlines()
    assert "status      crashed" in shown and "error       ValueError: what nothing caught" in shown


def test_how_an_exception_ends_a_run() -> None:
    from theseus.errors import DataError
    from theseus.tracking.status import ending
    from theseus.training.preemption import Interrupted, Preempted

    preempted = Preempted("SIGTERM: stopped", step=3, signal_name="SIGTERM", seconds=0.1)
    assert ending(preempted) == ("stopped", None)
    assert ending(Interrupted("SIGTERM: stopped during set-up")) == ("stopped", None)
    assert ending(KeyboardInterrupt()) == ("stopped", None)
    assert ending(DataError("shard 3 is truncated; prepare the data again\nerror: and more")) == (
        "failed",
        "shard 3 is truncated; prepare the data again",
    )
    assert ending(ZeroDivisionError("division by zero")) == ("crashed", "ZeroDivisionError: division by zero")


def test_a_failure_in_set_up_after_the_records_are_written_is_recorded(tmp_path: Path) -> None:
    from theseus.errors import ResourceError
    from theseus.tracking.status import read_status, record_ending

    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    error = ResourceError("out of memory running train/pretrain (MemoryError: ); use less memory per step with x")
    record_ending(run, error, run="r", job="train/pretrain", total_steps=10)
    record = read_status(run) or {}
    assert (record["state"], record["error"], record["step"], record["total_steps"]) == (
        "failed",
        str(error),
        0,
        10,
    )
    previous = {**record, "state": "stopped", "step": 4, "checkpoint": 4, "error": None}
    (run / "status.json").write_text(json.dumps(previous))
    record_ending(run, KeyboardInterrupt(), run="r", job="train/pretrain", total_steps=10)
    record = read_status(run) or {}
    assert (record["state"], record["step"], record["checkpoint"]) == ("stopped", 4, 4)  # kept where it was


# -- hf/export staging folders ----------------------------------------------------------------------


def _killed_staging(parent: Path, name: str) -> Path:
    """A staging folder as an export killed midway leaves it: files, and a lock file naming a writer
    that no longer holds it (the kernel lets go of a killed process's lock)."""
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "lock").write_text(json.dumps({"host": platform.node(), "pid": 999999, "since": "2024-01-01"}))
    return folder


def test_staging_folders_of_killed_exports_are_swept(tmp_path: Path) -> None:
    from theseus.model.huggingface.exporter import staged_folder
    from theseus.runs.lock import RunLock

    killed = _killed_staging(tmp_path, ".first.exporting-0a1b2c")
    other = _killed_staging(tmp_path, ".second.exporting-3d4e5f")
    live = tmp_path / ".third.exporting-6a7b8c"  # being written by a process that is alive
    live.mkdir()
    lock = RunLock(live).acquire()
    kept = tmp_path / ".notes.exporting-but-not-ours.txt"
    kept.write_text("a file, not a staging folder")
    try:
        with staged_folder(tmp_path / "export") as staging:
            assert (staging / "lock").is_file()  # held while the export is written
            (staging / "config.json").write_text("{}")
    finally:
        lock.release()
    assert not killed.exists() and not other.exists()
    assert live.is_dir() and kept.is_file()
    assert sorted(p.name for p in (tmp_path / "export").iterdir()) == ["config.json"]  # no lock file in it


def test_a_failed_export_leaves_no_staging_folder(tmp_path: Path) -> None:
    from theseus.model.huggingface.exporter import staged_folder

    with pytest.raises(OSError), staged_folder(tmp_path / "export"):
        raise OSError(28, "No space left on device")
    assert list(tmp_path.iterdir()) == []
