"""Command start-up: ``theseus jobs`` wall time, and the helpers other benchmarks use to run ``theseus``.

``theseus_jobs_seconds`` runs the ``theseus jobs`` command several times. The time from a fresh
process to the first training step, phase by phase, is measured by ``benchmarks/startup.py``.

Run ``python benchmarks/first_step.py``.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def main() -> None:
    print(f"theseus jobs: {theseus_jobs_seconds():.3f} s (median of 5)")
    print("time to the first training step, phase by phase: python benchmarks/startup.py")


if __name__ == "__main__":
    main()
