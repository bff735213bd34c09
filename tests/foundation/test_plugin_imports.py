"""Plugins cannot slow the CLI down unnamed: slow hook imports, metadata-only help, shadowed names.

Each test puts a small distribution (a ``*.dist-info`` folder and its module) on ``sys.path`` and
runs the CLI in-process, so that no virtual environment has to be built.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from theseus.cli.main import main
from theseus.errors import PluginError
from theseus.plugins import reset
from theseus.registry import Registry

SLOW_HOOKS = """
import time

import click

from theseus.plugins import hookimpl

time.sleep(0.4)


@hookimpl
def theseus_cli_commands():
    @click.command("{command}")
    def hello():
        click.echo("hello from {dist}")

    return [hello]
"""

SHADOW = """
class AdamW:
    config = None

    @staticmethod
    def factory(config):
        raise AssertionError("the shadowing optimizer ran")
"""


def install(root: Path, dist: str, module: str, source: str, entry_points: dict[str, str]) -> None:
    """Write ``dist`` 1.0 (``theseus.components`` entry points) and its module ``module`` under ``root``."""
    info = root / f"{dist.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[theseus.components]\n{lines}")
    (root / f"{module}.py").write_text(source)


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """``theseus ARGS`` in-process: exit code, stdout, stderr."""
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A folder on ``sys.path`` for fake distributions; plugins rediscovered around the test."""
    for name in ("THESEUS_STRICT_PLUGINS", "THESEUS_BLOCK_PLUGINS", "THESEUS_PLUGIN_IMPORT_NOTICE_S"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    reset()
    yield tmp_path
    reset()
    for name in set(sys.modules) - before:
        if name.startswith("theseus_fixture_"):
            del sys.modules[name]


def test_a_slow_plugin_import_is_named_in_one_line_and_help_imports_no_plugin(
    site: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = "theseus_fixture_slow_hooks"
    source = SLOW_HOOKS.format(command="fixture-slow-hello", dist="theseus-fixture-slow")
    install(site, "theseus-fixture-slow", module, source, {"plugin/fixture-slow": module})
    monkeypatch.setenv("THESEUS_PLUGIN_IMPORT_NOTICE_S", "0.2")

    code, out, err = cli(["--help"], capsys)
    assert code == 0 and "jobs " in out and "'theseus plugins' lists them." in " ".join(out.split())
    assert module not in sys.modules and err == ""  # listing the commands imported no plugin

    code, out, err = cli(["jobs"], capsys)
    assert code == 0 and "JOB" in out
    notices = [line for line in err.splitlines() if line.startswith("notice:")]
    assert len(notices) == 1, err
    assert re.fullmatch(
        r"notice: plugin 'plugin/fixture-slow' from theseus-fixture-slow took 0\.[4-9] s to import "
        r"\(bound 0\.2 s, THESEUS_PLUGIN_IMPORT_NOTICE_S\); every command imports it: keep the module light, "
        r"or block it with THESEUS_BLOCK_PLUGINS=theseus-fixture-slow",
        notices[0],
    ), notices[0]

    code, out, err = cli(["fixture-slow-hello"], capsys)  # a hook's command runs; imported once per process
    assert (code, out, err) == (0, "hello from theseus-fixture-slow\n", "")
    code, out, err = cli(["jbos"], capsys)
    assert code == 2 and err == "error: no command 'jbos'; did you mean 'jobs'?\n"
    code, out, err = cli(["plugins"], capsys)
    assert code == 0 and "plugin commands: fixture-slow-hello (theseus-fixture-slow)" in out.splitlines()


def test_the_notice_bound_is_configurable(
    site: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = "theseus_fixture_slow_quiet"
    source = SLOW_HOOKS.format(command="fixture-quiet-hello", dist="theseus-fixture-quiet")
    install(site, "theseus-fixture-quiet", module, source, {"plugin/fixture-quiet": module})
    monkeypatch.setenv("THESEUS_PLUGIN_IMPORT_NOTICE_S", "0")  # 0 turns the notice off
    code, _out, err = cli(["jobs"], capsys)
    assert code == 0 and "notice:" not in err and module in sys.modules


def test_a_shadowed_component_says_which_provider_runs_and_that_one_runs(
    site: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = "theseus_fixture_shadow_optim"
    install(site, "theseus-fixture-shadow", module, SHADOW, {"optimizer/adamw": f"{module}:AdamW"})
    code, out, err = cli(["components", "--kind", "optimizer"], capsys)
    assert code == 0
    row = next(line for line in out.splitlines() if line.startswith("optimizer/adamw "))
    assert row.split()[1] == "theseus-core"
    assert (
        "warning: component 'optimizer/adamw' is provided by both theseus-core and theseus-fixture-shadow; "
        "theseus-core's (theseus.training.optimizers:AdamW) is used; to silence this, uninstall "
        "theseus-fixture-shadow or block it with THESEUS_BLOCK_PLUGINS=theseus-fixture-shadow"
    ) in err.splitlines()

    from theseus.training import selection
    from theseus.training.optimizers import AdamW

    assert selection.load("optimizer", "adamw", "optimizer=adamw") is AdamW  # what optimizer=adamw trains with
    assert module not in sys.modules  # the shadowed provider is never imported


@pytest.mark.parametrize("order", [("zeta", "alpha", "theseus-core"), ("theseus-core", "zeta", "alpha")])
def test_the_provider_of_a_component_name_does_not_depend_on_discovery_order(order: tuple[str, ...]) -> None:
    registry = Registry()
    for dist in order:
        registry.add_component("model/x", f"{dist.replace('-', '_')}:X", distribution=dist, version="1")
    assert registry.component("model", "x").distribution == "theseus-core"
    plugins_only = Registry()
    for dist in [d for d in order if d != "theseus-core"]:
        plugins_only.add_component("model/x", f"{dist}:X", distribution=dist, version="1")
    assert plugins_only.component("model", "x").distribution == "alpha"
    assert plugins_only.conflict_warnings() == [
        "component 'model/x' is provided by both alpha and zeta; alpha's (alpha:X) is used; "
        "to silence this, uninstall zeta or block it with THESEUS_BLOCK_PLUGINS=zeta"
    ]


def test_a_bad_notice_bound_warns_once_and_keeps_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from theseus.plugins.entries import notice_bound

    monkeypatch.setenv("THESEUS_PLUGIN_IMPORT_NOTICE_S", "two-ish")
    assert (notice_bound(), notice_bound()) == (2.0, 2.0)
    assert capsys.readouterr().err == (
        "warning: THESEUS_PLUGIN_IMPORT_NOTICE_S='two-ish' is not a number of seconds; using 2\n"
    )


@pytest.mark.parametrize("order", [("theseus-core", "claimer"), ("claimer", "theseus-core")])
def test_a_plugin_cannot_take_a_built_in_job_name(order: tuple[str, ...]) -> None:
    registry = Registry()
    for dist in order:
        registry.add_job("train/pretrain", f"{dist.replace('-', '_')}:Trainer", distribution=dist, version="1")
    assert registry.job("train/pretrain").distribution == "theseus-core"  # not "provided by both": runnable
    assert registry.conflict_warnings() == [
        "job 'train/pretrain' is provided by both claimer and theseus-core; theseus-core's (theseus_core:Trainer) "
        "is used; to silence this, uninstall claimer or block it with THESEUS_BLOCK_PLUGINS=claimer"
    ]
    plugins_only = Registry()  # two plugins claiming one new name: neither runs
    for dist in ("alpha", "zeta"):
        plugins_only.add_job("x/job", f"{dist}:Job", distribution=dist, version="1")
    with pytest.raises(PluginError, match=r"job 'x/job' is provided by both alpha \(alpha:Job\) and zeta"):
        plugins_only.job("x/job")
