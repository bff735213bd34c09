"""Compiling for accelerators this machine does not have: the compilers live in ``<repo>/.compilers``
(``pip install --target .compilers -r requirements-compilers.txt``, as the README's test command does),
on the path of the subprocesses that compile only, so the rest of the suite runs without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
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


#: Layers of a compiled case: one where a family's layers are all alike (the assertions read the step's matmuls,
#: memory, collectives and kernels, which a second identical layer repeats; a tiny Llama compiles for
#: 8 x H100 in about half the CPU at one layer than at two), two where they differ: :data:`TWO_LAYERS`.
CASE_LAYERS = 1
#: Families whose layers differ, and the keys that make their two layers one of each kind: sliding and full
#: attention (Gemma 2 alternates them; Gemma 3 and 4 have five sliding layers to a full one, and Gemma 4's
#: full layers have heads of their own width), Gated DeltaNet and full attention (Qwen3.5: three to one), a
#: RoPE and a NoPE layer (SmolLM3: three to one), a dense layer before the mixtures (GLM-4.5).
TWO_LAYERS: dict[str, tuple[str, ...]] = {
    "gemma2": (),
    "gemma3": ("architecture/layer_types=[sliding_attention,full_attention]",),
    "gemma4": ("architecture/layer_types=[sliding_attention,full_attention]",),
    "qwen3_5": ("architecture/layer_types=[linear_attention,full_attention]",),
    "qwen3_5_moe": ("architecture/layer_types=[linear_attention,full_attention]",),
    "smollm3": ("architecture/no_rope_layers=[1,0]",),
    "glm4_moe": (),
}
#: Families on DeepSeek-V3's layers, whose first layer is dense too: one layer, a mixture's (latent attention,
#: and DeepSeek Sparse Attention, are every layer's; GLM-4.5's two layers compile the dense-then-mixture stack).
ONE_LAYER = {family: ("architecture/moe/first_k_dense=0",) for family in ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")}
#: The device each target's plan names.
DEVICES = {"h100x8": "NVIDIA H100 80GB HBM3", "v5e:2x4": "TPU v5 lite"}


def tiny(model: str, layout: str, *extra: str, job: str = "train/pretrain") -> dict[str, Any]:
    """A case: ``model``'s tiny preset, :data:`CASE_LAYERS` deep (two layers, one of each kind, for the
    families of :data:`TWO_LAYERS`), in ``layout`` on 8 devices (tp over 2, ep over 2)."""
    layers = 2 if model in TWO_LAYERS else CASE_LAYERS
    overrides = [f"model={model}", "architecture/preset=tiny", f"architecture/n_layers={layers}"]
    overrides += ["training/batch_size=8", "training/sequence_length=64"]
    overrides += TWO_LAYERS.get(model, ONE_LAYER.get(model, ()))
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


@dataclass(frozen=True)
class Family:
    """How a matrix compiles a family: the layouts it ``compiles``, those whose state it only ``measures``
    (:func:`state_only`; dp, the reference the sharded layouts' state is compared with, unless compiled), the
    ``target`` and ``extra`` overrides."""

    compiles: tuple[str, ...]
    measures: tuple[str, ...] = ()
    target: str = "h100x8"
    extra: tuple[str, ...] = ()

    @property
    def measured(self) -> tuple[str, ...]:
        return (*self.measures, *(() if "dp" in (*self.compiles, *self.measures) else ("dp",)))


def layout_cases(families: Mapping[str, Family]) -> tuple[list[tuple[str, str]], list[dict[str, Any]]]:
    """``(family, layout)`` keys and the cases of ``families``: each compiled in its layouts for its target,
    its other layouts' state measured alone (:func:`state_only`)."""
    grid: list[tuple[str, str]] = []
    cases: list[dict[str, Any]] = []
    for name, family in families.items():
        for layout in family.compiles:
            grid.append((name, layout))
            cases.append({**tiny(name, layout, *family.extra), "target": family.target})
        for layout in family.measured:
            grid.append((name, layout))
            cases.append(state_only({**tiny(name, layout, *family.extra), "target": family.target}))
    return grid, cases


def compile_layouts(families: Mapping[str, Family]) -> dict[tuple[str, str], dict[str, Any]]:
    """``{(family, layout): result}`` of :func:`layout_cases`, compiled in one process."""
    grid, cases = layout_cases(families)
    return dict(zip(grid, compile_cases("h100x8", cases), strict=True))
