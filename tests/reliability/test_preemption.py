"""Preemption: SIGTERM (or a first Ctrl-C) mid-run checkpoints the step in progress and exits 75;
a second Ctrl-C aborts at once; the same command then resumes to the result of an uninterrupted run.

The signals are sent by the process itself at exact points of the loop (``THESEUS_TEST_KILL_AT``
with a signal name, see ``theseus.base.killpoints``); a checkpoint every 2 steps, 6 steps.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import clean_env
from tests.reliability.crash_job import HASHES
from tests.reliability.test_crash_resume import command, finish, metric_rows
from tests.training.conftest import write_byte_corpus
from theseus.training.preemption import EXIT_CODE

pytestmark = pytest.mark.slow

#: run name -> signals (``phase:step:SIGNAL``)
SIGNALS = {
    "term": "step:3:TERM",  # SIGTERM while update 3 runs: finish it, checkpoint 3 (written in the background)
    "ctrl-c-twice": "data:4:INT,step:4:INT",  # the second Ctrl-C comes before update 4 is finished
}
#: Keep every checkpoint; the double Ctrl-C run writes synchronously, so checkpoint 2 is committed.
EXTRA = {"term": ["training/keep_checkpoints=0"], "ctrl-c-twice": ["training/async_checkpoints=false"]}


def start(root: Path, name: str, kill_at: str | None = None) -> subprocess.Popen[str]:
    env = clean_env(
        JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    if kill_at:
        env["THESEUS_TEST_KILL_AT"] = kill_at
    args = [*command(root, name), *EXTRA.get(name, [])]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("preemption-root")
    write_byte_corpus(root, "corpus", documents=32)
    results: dict = {"root": root, "reference": finish(start(root, "reference"))}
    signalled = {name: start(root, name, kill_at) for name, kill_at in SIGNALS.items()}
    results["signalled"] = {name: finish(process) for name, process in signalled.items()}
    results["checkpoints"] = {
        name: sorted(int(p.name) for p in (root / "runs" / name / "checkpoints").iterdir() if p.name.isdigit())
        for name in SIGNALS
    }
    results["logged"] = {name: [row["step"] for row in metric_rows(root / "runs" / name)] for name in SIGNALS}
    results["status"] = {name: ended(root / "runs" / name) for name in SIGNALS}
    resumed = {name: start(root, name) for name in SIGNALS}
    results["resumed"] = {name: finish(process) for name, process in resumed.items()}
    return results


def ended(run: Path) -> tuple[str, int, str | None]:
    """How ``theseus runs`` lists the run: its status, step and error."""
    from theseus.tracking.runs import run_row

    row = run_row(run)
    return row.status, row.step, row.error


def same_as_reference(runs: dict, name: str) -> None:
    root = runs["root"]
    code, err = runs["reference"]
    assert code == 0, err
    reference = json.loads((root / "runs" / "reference" / HASHES).read_text())
    final = json.loads((root / "runs" / name / HASHES).read_text())
    assert final["step"] == 6
    assert final == reference  # parameters and optimizer state, sha256-identical
    assert metric_rows(root / "runs" / name) == metric_rows(root / "runs" / "reference")


def test_sigterm_checkpoints_the_step_in_progress_and_resumes_identically(runs: dict) -> None:
    code, err = runs["signalled"]["term"]
    assert code == EXIT_CODE, err
    assert "SIGTERM: finishing the current step and writing a checkpoint" in err
    last = err.strip().splitlines()[-1]
    found = re.fullmatch(
        r"SIGTERM: stopped at step 3/6 with a checkpoint ([0-9.]+) s after the signal; "
        r"run the same command to resume from step 3 \(run dir .*term\)",
        last,
    )
    assert found, last
    assert float(found.group(1)) < 60
    assert "Traceback" not in err and "error:" not in err
    assert runs["checkpoints"]["term"] == [2, 3]  # the interval checkpoint and the one at the signal
    assert runs["logged"]["term"] == [1, 2, 3]  # every finished update was logged, none after
    assert runs["status"]["term"][:2] == ("stopped", 3)  # theseus runs: stopped at step 3
    code, err = runs["resumed"]["term"]
    assert code == 0, err
    assert "resuming run 'term' from step 3" in err
    same_as_reference(runs, "term")


def test_a_second_ctrl_c_aborts_at_once_and_keeps_the_last_checkpoint(runs: dict) -> None:
    code, err = runs["signalled"]["ctrl-c-twice"]
    assert code == -signal.SIGINT, err  # ended by the signal itself, not by a clean exit
    assert "SIGINT: finishing the current step and writing a checkpoint; press Ctrl-C again" in err
    assert "stopped at step" not in err
    assert runs["checkpoints"]["ctrl-c-twice"] == [2]  # nothing written for the aborted step
    assert runs["status"]["ctrl-c-twice"][0] == "crashed"  # aborted at the operating-system level
    code, err = runs["resumed"]["ctrl-c-twice"]
    assert code == 0, err
    assert "resuming run 'ctrl-c-twice' from step 2" in err
    same_as_reference(runs, "ctrl-c-twice")


def test_guard_restores_the_previous_handlers() -> None:
    from theseus.training.preemption import PreemptionGuard

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with PreemptionGuard() as guard:
        assert signal.getsignal(signal.SIGTERM) == guard._handle
        assert guard.stop_step(5) is None  # nothing asked yet
        guard.request("SIGTERM")
        assert guard.stop_step(5) == 5 and guard.stops_at(5, 6) and not guard.stops_at(6, 6)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
