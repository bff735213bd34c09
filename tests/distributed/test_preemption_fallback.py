"""Two processes: a SIGTERM reaching one of them stops both at one agreed step with a checkpoint;
the newest checkpoint is then damaged, and the same two commands fall back to the previous one
and finish on the curve of an uninterrupted single-process run.

Process 1 alone gets SIGTERM while update 3 runs. It publishes a stop two updates later (see
``theseus.training.preemption``), so both processes checkpoint step 5 and exit 75. Checkpoint 5
is then cut short; the restart (two processes again) sets it aside, resumes from checkpoint 4
and trains to step 6. One process with one device trains the same job for comparison: the data
does not depend on the process count, so the losses agree to 1e-5.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_joined
from tests.distributed.settings import overrides
from tests.distributed.test_scale_out import HERE, env_with_devices, metrics
from tests.reliability.conftest import call_cli
from tests.reliability.test_bad_input import damage
from tests.training.conftest import write_byte_corpus
from theseus.training.preemption import EXIT_CODE

pytestmark = pytest.mark.slow

SETTINGS = overrides(
    training__steps=6,  # one step past the stop at 5: the restart trains from checkpoint 4 again
    training__checkpoint_interval=2,
    training__keep_checkpoints=0,
    training__async_checkpoints=True,
)


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


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("preempt-fallback")
    write_byte_corpus(root, "fineweb")
    write_byte_corpus(root, "chat", documents=48, seed=1)
    checkpoints = root / "runs" / "two" / "checkpoints"
    result: dict[str, Any] = {"root": root}
    result["preempted"] = two_processes(root, "two", {1: "step:3:TERM"})
    result["after_preemption"] = sorted(p.name for p in checkpoints.iterdir()) if checkpoints.is_dir() else []
    if (checkpoints / "5").is_dir():
        damage(checkpoints / "5")
    result["resumed"] = two_processes(root, "two", {})
    result["after_resume"] = sorted(p.name for p in checkpoints.iterdir())
    # the reference in this process (one device, the suite's XLA flags): a process of its own would only
    # import jax and theseus again
    assert call_cli(arguments(root, "one")) == 0
    return result


def test_sigterm_on_one_process_stops_both_at_one_step_with_a_checkpoint(runs: dict[str, Any]) -> None:
    (code0, err0), (code1, err1) = runs["preempted"]
    assert (code0, code1) == (EXIT_CODE, EXIT_CODE), err0[-3000:] + err1[-3000:]
    assert "SIGTERM: finishing the current step" in err1 and "SIGTERM: finishing" not in err0
    last0, last1 = err0.strip().splitlines()[-1], err1.strip().splitlines()[-1]
    assert re.match(r"SIGTERM \(on another process\): stopped at step 5/6 with a checkpoint [0-9.]+ s after", last0)
    assert re.match(r"SIGTERM: stopped at step 5/6 .*run the same command to resume from step 5", last1)
    assert runs["after_preemption"] == ["2", "4", "5"]


def test_two_processes_fall_back_from_a_damaged_latest_checkpoint(runs: dict[str, Any]) -> None:
    (code0, err0), (code1, err1) = runs["resumed"]
    assert (code0, code1) == (0, 0), err0[-3000:] + err1[-3000:]
    checkpoints = runs["root"] / "runs" / "two" / "checkpoints"
    warning = next(line for line in err0.splitlines() if line.startswith("warning: "))
    assert warning.startswith(f"warning: checkpoint '{checkpoints / '5'}' is damaged: ")
    assert warning.endswith(f"moved it to '{checkpoints / '5.corrupt'}' and resumed from step 4")
    assert "resuming run 'two' from step 4" in err0
    assert runs["after_resume"] == ["2", "4", "5.corrupt", "6"]
    rows = [row for row in metrics(runs["root"] / "runs" / "two") if row["split"] == "train"]
    reference = [row for row in metrics(runs["root"] / "runs" / "one") if row["split"] == "train"]
    assert [row["step"] for row in rows] == [row["step"] for row in reference] == list(range(1, 7))
    np.testing.assert_allclose([r["loss"] for r in rows], [r["loss"] for r in reference], rtol=1e-5, atol=0)
