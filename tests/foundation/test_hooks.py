"""Hooks are called through pluggy: ordering, firstresult, wrappers, validation, failures by distribution."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, clean_env
from theseus.base.job import Job
from theseus.errors import PluginError
from theseus.plugins import hookimpl, hookspec, plugins, register_hooks, reset
from theseus.plugins.compat import satisfies, target_of
from theseus.plugins.installed import COMPONENTS_GROUP, JOBS_GROUP, Provider, providers
from theseus.registry import LOCAL, Registry, get_registry, job


class Specs:
    """Hooks that exist only in these tests."""

    @hookspec(firstresult=True)
    def theseus_test_pick(self, value: int) -> Any: ...

    @hookspec
    def theseus_test_collect(self, value: int) -> Any: ...


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A freshly discovered plugin manager with the test hooks, forgotten afterwards."""
    monkeypatch.delenv("THESEUS_STRICT_PLUGINS", raising=False)
    reset()
    p = plugins()
    p.manager.add_hookspecs(Specs)
    yield p
    reset()


class Returns:
    def __init__(self, value: Any, **opts: Any) -> None:
        self.value = value
        impl = hookimpl(**opts)(lambda value: self.value)
        self.theseus_test_pick = impl
        self.theseus_test_collect = impl


class Raises:
    @hookimpl
    def theseus_test_pick(self, value: int) -> Any:
        raise RuntimeError("pick exploded")

    @hookimpl
    def theseus_test_collect(self, value: int) -> Any:
        raise RuntimeError("collect exploded")


class Doubles:
    """A wrapper: sees the others' result and replaces it."""

    @hookimpl(wrapper=True)
    def theseus_test_collect(self, value: int) -> Any:
        results = yield
        return [*results, value * 2]


def test_firstresult_and_ordering_follow_pluggy(fresh: Any) -> None:
    register_hooks(Returns("last", trylast=True), "last", distribution="dist-last")
    register_hooks(Returns(None, tryfirst=True), "none-first", distribution="dist-none")
    register_hooks(Returns("plain"), "plain", distribution="dist-plain")
    # tryfirst gives None, so the next implementation's value is the one result
    assert fresh.manager.hook.theseus_test_pick(value=1) == "plain"
    assert fresh.call("theseus_test_pick", value=1) == [("dist-plain", "plain")]
    assert [value for _, value in fresh.call("theseus_test_collect", value=1)] == ["plain", "last"]


def test_a_wrapper_sees_and_changes_the_result(fresh: Any) -> None:
    register_hooks(Returns("a"), "a", distribution="dist-a")
    register_hooks(Doubles(), "doubles", distribution="dist-doubles")
    assert fresh.call("theseus_test_collect", value=4) == [("dist-a", "a"), ("dist-doubles", 8)]


def test_a_raising_hook_is_reported_by_distribution_and_skipped(fresh: Any, capsys: pytest.CaptureFixture[str]) -> None:
    register_hooks(Returns("kept", trylast=True), "kept", distribution="dist-kept")
    register_hooks(Raises(), "raises", distribution="dist-broken")
    register_hooks(Doubles(), "doubles", distribution="dist-doubles")
    assert fresh.manager.hook.theseus_test_pick(value=1) == "kept"
    assert [value for _, value in fresh.call("theseus_test_collect", value=3)] == ["kept", 6]
    fresh.call("theseus_test_collect", value=3)  # reported once, not on every call
    failures = [f for f in fresh.registry.failures if f.distribution == "dist-broken"]
    assert [f.entry for f in failures] == ["theseus_test_pick", "theseus_test_collect"]
    assert "raised RuntimeError: collect exploded" in failures[1].message
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2 and all(w.startswith("warning: plugin hook theseus_test_") for w in warnings)
    assert all("dist-broken" in w and "THESEUS_BLOCK_PLUGINS=dist-broken" in w for w in warnings)


def test_a_failing_wrapper_leaves_the_result_as_it_was(fresh: Any) -> None:
    class Breaks:
        @hookimpl(wrapper=True)
        def theseus_test_collect(self, value: int) -> Any:
            yield
            raise ValueError("teardown exploded")

    register_hooks(Returns("a"), "a", distribution="dist-a")
    register_hooks(Breaks(), "breaks", distribution="dist-breaks")
    assert fresh.call("theseus_test_collect", value=1) == [("dist-a", "a")]
    assert any("teardown exploded" in f.message and f.distribution == "dist-breaks" for f in fresh.registry.failures)


