"""Compiling for accelerators this machine does not have: the compilers live in ``<repo>/.compilers``
(``pip install --target .compilers -r requirements-compilers.txt``, as the README's test command does),
on the path of the subprocesses that compile only, so the rest of the suite runs without them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
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


#: CPU seconds (user + system, its own and its compilers') a compile process may spend: the largest matrix
#: takes about 200. A limit on CPU, not wall time: on a loaded machine the same work takes longer, not more.
COMPILE_CPU_LIMIT = 900.0
#: Wall seconds without a single CPU tick from a compile process: it is stuck (waiting on something that
#: never comes), however busy the machine, as a process that is scheduled at all uses some CPU.
COMPILE_STALL_SECONDS = 180.0
#: Where /proc cannot be read (not Linux): the wall-clock limit instead.
COMPILE_WALL_LIMIT = 900.0
#: Seconds between two looks at a compile process.
POLL_SECONDS = 2.0


def cpu_seconds(pid: int) -> float | None:
    """CPU seconds process ``pid`` and the children it has waited for have used, from ``/proc`` (None
    where it cannot be read)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after the command's name, which may hold spaces
    return sum(int(ticks) for ticks in fields[11:15]) / os.sysconf("SC_CLK_TCK")  # utime stime cutime cstime


def watched(process: subprocess.Popen[bytes]) -> str:
    """Wait for ``process``: '' once it has ended, or why it was killed (:func:`overrun`)."""
    started = last_tick = time.monotonic()
    used = 0.0
    while True:
        try:
            process.wait(timeout=POLL_SECONDS)
            return ""
        except subprocess.TimeoutExpired:
            pass
        now, cpu = time.monotonic(), cpu_seconds(process.pid)
        if cpu is not None and cpu > used:
            used, last_tick = cpu, now
        reason = overrun(cpu, now - started, now - last_tick)
        if reason:
            process.kill()
            process.wait()
            return reason


def overrun(cpu: float | None, elapsed: float, idle: float) -> str:
    """Why a compile process that has used ``cpu`` seconds in ``elapsed`` wall seconds, the last ``idle`` of
    them without CPU, is to be killed ('' if it is not): over :data:`COMPILE_CPU_LIMIT`, idle for
    :data:`COMPILE_STALL_SECONDS`, or, where its CPU cannot be read, over :data:`COMPILE_WALL_LIMIT`."""
    if cpu is None:
        return f"ran {elapsed:.0f} s, over {COMPILE_WALL_LIMIT:.0f}" if elapsed > COMPILE_WALL_LIMIT else ""
    if cpu > COMPILE_CPU_LIMIT:
        return f"used {cpu:.0f} s of CPU, over {COMPILE_CPU_LIMIT:.0f}"
    return f"used no CPU for {idle:.0f} s: stuck" if idle > COMPILE_STALL_SECONDS else ""


#: The mark of a module whose fixture calls :func:`compile_cases`: pytest's limit of 5 minutes' wall time
#: (pyproject.toml) would end a compile that a loaded machine only slowed down; :func:`watched` ends one
#: that is stuck or runs away instead.
WATCHED = pytest.mark.timeout(0)


def compile_cases(target: str, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What ``theseus plan`` reports for each case (``{"job", "overrides"}`` or ``{"generate": ...}``),
    compiled in one process; each result holds ``plan`` or ``error``. A process that is stuck or runs
    away is killed (:func:`watched`) and the test fails, naming why."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            [sys.executable, str(RUNNER), target, json.dumps(cases)], stdout=out, stderr=err, env=compiler_env()
        )
        killed = watched(process)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (stream.read().decode("utf-8", "replace") for stream in (out, err))
    assert not killed, f"the compile process {killed}; killed: {stderr[-3000:]}"
    assert process.returncode == 0, stderr[-3000:]
    results = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    assert len(results) == len(cases), stderr[-3000:]
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
