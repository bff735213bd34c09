"""Reliability test helpers: prepared byte data, the job file, and the CLI called in-process."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.training.conftest import write_byte_corpus

HERE = Path(__file__).resolve().parent
BAD_JOB = HERE / "bad_job.py"

#: A tiny run of ``test/reliability/train``: 16 tokens x 4 rows, a checkpoint every 2 steps, all kept.
SETTINGS = [
    "architecture/vocab_size=257",
    "architecture/width=16",
    "training/steps=6",
    "training/batch_size=4",
    "training/log_interval=1",
    "training/eval_batches=0",
    "training/checkpoint_interval=2",
    "training/keep_checkpoints=0",
    "training/progress=false",
    "training/plots=false",
    "training/peak_flops=1e12",
]


def train_args(root: Path, *overrides: str) -> list[str]:
    """``theseus --load bad_job.py run test/reliability/train --root ROOT`` with SETTINGS, then ``overrides``."""
    return ["--load", str(BAD_JOB), "run", "test/reliability/train", "--root", str(root), *SETTINGS, *overrides]


def call_cli(args: list[str]) -> int:
    """``theseus ARGS`` in this process; the exit code (0 when it returns)."""
    from theseus.cli.main import main

    try:
        main(args)
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture()
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str]]:
    """Run ``theseus ARGS`` in-process; returns ``(exit code, stderr)``."""

    def run(args: list[str]) -> tuple[int, str]:
        capsys.readouterr()
        code = call_cli(args)
        return code, capsys.readouterr().err

    return run


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root holding prepared byte-tokenized data named ``corpus``."""
    root = tmp_path_factory.mktemp("reliability-root")
    write_byte_corpus(root, "corpus", documents=32)
    return root


@pytest.fixture()
def root(corpus_root: Path, tmp_path: Path) -> Path:
    """A fresh root with the prepared ``corpus`` (copied) and no runs."""
    fresh = tmp_path / "root"
    shutil.copytree(corpus_root / "data", fresh / "data")
    return fresh


def error_line(stderr: str) -> str:
    """The ``error:`` line, asserting it is the last line and that no traceback was printed."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert lines and lines[-1].startswith("error: "), stderr
    return lines[-1]


@pytest.fixture(scope="module")
def compilation_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """JAX's persistent compilation cache in a temporary folder while the module runs (then as before):
    the many short in-process runs of the same tiny model compile once."""
    import jax
    from jax.experimental.compilation_cache import compilation_cache as cache

    names = (
        "jax_compilation_cache_dir",
        "jax_persistent_cache_min_compile_time_secs",
        "jax_persistent_cache_min_entry_size_bytes",
    )
    previous = {name: getattr(jax.config, name) for name in names}
    folder = tmp_path_factory.mktemp("jax-cache")
    for name, value in zip(names, (str(folder), 0.0, 0), strict=True):
        jax.config.update(name, value)
    cache.reset_cache()
    try:
        yield folder
    finally:
        for name, value in previous.items():
            jax.config.update(name, value)
        cache.reset_cache()
