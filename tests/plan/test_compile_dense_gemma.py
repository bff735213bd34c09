"""The rest of the dense families (see test_compile_dense.py): Gemma 2 and 3 and Phi-3 compile for
8 x H100, replicated and sharded."""

from __future__ import annotations

import pytest

from tests.plan import test_compile_dense as dense
from tests.plan.conftest import compile_cases, tiny

FAMILIES = ("gemma2", "gemma3", "phi3")


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str], dict]:
    grid = [(family, layout) for family in FAMILIES for layout in dense.layouts_of(family)]
    results = compile_cases("h100x8", [tiny(family, layout, *dense.EXTRA.get(family, ())) for family, layout in grid])
    return dict(zip(grid, results, strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_family_compiles_for_h100_in_its_layouts(matrix: dict, family: str) -> None:
    dense.check_family(matrix, family)
