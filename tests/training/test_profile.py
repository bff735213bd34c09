"""``training/profile=START:STOP``: a jax.profiler trace of those updates in the run directory, each
update annotated, named by ``theseus runs show``; a malformed window is one line before any work."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from tests.conftest import run_cli

JOB_FILE = Path(__file__).with_name("cli_job.py")
TINY = ["architecture/vocab_size=257", "training/steps=4", "training/batch_size=4", "training/progress=false"]


def test_profile_window_writes_an_annotated_trace(tmp_path: Path) -> None:
    args = ["--load", str(JOB_FILE), "run", "test/tiny/train", "--root", str(tmp_path), *TINY]
    done = run_cli([*args, "training/profile=2:3", "training/eval_batches=0"], timeout=300)
    assert done.returncode == 0, done.stderr
    run = tmp_path / "runs" / "test-tiny-train"
    (session,) = (run / "profile" / "plugins" / "profile").iterdir()
    assert list(session.glob("*.xplane.pb"))  # TensorBoard's profile plugin reads these
    (perfetto,) = session.glob("perfetto_trace.json.gz")
    events = json.loads(gzip.decompress(perfetto.read_bytes()))["traceEvents"]
    steps = sorted(int(e["args"]["step_num"]) for e in events if e.get("name") == "train")
    assert steps == [2, 3]  # the window's updates, each its own step annotation

    shown = run_cli(["runs", "show", "test-tiny-train", "--root", str(tmp_path)])
    assert shown.returncode == 0, shown.stderr
    assert f"profile     1 trace(s), newest {session}" in shown.stdout


def test_malformed_profile_window_is_one_line(tmp_path: Path) -> None:
    for window, problem in (("2-3", "is not START:STOP"), ("3:2", "START must be at least 1 and at most STOP")):
        args = ["--load", str(JOB_FILE), "run", "test/tiny/train", "--root", str(tmp_path), *TINY]
        done = run_cli([*args, f"training/profile={window}"])
        assert done.returncode == 2
        assert done.stderr.startswith(f"error: training/profile={window!r}"), done.stderr
        assert problem in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
        assert not (tmp_path / "runs").exists()
