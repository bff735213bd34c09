"""The rest of the dense families (see test_compile_dense.py): Gemma 2 and 3 and Phi-3 compile for
8 x H100, sharded (their replicated state measured, not compiled)."""

from __future__ import annotations

import pytest

from tests.plan import test_compile_dense as dense
from tests.plan.conftest import compile_layouts

FAMILIES = ("gemma2", "gemma3", "phi3")


@pytest.fixture(scope="module")
def matrix() -> dict[tuple[str, str], dict]:
    return compile_layouts(FAMILIES, dense.layouts_of, dense.EXTRA)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_dense_family_compiles_for_h100_in_its_layouts(matrix: dict, family: str) -> None:
    dense.check_family(matrix, family)
