"""Start-up costs: ``theseus jobs`` wall time and the time from a fresh process to the first training step.

``time_to_first_step`` starts a new interpreter that imports the trainer, builds the tiny GPT, and runs
``trainer.run()`` (run directory, state initialisation, compilation, the first update); the time from
spawning the process to the first update's completion is reported. ``theseus_jobs_seconds`` runs the
``theseus jobs`` command several times.

Run ``python benchmarks/first_step.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO

SPAWN_ENV = "THESEUS_BENCHMARK_SPAWNED_AT"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def theseus_command() -> list[str]:
    """The installed ``theseus`` console script next to this interpreter (or ``python -m theseus.cli.main``)."""
    script = Path(sys.executable).parent / "theseus"
    if script.exists():
        return [str(script)]
    found = shutil.which("theseus")
    return [found] if found else [sys.executable, "-m", "theseus.cli.main"]


def theseus_jobs_seconds(repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``theseus jobs`` run as a subprocess."""
    command = [*theseus_command(), "jobs"]
    times = []
    for index in range(warmup + repeats):
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, env=_env(), timeout=120)
        elapsed = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"'theseus jobs' failed ({done.returncode}): {done.stderr.strip()[-300:]}")
        if index >= warmup:
            times.append(elapsed)
    return statistics.median(times)


def time_to_first_step(
    preset: str = "tiny", batch: int = 8, seq: int = 256, *, overrides: dict | None = None, timeout: float = 600
) -> float:
    """Seconds from spawning a fresh interpreter to the completion of its first training update.

    ``overrides``: further configuration values of the model (e.g. ``{"architecture/n_layers": 1}``).
    """
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env[SPAWN_ENV] = repr(time.time())
    command = [
        sys.executable,
        "-m",
        "benchmarks.first_step",
        "--child",
        preset,
        str(batch),
        str(seq),
        json.dumps(overrides or {}),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"first-step process failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return float(json.loads(lines[-1])["first_step_seconds"])


class _FirstStepDone(Exception):
    pass


def _child(preset: str, batch: int, seq: int, overrides: dict) -> None:
    """In the fresh process: train until the first update is complete, then report."""
    spawned = float(os.environ[SPAWN_ENV])
    from benchmarks.bare_loop import trainer_class, trainer_overrides
    from benchmarks.workload import Workload

    work = Workload.create(preset, batch=batch, seq=seq, overrides=overrides)
    calls: list[float] = []

    class FirstStep(trainer_class(work)):  # type: ignore[misc]
        def batch(self, slice: str = "train") -> dict:
            if slice == "train":
                calls.append(time.time())
                # The loop fetches update 1's results before asking for batch 3.
                if len(calls) == 3:
                    raise _FirstStepDone
            return super().batch(slice)

    with tempfile.TemporaryDirectory() as tmp, contextlib.suppress(_FirstStepDone):
        FirstStep.create(tmp, trainer_overrides(work)).run()
    if len(calls) < 3:
        raise RuntimeError("the training loop ended before its first update completed")
    print(json.dumps({"first_step_seconds": calls[2] - spawned}))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1], int(argv[2]), int(argv[3]), json.loads(argv[4]) if len(argv) > 4 else {})
        return
    print(f"theseus jobs: {theseus_jobs_seconds():.3f} s (median of 5)")
    print(f"time to first step (tiny, 8x256): {time_to_first_step():.2f} s")


if __name__ == "__main__":
    main()
