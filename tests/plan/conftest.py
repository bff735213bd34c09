"""Compiling for accelerators this machine does not have: the compilers live in ``<repo>/.compilers``
(``pip install --target .compilers -r requirements-compilers.txt``, as the README's test command does),
on the path of the subprocesses that compile only, so the rest of the suite runs without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, clean_env, xla_flags

COMPILERS = REPO / ".compilers"
RUNNER = Path(__file__).with_name("matrix_run.py")
INSTALL = "python -m pip install --target .compilers -r requirements-compilers.txt"


def compilers() -> Path:
    """The compilers' folder; without it the test fails in CI and is skipped elsewhere, naming the install."""
    if not (COMPILERS / "jax_plugins").is_dir():
        message = f"the accelerator compilers are not installed; run: {INSTALL}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return COMPILERS


def compiler_env(**extra: str) -> dict[str, str]:
    """The environment of a process that compiles for accelerators: the compilers on its path."""
    path = os.pathsep.join(p for p in (str(compilers()), os.environ.get("PYTHONPATH", "")) if p)
    return clean_env(PYTHONPATH=path, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(), **extra)


def compile_cases(target: str, cases: list[dict[str, Any]], timeout: float = 900) -> list[dict[str, Any]]:
    """What ``theseus plan`` reports for each case (``{"job", "overrides"}`` or ``{"generate": ...}``),
    compiled in one process; each result holds ``plan`` or ``error``."""
    done = subprocess.run(
        [sys.executable, str(RUNNER), target, json.dumps(cases)],
        capture_output=True,
        text=True,
        env=compiler_env(),
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), done.stderr[-3000:]
    return results


def tiny(model: str, layout: str, *extra: str, job: str = "train/pretrain") -> dict[str, Any]:
    """A case: ``model``'s tiny preset in ``layout`` on 8 devices (tp over 2, ep over 2)."""
    overrides = [f"model={model}", "architecture/preset=tiny", "training/batch_size=8", "training/sequence_length=64"]
    overrides.append(f"mesh/layout={layout}")
    if "tp" in layout:
        overrides.append("mesh/model=2")
    if "ep" in layout:
        overrides.append("mesh/expert=2")
    return {"job": job, "overrides": [*overrides, *extra]}
