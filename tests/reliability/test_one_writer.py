"""One writer per run: while a process holds a run, a second ``theseus run`` of it exits 2 in one line
naming the holder, and nothing of the run is read or changed; the lock goes with its process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli

JOB_FILE = Path(__file__).parents[1] / "training" / "cli_job.py"
HOLD = """
import sys, time
from pathlib import Path
from theseus.runs.lock import RunLock
RunLock(Path(sys.argv[1])).acquire()
print("held", flush=True)
time.sleep(120)
"""


def test_a_second_writer_is_refused_while_the_first_holds_the_run(tmp_path: Path) -> None:
    run = tmp_path / "runs" / "t"
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    metrics.write_text('{"step": 1, "split": "train", "loss": 1.0}\\n')
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True, env=clean_env()
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        args = ["--load", str(JOB_FILE), "run", "test/tiny/train", "run/name=t", "--root", str(tmp_path)]
        done = run_cli([*args, "architecture/vocab_size=257", "training/steps=2", "training/progress=false"])
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip()
        assert line.count("\\n") == 0 and "Traceback" not in line, done.stderr
        assert line.startswith(f"error: run 't' is being written by process {holder.pid} on "), line
        assert line.endswith("or give this one another run/name")
        assert metrics.read_text() == '{"step": 1, "split": "train", "loss": 1.0}\\n'  # untouched
        assert json.loads((run / "lock").read_text())["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the killed holder's lock: the run trains
    done = run_cli([*args, "architecture/vocab_size=257", "training/steps=2", "training/progress=false"])
    assert done.returncode == 0, done.stderr


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_kept(tmp_path: Path) -> None:
    victim, other = tmp_path / "victim.txt", tmp_path / "other.txt"
    victim.write_text("precious\n")
    other.write_text("also precious\n")
    args = ["--load", str(JOB_FILE), "run", "test/tiny/train", "--root", str(tmp_path)]
    options = ["architecture/vocab_size=257", "training/steps=2", "training/progress=false"]
    for name, make in (("soft", lambda lock: lock.symlink_to(victim)), ("hard", lambda lock: lock.hardlink_to(other))):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        make(run / "lock")
        done = run_cli([*args, f"run/name={name}", *options])
        assert done.returncode == 2, done.stderr
        line = done.stderr.strip()
        assert line.count("\n") == 0 and "Traceback" not in line, done.stderr
        assert line.startswith(f"error: the run's lock file {run / 'lock'} is a ")
        assert line.endswith("and run again")
    assert victim.read_text() == "precious\n" and other.read_text() == "also precious\n"


def test_a_writer_that_opened_a_removed_lock_file_takes_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start that fails before writing a record removes its lock file (:meth:`RunLock.discard`); a writer
    that opened the file before it went must not hold the removed file while another holds the new one."""
    from theseus.runs import lock

    first = lock.RunLock(tmp_path).acquire()
    stale = os.open(tmp_path / lock.LOCK_FILE, os.O_RDWR)  # opened before the file is removed
    first.discard()
    assert not (tmp_path / lock.LOCK_FILE).exists()
    opened = iter([stale])
    monkeypatch.setattr(lock, "_open_own", lambda path, real=lock._open_own: next(opened, None) or real(path))
    second = lock.RunLock(tmp_path).acquire()
    assert second._fd is not None
    assert os.fstat(second._fd).st_ino == (tmp_path / lock.LOCK_FILE).stat().st_ino
    second.release()
