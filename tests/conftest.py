"""Shared test helpers: running the CLI in subprocesses and building isolated venvs."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# One persistent XLA compilation cache for the whole session, shared with every subprocess the
# tests start (clean_env keeps it): the trainer's own per-root cache would otherwise point into
# temporary roots that tests delete.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", tempfile.mkdtemp(prefix="theseus-test-xla-cache-"))
DISTRIBUTIONS = ["theseus-core", "theseus-models", "theseus-data", "theseus-plugins-example"]


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without theseus plugin switches, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("THESEUS_")}
    env.setdefault("JAX_PLATFORMS", "cpu")
    env.update(extra)
    return env


def run_cli(
    args: list[str],
    *,
    python: str | Path = sys.executable,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``theseus ARGS`` with the given interpreter; returns the completed process."""
    return subprocess.run(
        [str(python), "-m", "theseus.cli.main", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=cwd,
        timeout=timeout,
    )


def make_venv(path: Path, *, inherit: str) -> Path:
    """Create a venv without pip whose dependencies come from the running environment.

    ``inherit="site"`` processes the running environment's ``.pth`` files (so editable
    theseus installs are visible); ``inherit="packages"`` only puts its site-packages on
    the path, so theseus itself must come from wheels installed into the new venv
    (the venv's own distributions take precedence in ``importlib.metadata``).
    """
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    site_packages = Path(
        subprocess.check_output(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    parent = sysconfig.get_paths()["purelib"]
    line = f"import site; site.addsitedir({parent!r})" if inherit == "site" else parent
    (site_packages / "_theseus_test_inherit.pth").write_text(line + "\n")
    return python


def pip_install(python: Path, *targets: str | Path) -> None:
    """Install local projects or wheels into ``python``'s venv, offline and without deps."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            *map(str, targets),
        ],
        check=True,
        capture_output=True,
        text=True,
    )


def build_wheels(out: Path, projects: list[Path]) -> list[Path]:
    """Build wheels of ``projects`` into ``out`` (offline, no build isolation)."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-w",
            str(out),
            *map(str, projects),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return sorted(out.glob("*.whl"))


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
