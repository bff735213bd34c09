"""Two processes through SIGTERM, a damaged checkpoint and SIGKILL: the same two commands run again after
each, and the run ends with the metrics of an uninterrupted run, bit for bit. The uninterrupted run is one
process holding both devices: the global batch of a step and every reduction over two devices are the same
whatever the process count, so the floats are too (one process start instead of two).

The cycles (8 steps, a checkpoint every 2 written in the background, all kept):

1. SIGTERM on process 1 alone while update 3 runs. It publishes a stop two updates later (see
   ``theseus.training.preemption``), so both processes checkpoint step 5 and exit 75. Checkpoint 5
   is then cut short.
2. The restart sets checkpoint 5 aside, resumes from checkpoint 4, and process 0 is SIGKILLed while
   update 7 runs; the other process is killed with it (as ``srun --kill-on-bad-exit`` does).
3. The restart resumes from the newest committed checkpoint (6, or 4 if 6 was not yet committed by
   the background save) and trains to step 8.

After every cycle each committed checkpoint matches its checksum manifest. ``benchmarks/soak.py`` runs
the same under a real launcher for many cycles at random points.
"""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, run_cli, run_joined
from tests.distributed.settings import overrides
from tests.distributed.test_scale_out import HERE, env_with_devices, metrics
from tests.reliability.test_bad_input import damage
from tests.training.conftest import write_byte_corpus
from theseus.checkpoint import integrity
from theseus.training.preemption import EXIT_CODE

pytestmark = pytest.mark.slow

SETTINGS = overrides(
    training__steps=8,
    training__checkpoint_interval=2,
    training__keep_checkpoints=0,
    training__async_checkpoints=True,
)
#: Fields of a metrics row that depend on wall time, not on the computation.
TIMING = {"tokens_per_sec", "step_time", "mfu"}


def arguments(root: Path, name: str) -> list[str]:
    return [
        *("--load", str(HERE / "jobs.py")),
        *("run", "test/distributed/gpt-plain", *SETTINGS, f"run/name={name}", "--root", str(root)),
    ]


def two_processes(root: Path, name: str, kill_at: dict[int, str]) -> list[tuple[int, str]]:
    def env(index: int) -> dict[str, str]:
        values = env_with_devices(1)
        if index in kill_at:
            values["THESEUS_TEST_KILL_AT"] = kill_at[index]
        return values

    return [(done.returncode, done.stderr) for done in run_joined(arguments(root, name), env=env)]


def checkpoints_found(folder: Path) -> dict[str, str | None]:
    """Every entry of a checkpoints folder; for a committed checkpoint, what is wrong with it (None: it verifies)."""
    if not folder.is_dir():
        return {}
    found: dict[str, str | None] = {}
    for entry in sorted(folder.iterdir()):
        if entry.name.isdigit():
            state = entry / "state"
            found[entry.name] = integrity.damage(state) if integrity.has_manifest(state) else "no manifest"
        else:
            found[entry.name] = "not committed"
    return found


def timeless(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if k not in TIMING} for row in rows]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("preempt-fallback")
    write_byte_corpus(root, "fineweb")
    write_byte_corpus(root, "chat", documents=48, seed=1)
    checkpoints = root / "runs" / "two" / "checkpoints"
    reference = run_cli(arguments(root, "reference"), env=env_with_devices(2), cwd=REPO, timeout=300)
    result: dict[str, Any] = {"root": root, "reference": (reference.returncode, reference.stderr)}
    result["preempted"] = two_processes(root, "two", {1: "step:3:TERM"})
    result["after_preemption"] = checkpoints_found(checkpoints)
    if (checkpoints / "5").is_dir():
        damage(checkpoints / "5")
    result["killed"] = two_processes(root, "two", {0: "step:7"})
    result["after_kill"] = checkpoints_found(checkpoints)
    result["resumed"] = two_processes(root, "two", {})
    result["after_resume"] = checkpoints_found(checkpoints)
    return result


def test_sigterm_on_one_process_stops_both_at_one_step_with_a_checkpoint(runs: dict[str, Any]) -> None:
    (code0, err0), (code1, err1) = runs["preempted"]
    assert (code0, code1) == (EXIT_CODE, EXIT_CODE), err0[-3000:] + err1[-3000:]
    assert "SIGTERM: finishing the current step" in err1 and "SIGTERM: finishing" not in err0
    last0, last1 = err0.strip().splitlines()[-1], err1.strip().splitlines()[-1]
    assert re.match(r"SIGTERM \(on another process\): stopped at step 5/8 with a checkpoint [0-9.]+ s after", last0)
    assert re.match(r"SIGTERM: stopped at step 5/8 .*run the same command to resume from step 5", last1)
    assert runs["after_preemption"] == {"2": None, "4": None, "5": None}  # all three verify


def test_two_processes_fall_back_from_a_damaged_latest_checkpoint(runs: dict[str, Any]) -> None:
    (_code0, err0), _ = runs["killed"]
    checkpoints = runs["root"] / "runs" / "two" / "checkpoints"
    warning = next(line for line in err0.splitlines() if line.startswith("warning: "))
    assert warning.startswith(f"warning: checkpoint '{checkpoints / '5'}' is damaged: ")
    assert warning.endswith(f"moved it to '{checkpoints / '5.corrupt'}' and resumed from step 4")
    assert "resuming run 'two' from step 4" in err0
    assert "step 6/8" in err0  # it trained on before the kill


def test_sigkill_of_one_process_ends_both_and_leaves_only_verified_checkpoints(runs: dict[str, Any]) -> None:
    (code0, err0), (code1, _err1) = runs["killed"]
    assert code0 == -signal.SIGKILL, err0[-3000:]
    assert code1 != 0  # ended with it, by the harness or by JAX's distributed runtime
    assert "step 7/8" not in err0  # killed before update 7 was logged
    committed = {name: problem for name, problem in runs["after_kill"].items() if problem != "not committed"}
    assert committed in ({"2": None, "4": None}, {"2": None, "4": None, "6": None})  # 6: if its save committed
    assert "5.corrupt" in runs["after_kill"]


def test_the_resumed_run_ends_with_the_metrics_of_an_uninterrupted_run_bit_for_bit(runs: dict[str, Any]) -> None:
    (code0, err0), (code1, err1) = runs["resumed"]
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    newest = "6" if runs["after_kill"].get("6") is None and "6" in runs["after_kill"] else "4"
    assert f"resuming run 'two' from step {newest}" in err0
    assert all(problem is None for name, problem in runs["after_resume"].items() if name != "5.corrupt")
    assert {"2", "4", "6", "8"} <= set(runs["after_resume"])
    root = runs["root"]
    code, err = runs["reference"]
    assert code == 0, err[-3000:]
    rows, reference = timeless(metrics(root / "runs" / "two")), timeless(metrics(root / "runs" / "reference"))
    assert [row["step"] for row in rows if row["split"] == "train"] == list(range(1, 9))
    assert rows == reference  # losses, gradient norms and learning rates: the same floats
