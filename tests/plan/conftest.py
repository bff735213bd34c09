"""Compiling for accelerators this machine does not have: the compilers live in ``<repo>/.compilers``
(``pip install --target .compilers -r requirements-compilers.txt``, as the README's test command does),
on the path of the subprocesses that compile only, so the rest of the suite runs without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping
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


#: Layers of a compiled case: two show every repeated-layer effect (collectives per layer, a dense and a
#: mixture layer) and compile in about half the time of the tiny presets' four.
CASE_LAYERS = 2
#: Layer patterns of families whose layers differ, two layers deep: Gemma 3's five sliding layers and a full
#: one as one of each (its six layers took 8.4 s of test_compile_steps.py's 61 s of compiles).
LAYER_TYPES = {"gemma3": "[sliding_attention,full_attention]"}


def tiny(model: str, layout: str, *extra: str, job: str = "train/pretrain") -> dict[str, Any]:
    """A case: ``model``'s tiny preset, :data:`CASE_LAYERS` deep, in ``layout`` on 8 devices (tp over 2,
    ep over 2)."""
    overrides = [f"model={model}", "architecture/preset=tiny", f"architecture/n_layers={CASE_LAYERS}"]
    overrides += ["training/batch_size=8", "training/sequence_length=64"]
    if model in LAYER_TYPES:
        overrides.append(f"architecture/layer_types={LAYER_TYPES[model]}")
    overrides.append(f"mesh/layout={layout}")
    if "tp" in layout:
        overrides.append("mesh/model=2")
    if "ep" in layout:
        overrides.append("mesh/expert=2")
    return {"job": job, "overrides": [*overrides, *extra]}


def state_only(case: dict[str, Any]) -> dict[str, Any]:
    """``case`` reporting only the state bytes per device (``plan["state_bytes"]``), not compiled: the
    replicated reference a sharded layout's state is compared with."""
    return {**case, "state_only": True}


def layout_cases(
    families: tuple[str, ...], layouts_of: Callable[[str], tuple[str, ...]], extra: Mapping[str, tuple[str, ...]] = {}
) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """``(family, layout)`` keys and the cases of ``families`` in their layouts (``extra`` overrides per
    family); a family not compiled in dp has dp's state measured alone (:func:`state_only`)."""
    grid: list[tuple[str, str]] = []
    cases: list[dict[str, Any]] = []
    for family in families:
        layouts = layouts_of(family)
        for layout in layouts:
            grid.append((family, layout))
            cases.append(tiny(family, layout, *extra.get(family, ())))
        if "dp" not in layouts:
            grid.append((family, "dp"))
            cases.append(state_only(tiny(family, "dp", *extra.get(family, ()))))
    return grid, cases


def compile_layouts(
    families: tuple[str, ...], layouts_of: Callable[[str], tuple[str, ...]], extra: Mapping[str, tuple[str, ...]] = {}
) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(family, layout): result}`` of :func:`layout_cases`, compiled for 8 x H100 in one process."""
    grid, cases = layout_cases(families, layouts_of, extra)
    return dict(zip(grid, compile_cases("h100x8", cases), strict=True))
