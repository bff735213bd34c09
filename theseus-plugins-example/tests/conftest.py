"""Fixtures of the example plugin's own tests: a small prepared corpus and a tiny model setting.

These tests use the installed distributions only (``pip install ./theseus-plugins-example``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

#: A one-layer, 32-wide ScaledGPT on 32-byte rows: compiles in seconds.
TINY: dict[str, Any] = {
    "architecture/n_layers": 1,
    "architecture/n_embd": 32,
    "architecture/n_heads": 2,
    "architecture/block_size": 32,
    "training/sequence_length": 32,
    "training/batch_size": 4,
    "training/steps": 2,
    "training/log_interval": 1,
    "training/eval_interval": 0,
    "training/eval_batches": 1,
    "training/checkpoint_interval": 0,
    "training/async_checkpoints": False,
    "training/progress": False,
    "evaluation/next_token/batches": 1,
}


@pytest.fixture
def tiny() -> dict[str, Any]:
    """Overrides for a quick run (a copy: tests may change it)."""
    return dict(TINY)


@pytest.fixture(scope="session")
def stdlib_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding a small byte-level ``python-stdlib`` (as ``theseus run data/tokenize`` leaves it)."""
    from theseus.data.datasets import PythonStdlib
    from theseus.data.prepare import prepare

    root = tmp_path_factory.mktemp("example-root")
    prepare(PythonStdlib(max_documents=24, val_fraction=0.125), root, tokenizer="byte", workers=1)
    return root


@pytest.fixture
def root(stdlib_root: Path, tmp_path: Path) -> Path:
    """A fresh root for one test whose ``data/`` is the prepared corpus."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "python-stdlib").symlink_to(stdlib_root / "data" / "python-stdlib")
    return tmp_path