def test_strict_mode_makes_a_raising_hook_fatal(fresh: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    register_hooks(Raises(), "raises", distribution="dist-broken")
    monkeypatch.setenv("THESEUS_STRICT_PLUGINS", "1")
    with pytest.raises(PluginError, match=r"dist-broken raised RuntimeError: pick exploded.*STRICT"):
        fresh.manager.hook.theseus_test_pick(value=1)


@pytest.mark.parametrize(
    ("hooks", "message"),
    [
        (
            type("BadArgs", (), {"theseus_gather": hookimpl(lambda self, ownr: None)}),
            "Argument(s) {'ownr'} are declared in the hookimpl but can not be found in the hookspec",
        ),
        (
            type("Typo", (), {"theseus_gahter": hookimpl(lambda self, owner: None)}),
            "implements 'theseus_gahter', which is not a theseus hook (did you mean 'theseus_gather'?)",
        ),
        (
            type("OldStyle", (), {"theseus_gather": hookimpl(hookwrapper=True)(lambda self, owner: (yield))}),
            "hookwrapper=True, which theseus does not support; use @hookimpl(wrapper=True)",
        ),
    ],
)
def test_hooks_pluggy_refuses_are_one_line_naming_the_distribution(fresh: Any, hooks: type, message: str) -> None:
    with pytest.raises(PluginError) as raised:
        register_hooks(hooks(), "refused", distribution="dist-refused")
    text = str(raised.value)
    assert "\n" not in text and "dist-refused" in text and message in text
    assert fresh.manager.get_plugin("refused") is None and "refused" not in fresh.hook_owners


def test_registrations_are_attributed_to_the_plugin_that_makes_them(fresh: Any) -> None:
    class Registers:
        @hookimpl
        def theseus_register(self, registry: Registry) -> None:
            registry.add_job("test/attributed", "tests.nowhere:Job")

    register_hooks(Registers(), "registers", distribution="dist-registers")  # historic: called on registration
    assert fresh.registry.jobs["test/attributed"].distribution == "dist-registers"
    assert "theseus_register" in fresh.hooks_of("dist-registers")


def test_job_decorator_registers_through_the_register_hook(fresh: Any) -> None:
    @job("test/decorated")
    class Decorated(Job):
        def run(self) -> None:
            pass

    name = f"{LOCAL}:job:test/decorated"
    assert fresh.manager.get_plugin(name) is not None and fresh.hook_owners[name] == LOCAL
    assert get_registry().load_job("test/decorated") is Decorated
    reset()  # a new discovery registers it again
    assert plugins().manager.get_plugin(name) is not None
    assert get_registry().jobs["test/decorated"].distribution == LOCAL

    @job("test/decorated")
    class Again(Job):  # a re-imported file replaces its own registration
        def run(self) -> None:
            pass

    assert get_registry().load_job("test/decorated") is Again


def test_the_registry_takes_its_base_types_from_the_caller() -> None:
    class Base:
        pass

    class Child(Base):
        pass

    registry = Registry({"model": Base})
    registry.add_component("model/child", Child)
    with pytest.raises(PluginError, match=r"is not a .*Base subclass \(got type\)"):
        registry.add_component("model/other", int)
    registry.add_component("layer/int", int)  # a kind without a base type is checked by shape only
    assert Registry().bases == {}


def test_registry_and_plugins_import_no_model_code() -> None:
    core = REPO / "theseus-core" / "src" / "theseus"
    for path in [*(core / "registry").glob("*.py"), *(core / "plugins").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.startswith("theseus.model") for n in names), (path, names)


def test_providers_agree_with_importlib_metadata() -> None:
    expected: dict[str, set[tuple[str, str, str]]] = {}
    for group in (JOBS_GROUP, COMPONENTS_GROUP):
        for ep in metadata.entry_points(group=group):
            assert ep.dist is not None
            expected.setdefault(ep.dist.name, set()).add((group, ep.name, ep.value))
    found = {p.name: p for p in providers()}
    assert {name: set(p.entry_points) for name, p in found.items()} == expected
    for name, p in found.items():
        assert p.version == metadata.version(name)
        assert sorted(p.requires) == sorted(metadata.requires(name) or [])


@pytest.mark.parametrize("version", ["0.1.0", "0.1", "0.2.0", "1.0", "0.1.0rc1", "0.1.0.post1", "0.0.9"])
@pytest.mark.parametrize("spec", [">=0.1,<0.2", ">=0.1.0", "==0.1", "!=0.1.0", "<0.1", ">0.1", "~=0.1", "==0.1.*"])
def test_version_check_agrees_with_packaging(spec: str, version: str) -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    assert satisfies(spec, version) == SpecifierSet(spec).contains(Version(version), prereleases=True)


@pytest.mark.parametrize(
    ("line", "shown", "compatible"),
    [
        ("theseus-core>=0.1,<0.2", ">=0.1,<0.2", True),
        ("Theseus_Core (<0.2, >=0.1)", ">=0.1,<0.2", True),
        ("theseus-core[hf] >=0.0.1,<0.1", ">=0.0.1,<0.1", False),
        ('theseus-core<0.1; extra == "old"', "", True),  # only under an extra: not a target
        ('theseus-core~=0.1; python_version >= "3"', "~=0.1", True),
        ("theseus-core", "", True),
    ],
)
def test_the_core_requirement_is_read_without_packaging_where_it_can_be(
    line: str, shown: str, compatible: bool
) -> None:
    target = target_of(Provider("p", "1", ("numpy>=1", line), ()), core="0.1.0")
    assert (target.requirement, target.compatible) == (shown, compatible)


def test_listing_reads_no_full_metadata_and_imports_no_packaging(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from theseus.cli.main import main\n"
        "main(['jobs'])\n"
        "slow = ('importlib.metadata', 'email.parser', 'packaging.requirements', 'jax')\n"
        "print('SLOW', [m for m in slow if m in sys.modules])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "SLOW []" in done.stdout
