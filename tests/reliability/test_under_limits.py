"""The hostile inputs that once took the whole machine, run as a user's command would be under a scheduler's
limits: a fresh ``theseus`` process capped at 3 GiB of address space (``ulimit -v``) and 60 s of CPU. Each
ends with its one line and exit 2 inside the caps; a command that tried to build what the input claims
would die of the cap (a MemoryError traceback, or SIGKILL at the CPU limit) instead.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env
from tests.huggingface.test_hostile_folders import DEEP, write_llama
from tests.reliability.conftest import train_args
from tests.reliability.test_bounded_work import BOUND, LAUGHS

pytestmark = pytest.mark.slow

ADDRESS_SPACE = 3 << 30  # bytes: jax, theseus and a small run fit in well under this
CPU_SECONDS = 60


def capped() -> None:
    """In the child, before ``theseus`` starts: the caps a scheduler's job would run under."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    resource.setrlimit(resource.RLIMIT_CPU, (CPU_SECONDS, CPU_SECONDS))


def theseus_capped(*args: str) -> tuple[int, str]:
    """``theseus ARGS`` in a capped process: ``(exit code, stderr)``."""
    done = subprocess.run(
        [sys.executable, "-m", "theseus.cli.main", *args],
        capture_output=True,
        text=True,
        env=clean_env(),
        preexec_fn=capped,
        timeout=180,
    )
    return done.returncode, done.stderr


def one_line(code: int, err: str) -> str:
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), (code, err[-2000:])
    return err.strip()


def test_a_claimed_trillion_layers_and_a_deep_config_are_one_line_within_the_caps(tmp_path: Path) -> None:
    root = tmp_path / "root"
    claimed = write_llama(tmp_path / "claimed", num_hidden_layers=10**12)
    line = one_line(*theseus_capped("run", "hf/import", f"hf/source={claimed}", "run/name=x", "--root", str(root)))
    assert line.startswith("error: config.json field num_hidden_layers=")
    deep = write_llama(tmp_path / "deep")
    (deep / "config.json").write_text(DEEP)
    line = one_line(*theseus_capped("run", "hf/import", f"hf/source={deep}", "run/name=y", "--root", str(root)))
    assert (
        line
        == f"error: {deep / 'config.json'} is not readable JSON (it nests deeper than 64 levels); download it again"
    )
    assert not (root / "runs" / "x").exists() and not (root / "runs" / "y").exists()


def test_a_billion_laughs_config_is_one_line_within_the_caps(root: Path, tmp_path: Path) -> None:
    config = tmp_path / "laughs.yaml"
    config.write_text(LAUGHS)
    line = one_line(*theseus_capped(*train_args(root, "--config", str(config))))
    assert line == f"error: config file {str(config)!r} {BOUND}"
