"""The ``theseus`` command line: listings, --load, configure, run, and user errors."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_cli

USER_JOB = textwrap.dedent(
    """
    from dataclasses import dataclass

    from theseus.base.job import Job
    from theseus.config import field
    from theseus.registry import job


    @dataclass
    class CountConfig:
        count: int = field("count/n", default=3)
        label: str = field("count/label")


    @job("user/count")
    class Count(Job):
        CONFIG = CountConfig

        def run(self):
            self.context.root.mkdir(parents=True, exist_ok=True)
            (self.context.root / "count.txt").write_text(f"{self.args.label}:{self.args.count}")
    """
)


@pytest.fixture()
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_jobs.py"
    path.write_text(USER_JOB)
    return path


def test_listing_does_not_import_heavy_libraries() -> None:
    code = (
        "import sys\n"
        "from theseus.cli.main import main\n"
        "for args in (['jobs'], ['components'], ['plugins']):\n"
        "    main(args)\n"
        "heavy = ('jax', 'flax', 'optax', 'datasets', 'orbax', 'tokenizers', 'torch', 'numpy')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env())
    assert done.returncode == 0, done.stderr
    assert "HEAVY []" in done.stdout


def test_version() -> None:
    done = run_cli(["--version"])
    assert done.returncode == 0 and done.stdout.startswith("theseus, version ")


def test_load_registers_user_jobs_and_runs_them(user_file: Path, tmp_path: Path) -> None:
    listed = run_cli(["--load", str(user_file), "jobs"])
    assert listed.returncode == 0, listed.stderr
    assert "user/count" in listed.stdout and "<local>" in listed.stdout
    ran = run_cli(
        ["--load", str(user_file), "run", "user/count", "count/label=x", "count.n=5", "--root", str(tmp_path / "r")]
    )
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "r" / "count.txt").read_text() == "x:5"


def test_configure_writes_yaml_that_run_accepts(user_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "count.yaml"
    done = run_cli(["--load", str(user_file), "configure", "user/count", str(out), "count/label=hi"])
    assert done.returncode == 0, done.stderr
    assert "label: hi" in out.read_text()
    ran = run_cli(["--load", str(user_file), "run", "user/count", "--config", str(out), "--root", str(tmp_path / "r")])
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "r" / "count.txt").read_text() == "hi:3"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "user/cuont"], "unknown job 'user/cuont'; did you mean 'user/count'?"),
        (
            ["run", "user/count", "count/label=x", "count/m=1"],
            "unknown configuration key 'count/m' (override); did you mean 'count/n'?",
        ),
        (["run", "user/count", "count/label=x", "count/n=lots"], "count/n: expected int, got 'lots'"),
        (["run", "user/count"], "missing required configuration value 'count/label' (str); pass count/label=<value>"),
        (["run", "user/count", "count/label"], "override 'count/label' is not of the form key=value"),
        (["configure", "user/count", "out.yaml", "count/q=1"], "unknown configuration key 'count/q'"),
        (["components", "--kind", "modle"], "unknown component kind 'modle'"),
    ],
)
def test_user_mistakes_give_one_line_and_exit_2(user_file: Path, tmp_path: Path, args: list[str], message: str) -> None:
    done = run_cli(["--load", str(user_file), *args], cwd=tmp_path)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().count("\n") == 0


def test_malformed_yaml_and_root_that_is_a_file(user_file: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("count: {n: [1,\n")
    done = run_cli(["--load", str(user_file), "run", "user/count", "--config", str(bad)])
    assert done.returncode == 2 and "is not valid YAML" in done.stderr and "Traceback" not in done.stderr
    a_file = tmp_path / "file"
    a_file.write_text("")
    done = run_cli(["--load", str(user_file), "run", "user/count", "count/label=x", "--root", str(a_file)])
    assert done.returncode == 2 and "is a file" in done.stderr and done.stderr.count("\n") == 1


def test_verbose_shows_traceback(user_file: Path) -> None:
    done = run_cli(["--verbose", "--load", str(user_file), "run", "user/count"])
    assert done.returncode == 2 and "Traceback" in done.stderr and "missing required configuration value" in done.stderr


def test_load_errors(tmp_path: Path) -> None:
    missing = run_cli(["--load", str(tmp_path / "absent.py"), "jobs"])
    assert missing.returncode == 2 and "no such file" in missing.stderr
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    done = run_cli(["--load", str(broken), "jobs"])
    assert done.returncode == 2 and "failed: RuntimeError: boom" in done.stderr and "Traceback" not in done.stderr


def test_unknown_command_suggests() -> None:
    done = run_cli(["jbos"])
    assert done.returncode == 2 and "did you mean 'jobs'?" in done.stderr
