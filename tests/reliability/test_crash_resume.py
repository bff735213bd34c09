"""SIGKILL a training run at chosen phases, run the same command again, and compare with an uninterrupted run.

The matrix (6 steps, a checkpoint every 2, keep 1, validation at 4 and 6, dropout on):

=========  ==========================================  ===========================
kill at    where the process dies                      the restart resumes from
=========  ==========================================  ===========================
data:3     batch 3 read, not yet used                  step 2 (0 if 2 was not committed)
step:5     update 5 dispatched, nothing fetched        step 4 (2 if 4 was not committed)
save:4     checkpoint 4 being written by orbax         step 2 (4's temporary directory is discarded)
=========  ==========================================  ===========================

Each restarted run ends with parameters and optimizer state bit-identical to the uninterrupted
run, and the same ``metrics.jsonl`` (timing fields aside).

Preemption, beside the kills and against the same uninterrupted run: SIGTERM (or a first Ctrl-C) mid-run
checkpoints the step in progress and exits 75; a second Ctrl-C aborts at once; the same command then
resumes to the result of the uninterrupted run. The signals are sent by the process itself at exact
points of the loop (``THESEUS_TEST_KILL_AT`` with a signal name, see ``theseus.base.killpoints``).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import FAST_COMPILE, clean_env, xla_flags
from tests.reliability.crash_job import HASHES
from tests.training.conftest import write_byte_corpus
from theseus.tracking.runs import run_row
from theseus.training.preemption import EXIT_CODE

JOB_FILE = Path(__file__).with_name("crash_job.py")
TIMING = {"tokens_per_sec", "mfu", "step_time"}
SETTINGS = [
    "architecture/vocab_size=257",
    "architecture/width=16",
    "architecture/dropout=0.1",
    "training/steps=6",
    "training/batch_size=4",
    "training/log_interval=1",
    "training/eval_interval=4",
    "training/eval_batches=1",
    "training/checkpoint_interval=2",
    "training/keep_checkpoints=1",
    "training/progress=false",
    "training/plots=false",
    "training/peak_flops=1e12",
]
#: kill point -> (checkpoints the restart may resume from, last metrics step the killed run wrote)
KILLS = {"data:3": ({2, 0}, 2), "step:5": ({4, 2}, 4), "save:4": ({2}, 4)}
#: run name -> signals (``phase:step:SIGNAL``)
SIGNALS = {
    "term": "step:3:TERM",  # SIGTERM while update 3 runs: finish it, checkpoint 3 (written in the background)
    "ctrl-c-twice": "data:4:INT,step:4:INT",  # the second Ctrl-C comes before update 4 is finished
}
#: Keep every checkpoint; the double Ctrl-C run writes synchronously, so checkpoint 2 is committed.
EXTRA = {"term": ["training/keep_checkpoints=0"], "ctrl-c-twice": ["training/async_checkpoints=false"]}


def command(root: Path, name: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "theseus.cli.main",
        "--load",
        str(JOB_FILE),
        "run",
        "test/reliability/crash",
        "--root",
        str(root),
        f"run/name={name}",
        *SETTINGS,
    ]


def start(root: Path, name: str, kill_at: str | None = None, extra: list[str] | None = None) -> subprocess.Popen[str]:
    # One compilation cache for all runs: the first run compiles, the others load the same executables.
    # XLA's default optimisation level, as a user's run compiles: bit-exact resume is checked on that build.
    env = clean_env(
        XLA_FLAGS=xla_flags(production=True),
        JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
    )
    if kill_at:
        env["THESEUS_TEST_KILL_AT"] = kill_at
    args = [*command(root, name), *(extra or [])]
    return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    _out, err = process.communicate(timeout=300)
    return process.returncode, err


def metric_rows(run: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


def name_of(kill_at: str) -> str:
    return "kill-" + kill_at.replace(":", "-")


def test_the_resume_runs_compile_at_xla_default_level() -> None:
    """The suite compiles at level 0 (tests/conftest.py); bit-exact resumption is checked on a user's build."""
    original = os.environ["TESTS_ORIGINAL_XLA_FLAGS"]  # what the suite was started with
    assert xla_flags(production=True) == original
    if "xla_backend_optimization_level" not in original:
        assert FAST_COMPILE in os.environ["XLA_FLAGS"] and FAST_COMPILE not in original


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The uninterrupted run, then the killed and signalled runs side by side, then their restarts side by side."""
    root = tmp_path_factory.mktemp("crash-root")
    write_byte_corpus(root, "corpus", documents=32)
    results: dict = {"root": root, "reference": finish(start(root, "reference"))}
    results.update(killed={}, restarted={}, after_kill={})
    killed = {kill_at: start(root, name_of(kill_at), kill_at) for kill_at in KILLS}
    signalled = {name: start(root, name, kill_at, EXTRA[name]) for name, kill_at in SIGNALS.items()}
    results["signalled"] = {name: finish(process) for name, process in signalled.items()}
    for kill_at, process in killed.items():
        results["killed"][kill_at] = finish(process)
        run = root / "runs" / name_of(kill_at)
        checkpoints = run / "checkpoints"
        results["after_kill"][kill_at] = {
            "entries": sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else [],
            "metrics": metric_rows(run) if (run / "metrics.jsonl").exists() else [],
            "finished": (run / HASHES).exists(),
            "status": run_row(run).status if run.is_dir() else None,
        }
        if kill_at == "save:4":
            results["save_restored"] = restore_committed(checkpoints)
    results["checkpoints"] = {
        name: sorted(int(p.name) for p in (root / "runs" / name / "checkpoints").iterdir() if p.name.isdigit())
        for name in SIGNALS
    }
    results["logged"] = {name: [row["step"] for row in metric_rows(root / "runs" / name)] for name in SIGNALS}
    results["status"] = {name: ended(root / "runs" / name) for name in SIGNALS}
    restarted = {kill_at: start(root, name_of(kill_at)) for kill_at in KILLS}
    resumed = {name: start(root, name, extra=EXTRA[name]) for name in SIGNALS}
    for kill_at, process in restarted.items():
        results["restarted"][kill_at] = finish(process)
    results["resumed"] = {name: finish(process) for name, process in resumed.items()}
    return results


def ended(run: Path) -> tuple[str, int, str | None]:
    """How ``theseus runs`` lists the run: its status, step and error."""
    row = run_row(run)
    return row.status, row.step, row.error


def restore_committed(checkpoints: Path) -> tuple[list[int], int, list[str]]:
    """Open the checkpoints left by a kill during a save the way a restart does; load the latest one."""
    import orbax.checkpoint as ocp

    from theseus.checkpoint import CheckpointStore
    from theseus.checkpoint.store import META, STATE, ChecksummedRestore

    store = CheckpointStore(checkpoints, keep=1, async_save=False)
    try:
        steps = store.steps()
        latest = store.latest_step()
        restored = store.manager.restore(
            latest, args=ocp.args.Composite(**{STATE: ChecksummedRestore(), META: ocp.args.JsonRestore()})
        )
        return steps, int(restored[META]["step"]), sorted(restored[STATE]["params"])
    finally:
        store.close()


def test_reference_run_completes(runs: dict) -> None:
    code, err = runs["reference"]
    assert code == 0, err
    final = json.loads((runs["root"] / "runs" / "reference" / HASHES).read_text())
    assert final["step"] == 6


@pytest.mark.parametrize("kill_at", list(KILLS))
def test_killed_run_resumes_bit_identical(runs: dict, kill_at: str) -> None:
    root, name = runs["root"], name_of(kill_at)
    resumable, last_logged = KILLS[kill_at]
    code, err = runs["killed"][kill_at]
    assert code == -signal.SIGKILL, err
    after = runs["after_kill"][kill_at]
    # the kill happened where it was asked for: nothing after that update was logged
    assert max(row["step"] for row in after["metrics"]) == last_logged
    assert not after["finished"]
    assert after["status"] == "crashed"  # a SIGKILL: nothing could record how it ended

    code, err = runs["restarted"][kill_at]
    assert code == 0, err
    found = re.search(r"resuming run '[^']+' from step (\d+)", err)
    resumed_from = int(found.group(1)) if found else 0
    assert resumed_from in resumable, err

    reference = json.loads((root / "runs" / "reference" / HASHES).read_text())
    final = json.loads((root / "runs" / name / HASHES).read_text())
    assert final == reference  # step, parameters and optimizer state, bit for bit
    assert metric_rows(root / "runs" / name) == metric_rows(root / "runs" / "reference")


def test_kill_during_save_keeps_the_previous_checkpoint(runs: dict) -> None:
    entries = runs["after_kill"]["save:4"]["entries"]
    # killed while orbax was writing checkpoint 4: its temporary directory, never a committed "4"
    assert "2" in entries and "4" not in entries, entries
    assert any(entry.startswith("4.") and "tmp" in entry for entry in entries), entries
    steps, meta_step, params = runs["save_restored"]
    assert steps == [2] and meta_step == 2
    assert {"embed", "position", "lm_head"} <= set(params)
    checkpoints = runs["root"] / "runs" / name_of("save:4") / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir() if "tmp" in p.name) == []  # debris removed on restart


def same_as_reference(runs: dict, name: str) -> None:
    root = runs["root"]
    code, err = runs["reference"]
    assert code == 0, err
    reference = json.loads((root / "runs" / "reference" / HASHES).read_text())
    final = json.loads((root / "runs" / name / HASHES).read_text())
    assert final["step"] == 6
    assert final == reference  # parameters and optimizer state, sha256-identical
    assert metric_rows(root / "runs" / name) == metric_rows(root / "runs" / "reference")


@pytest.mark.slow
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


@pytest.mark.slow
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
