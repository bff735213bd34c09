"""Context parallelism (``mesh/context``): a sequence split over 4 simulated devices gives the loss and
gradients of one device, for each attention form and family, beside fsdp, tp and ep.

All cases run in one subprocess (``context_parallel_run.py``): the device count is fixed when jax starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, clean_env

TOLERANCE = 1e-5
FAMILIES = ("gpt", "llama", "gemma3", "mixtral")


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("context") / "out.json"
    done = subprocess.run(
        [sys.executable, "-m", "tests.parallel.context_parallel_run", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=clean_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(Path(out).read_text())


@pytest.mark.parametrize("form", ["allgather", "ring"])
@pytest.mark.parametrize("family", FAMILIES)
def test_context_four_equals_one_device(results: dict[str, Any], family: str, form: str) -> None:
    """T=512 over context=4 (padded rows; Gemma 3's windows of 40 and Mixtral's of 96 are shorter than a
    chunk of 64, so whole blocks are skipped): loss and every gradient within 1e-5 of one device."""
    case = results[f"{family} {form}"]
    assert case["loss"] <= TOLERANCE
    assert case["grads"] <= TOLERANCE
    assert case["scale"] > 100 * TOLERANCE  # the gradients compared are not all near zero


def test_each_form_moves_keys_its_own_way(results: dict[str, Any]) -> None:
    """The ring passes key/value blocks between neighbours; all-gather gathers them and passes none."""
    for family in FAMILIES:
        assert results[f"{family} ring"]["collective_permutes"] > 0
        assert results[f"{family} allgather"]["collective_permutes"] == 0
        assert results[f"{family} allgather"]["all_gathers"] > results[f"{family} ring"]["all_gathers"]


@pytest.mark.parametrize("case", ["gemma3 ring scanned", "gpt ring fsdp+tp packed", "mixtral allgather ep"])
def test_context_composes(results: dict[str, Any], case: str) -> None:
    """Scanned layers (each layer's window chosen at run time), context=2 beside fsdp+tp with packed rows
    (attention within each example), and beside expert parallelism (experts over expert=2)."""
    assert results[case]["loss"] <= TOLERANCE
    assert results[case]["grads"] <= TOLERANCE


def test_sizes_that_do_not_split_name_the_fix(results: dict[str, Any]) -> None:
    errors = results["errors"]
    assert errors["devices"] == "mesh/context=3 does not divide the 4 available devices; choose a divisor"
    assert "500 tokens cannot be cut into 2 x mesh/context = 8 equal chunks" in errors["sequence"]
    assert "a multiple of 8" in errors["sequence"]


@pytest.mark.parametrize(
    ("case", "what"),
    [
        ("latent", "multi-head latent attention (DeepSeek-V3)"),
        ("linear", "Gated DeltaNet linear attention (Qwen3-Next)"),
        ("chunked", "Llama 4's chunked and temperature-tuned attention"),
    ],
)
def test_layers_without_a_split_form_are_refused_in_one_line(results: dict[str, Any], case: str, what: str) -> None:
    """Sequence mixers that would give wrong numbers over a split sequence say so instead."""
    assert (
        results["errors"][case]
        == f"{what} cannot split its sequence over mesh/context; set mesh/context=1 for this model"
    )
