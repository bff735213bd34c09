"""Plugin discovery with real distributions installed into a temporary venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, make_venv, pip_install, run_cli

FIXTURES = REPO / "tests" / "fixtures" / "plugins"


@pytest.fixture(scope="module")
def plugin_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    python = make_venv(tmp_path_factory.mktemp("plugins-venv"), inherit="site")
    names = ("good", "broken", "dup_a", "dup_b", "badhook", "badargs", "exits")
    pip_install(python, *(FIXTURES / name for name in names))
    return python


def test_good_plugin_jobs_and_components_are_listed(plugin_python: Path) -> None:
    jobs = run_cli(["jobs"], python=plugin_python)
    assert jobs.returncode == 0, jobs.stderr
    assert "fixture/hello" in jobs.stdout and "theseus-fixture-good 1.2.3" in jobs.stdout
    components = run_cli(["components", "--kind", "dataset"], python=plugin_python)
    assert components.returncode == 0
    assert "dataset/fixture-text" in components.stdout and "theseus-fixture-good" in components.stdout


def test_broken_plugin_is_reported_by_name_and_others_keep_working(plugin_python: Path) -> None:
    jobs = run_cli(["jobs"], python=plugin_python)
    assert "Traceback" not in jobs.stderr
    assert (
        "theseus-fixture-broken" in jobs.stderr and "failed to import 'theseus_fixture_broken.explodes'" in jobs.stderr
    )
    assert "unknown kind 'gizmo'" in jobs.stderr
    ran = run_cli(["run", "fixture/broken", "--root", "/nonexistent-unused"], python=plugin_python)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "theseus-fixture-broken" in ran.stderr and "this plugin needs a library" in ran.stderr
    not_job = run_cli(["run", "fixture/not-a-job"], python=plugin_python)
    assert not_job.returncode == 2 and "not a Job class" in not_job.stderr
    missing = run_cli(["run", "fixture/missing-attr"], python=plugin_python)
    assert missing.returncode == 2 and "has no attribute 'Absent'" in missing.stderr


def test_wrong_kind_of_component_is_reported(plugin_python: Path) -> None:
    code = "from theseus.registry import get_registry; get_registry().load_component('model', 'not-a-module')"
    import subprocess

    done = subprocess.run([str(plugin_python), "-c", code], capture_output=True, text=True, env=clean_env())
    assert "is not a theseus.model.module.Module subclass" in done.stderr
    assert "theseus-fixture-broken" in done.stderr


def test_good_plugin_runs_configures_and_contributes(plugin_python: Path, tmp_path: Path) -> None:
    out = tmp_path / "hello.yaml"
    configured = run_cli(["configure", "fixture/hello", str(out), "hello/times=2"], python=plugin_python)
    assert configured.returncode == 0, configured.stderr
    text = out.read_text()
    assert "times: 2" in text and "colour: blue" in text  # colour comes from the gather hook
    ran = run_cli(
        ["run", "fixture/hello", "--config", str(out), "--root", str(tmp_path / "root"), "hello/greeting=yo"],
        python=plugin_python,
    )
    assert ran.returncode == 0, ran.stderr
    assert (tmp_path / "root" / "hello.txt").read_text() == "yo yo"
    command = run_cli(
        ["fixture-hello"], python=plugin_python, env=clean_env(THESEUS_BLOCK_PLUGINS="theseus-fixture-badhook")
    )
    assert command.returncode == 0 and "hello from theseus-fixture-good" in command.stdout


def test_duplicate_job_names_an_error_naming_both(plugin_python: Path) -> None:
    ran = run_cli(["run", "fixture/dup"], python=plugin_python)
    assert ran.returncode == 2
    assert "theseus-fixture-dup-a" in ran.stderr and "theseus-fixture-dup-b" in ran.stderr
    assert "provided by both" in ran.stderr
    jobs = run_cli(["jobs"], python=plugin_python)
    assert jobs.returncode == 0 and "fixture/dup" in jobs.stderr


def test_plugins_command_shows_distributions_hooks_and_failures(plugin_python: Path) -> None:
    shown = run_cli(["plugins"], python=plugin_python)
    assert shown.returncode == 0, shown.stderr
    good = next(line for line in shown.stdout.splitlines() if line.startswith("theseus-fixture-good"))
    assert "1.2.3" in good and "theseus_cli_commands" in good and "theseus_gather" in good and "ok" in good
    broken = next(line for line in shown.stdout.splitlines() if line.startswith("theseus-fixture-broken"))
    assert "failed" in broken


def test_hook_raising_is_reported_with_its_distribution(plugin_python: Path) -> None:
    ran = run_cli(["no-such-command"], python=plugin_python)
    assert ran.returncode == 2 and "Traceback" not in ran.stderr
    assert "theseus-fixture-badhook" in ran.stderr and "cli hook exploded" in ran.stderr


def test_blocking_and_strict_mode(plugin_python: Path) -> None:
    blocked = run_cli(
        ["jobs"],
        python=plugin_python,
        env=clean_env(THESEUS_BLOCK_PLUGINS="theseus-fixture-broken, theseus-fixture-dup-b"),
    )
    assert blocked.returncode == 0
    assert "theseus-fixture-broken" not in blocked.stderr and "fixture/broken" not in blocked.stdout
    assert "fixture/dup" in blocked.stdout and "provided by both" not in blocked.stderr
    plugins = run_cli(["plugins"], python=plugin_python, env=clean_env(THESEUS_BLOCK_PLUGINS="theseus-fixture-broken"))
    assert any(line.startswith("theseus-fixture-broken") and "blocked" in line for line in plugins.stdout.splitlines())
    strict = run_cli(["jobs"], python=plugin_python, env=clean_env(THESEUS_STRICT_PLUGINS="1"))
    assert (
        strict.returncode == 2
        and "theseus-fixture-broken" in strict.stderr
        and "THESEUS_STRICT_PLUGINS" in strict.stderr
    )
    assert "Traceback" not in strict.stderr


def test_a_raising_hook_is_skipped_and_the_other_plugins_keep_working(plugin_python: Path) -> None:
    ran = run_cli(["fixture-hello"], python=plugin_python)  # theseus-fixture-badhook's CLI hook raises
    assert ran.returncode == 0, ran.stderr
    assert "hello from theseus-fixture-good" in ran.stdout
    warned = [line for line in ran.stderr.splitlines() if "theseus-fixture-badhook" in line]
    assert len(warned) == 1 and warned[0].startswith("warning: plugin hook theseus_cli_commands of ")
    assert "raised RuntimeError: cli hook exploded" in warned[0] and "Traceback" not in ran.stderr
    shown = run_cli(["plugins"], python=plugin_python)
    row = next(line for line in shown.stdout.splitlines() if line.startswith("theseus-fixture-badhook"))
    assert "theseus_cli_commands" in row and "1 failed" in row
    assert "  theseus-fixture-badhook: plugin hook theseus_cli_commands" in shown.stdout
    quiet = "theseus-fixture-broken,theseus-fixture-badargs,theseus-fixture-exits"
    strict = run_cli(
        ["fixture-hello"], python=plugin_python, env=clean_env(THESEUS_STRICT_PLUGINS="1", THESEUS_BLOCK_PLUGINS=quiet)
    )
    assert strict.returncode == 2 and "hello from" not in strict.stdout
    assert strict.stderr.strip().startswith("error: plugin hook theseus_cli_commands of theseus-fixture-badhook")
    assert strict.stderr.strip().endswith("(THESEUS_STRICT_PLUGINS is set)") and strict.stderr.count("\n") == 1


def test_a_hook_with_a_wrong_argument_name_is_one_line_naming_its_distribution(plugin_python: Path) -> None:
    jobs = run_cli(["jobs"], python=plugin_python)
    assert jobs.returncode == 0 and "fixture/badargs" in jobs.stdout  # its jobs still work
    lines = [line for line in jobs.stderr.splitlines() if "theseus-fixture-badargs" in line]
    assert len(lines) == 1, jobs.stderr
    assert lines[0].startswith("warning: plugin 'plugin/fixture-badargs' from theseus-fixture-badargs does not match")
    assert "theseus_gather(ownr)" in lines[0] and "Argument(s) {'ownr'}" in lines[0]
    ran = run_cli(["run", "fixture/badargs", "--root", "/nonexistent-unused"], python=plugin_python)
    assert ran.returncode == 0 and "fine" in ran.stdout
    shown = run_cli(["plugins"], python=plugin_python)
    row = next(line for line in shown.stdout.splitlines() if line.startswith("theseus-fixture-badargs"))
    assert row.split()[-2:] == ["1", "failed"]


def test_a_plugin_that_exits_at_import_is_named_and_skipped(plugin_python: Path) -> None:
    """``sys.exit(3)`` in a plugin's import used to end every command with exit 3 and no output."""
    jobs = run_cli(["jobs"], python=plugin_python)
    assert jobs.returncode == 0, jobs.stderr
    assert "fixture/hello" in jobs.stdout
    assert "theseus-fixture-exits" in jobs.stderr and "SystemExit: 3" in jobs.stderr
    assert "THESEUS_BLOCK_PLUGINS=theseus-fixture-exits" in jobs.stderr
    strict = run_cli(["jobs"], python=plugin_python, env=clean_env(THESEUS_STRICT_PLUGINS="1"))
    assert strict.returncode == 2 and "Traceback" not in strict.stderr
