"""A plugin declares the theseus-core it targets; an incompatible one is warned about, or refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, make_venv, pip_install, run_cli
from theseus.plugins.compat import api_version, supported_range

OLD = "theseus-fixture-old-api"
WARNING = (
    f"{OLD} 1.0.0 targets theseus-core>=0.0.1,<0.1 but theseus-core 0.1.0 is installed; install a {OLD} "
    f"release for theseus-core 0.1 (or theseus-core>=0.0.1,<0.1), or block it with THESEUS_BLOCK_PLUGINS={OLD}"
)


@pytest.fixture(scope="module")
def old_plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = make_venv(tmp_path_factory.mktemp("compat-venv"), inherit="site")
    pip_install(python, REPO / "tests" / "fixtures" / "plugins" / "old_api")
    return python


def test_the_supported_range_follows_the_minor_version_before_1_0() -> None:
    assert supported_range("0.1.0") == ">=0.1,<0.2"
    assert supported_range("0.3.7") == ">=0.3,<0.4"
    assert supported_range("1.4.2") == ">=1.4,<2"
    assert api_version("0.1.3") == "0.1"


def test_plugins_shows_targets_and_warns_in_one_line(old_plugin_python: Path) -> None:
    shown = run_cli(["plugins"], python=old_plugin_python)
    assert shown.returncode == 0, shown.stderr
    rows = {line.split()[0]: line.split() for line in shown.stdout.splitlines()[1:] if line and not line[0].isspace()}
    assert rows[OLD][:5] == [OLD, "1.0.0", ">=0.0.1,<0.1", "1", "0"] and rows[OLD][-1] == "incompatible"
    assert rows["theseus-plugins-example"][2] == ">=0.1,<0.2" and rows["theseus-plugins-example"][-1] == "ok"
    assert shown.stdout.count(WARNING) == 1

    jobs = run_cli(["jobs"], python=old_plugin_python)
    assert jobs.returncode == 0 and "fixture/old-api" in jobs.stdout  # still usable
    assert [line for line in jobs.stderr.splitlines() if OLD in line] == [f"warning: {WARNING}"]
    ran = run_cli(["run", "fixture/old-api", "--root", "/nonexistent-unused"], python=old_plugin_python)
    assert ran.returncode == 0 and "hello from an old plugin" in ran.stdout


def test_strict_mode_refuses_an_incompatible_plugin(old_plugin_python: Path) -> None:
    for args in (["jobs"], ["run", "fixture/old-api"]):
        refused = run_cli(args, python=old_plugin_python, env=clean_env(THESEUS_STRICT_PLUGINS="1"))
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.strip() == f"error: {WARNING} (THESEUS_STRICT_PLUGINS is set)"
        assert "hello from an old plugin" not in refused.stdout
