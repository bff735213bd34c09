"""``theseus plan`` as a user runs it: one line for what cannot work, JSON for scripts, plugins' jobs
planned like built-in ones, and CPU runs kept quiet when an accelerator plugin is installed without
its accelerator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import clean_env, run_cli
from tests.plan.conftest import compiler_env

#: A one-layer tiny model: what the plan reports is the same kind of thing at any depth, and one layer
#: compiles in about a third of the tiny preset's four.
TINY = ["architecture/preset=tiny", "architecture/n_layers=1", "training/batch_size=8", "training/sequence_length=64"]


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and done.stderr.strip().count("\n") == 0, done.stderr
    return done.stderr.strip()


def test_missing_compilers_and_bad_targets_are_one_line() -> None:
    env = clean_env()  # the test environment holds no accelerator compiler
    for target, extra in (("h100x8", "plan-cuda"), ("v5e:2x4", "plan-tpu")):
        line = one_line(run_cli(["plan", "train/pretrain", "--target", target], env=env))
        assert line.endswith(f"install it with pip install 'theseus-core[{extra}]'"), line
    line = one_line(run_cli(["plan", "train/pretrain", "--target", "h100x16"], env=env))
    assert (
        line == "error: --target 'h100x16': a GPU host holds 1 to 8 GPUs; write KINDxGPUSxHOSTS, for example h100x8x4"
    )
    line = one_line(run_cli(["plan", "train/pretrain", "--target", "tpu8"], env=env))
    assert line.startswith("error: unknown --target 'tpu8'; use a GPU count or a TPU slice, for example h100x8")


def test_max_batch_goes_down_from_a_refused_batch_without_compiling_one_twice() -> None:
    """XLA's TPU compiler refuses a step larger than the chip, so the search can start from a batch that
    has no plan (the one-chip flow of docs/accelerators.md runs it through the command)."""
    from theseus.plan.report import largest_batch

    tried: list[int] = []

    def fits_up_to(most: int) -> Any:
        def plan_of(batch: int) -> Any:
            tried.append(batch)
            return SimpleNamespace(fits=True) if batch <= most else None

        return plan_of

    best, plan, compiles = largest_batch(fits_up_to(5), None, 16, 1)
    assert (best, plan is not None, compiles, tried) == (5, True, 4, [8, 4, 6, 5])
    tried.clear()
    assert largest_batch(fits_up_to(0), None, 4, 1) == (0, None, 2) and tried == [2, 1]


@pytest.mark.slow
def test_plan_json_for_a_plugin_job_and_one_line_mistakes(tmp_path: Path) -> None:
    env = compiler_env()
    done = run_cli(
        ["plan", "example/gpt/train", "--target", "h100x4", *TINY, "--json", "--root", str(tmp_path)], env=env
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "cudart" not in done.stderr  # the plugin's start-up log is kept
    plan = json.loads(done.stdout)
    assert (plan["job"], plan["devices"], plan["device"]) == ("example/gpt/train", 4, "NVIDIA H100 80GB HBM3")
    assert plan["memory"]["fits"] and plan["memory"]["total"] < plan["memory"]["device"]
    assert plan["estimate"]["step_seconds"] > 0 and 0 < plan["estimate"]["mfu"] < 1
    assert any("peak 989.0 TFLOP/s" in line for line in plan["estimate"]["assumptions"])
    assert not (tmp_path / "runs").exists()  # planning writes no run
    kernels = Path(env["JAX_COMPILATION_CACHE_DIR"]) / "xla_gpu_kernel_cache_file"  # for the next plan
    assert kernels.stat().st_size > 0

    line = one_line(run_cli(["plan", "generate", "--target", "h100x8"], env=env))
    assert line == "error: 'generate' is not a training job; theseus plan compiles a trainer's step"
    line = one_line(run_cli(["plan", "train/pretrain", "--target", "h100x8", *TINY, "mesh/model=3"], env=env))
    assert "mesh/model" in line
    # a deviceless GPU has no host memory space: an offloaded state would be planned on the device, silently
    line = one_line(run_cli(["plan", "train/pretrain", "--target", "h100x8", *TINY, "optimizer/offload=true"], env=env))
    assert line.startswith("error: optimizer/offload=true needs devices with pinned host memory"), line
    # (that model/remat=auto, the default, is planned as remat=none and says so is checked on the plans of
    # docs/accelerators.md's flows, tests/docs/test_flow_accelerators.py)


@pytest.mark.slow
def test_cpu_runs_stay_quiet_with_an_accelerator_plugin_installed(tmp_path: Path) -> None:
    """Without JAX_PLATFORMS, jax would let the CUDA plugin fail (a cuInit traceback) before using the CPU."""
    env = compiler_env()
    env.pop("JAX_PLATFORMS")
    args = ["run", "train/pretrain", "--root", str(tmp_path), "architecture/n_layers=1", "architecture/n_embd=32"]
    args += ["architecture/n_heads=2", "architecture/block_size=32", "training/batch_size=4", "training/steps=1"]
    args += ["data/max_documents=20", "data/val_fraction=0.25", "training/progress=false", "training/eval_batches=0"]
    done = subprocess.run(
        [sys.executable, "-m", "theseus.cli.main", *args], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr and "Unable to load CUDA" not in done.stderr, done.stderr
