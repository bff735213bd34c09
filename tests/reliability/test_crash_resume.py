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
    "training/peak_flops=1e12",
]
#: kill point -> (checkpoints the restart may resume from, last metrics step the killed run wrote)
KILLS = {"data:3": ({2, 0}, 2), "step:5": ({4, 2}, 4), "save:4": ({2}, 4)}


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


def start(root: Path, name: str, kill_at: str | None = None) -> subprocess.Popen[str]:
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
    return subprocess.Popen(command(root, name), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


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
    """The uninterrupted run, then the killed runs side by side, then their restarts side by side."""
    root = tmp_path_factory.mktemp("crash-root")
    write_byte_corpus(root, "corpus", documents=32)
    results: dict = {"root": root, "reference": finish(start(root, "reference"))}
    results.update(killed={}, restarted={}, after_kill={})
    killed = {kill_at: start(root, name_of(kill_at), kill_at) for kill_at in KILLS}
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
    restarted = {kill_at: start(root, name_of(kill_at)) for kill_at in KILLS}
    for kill_at, process in restarted.items():
        results["restarted"][kill_at] = finish(process)
    return results


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
