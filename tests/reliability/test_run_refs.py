"""``NAME[@STEP]``, the one way every setting names a run's checkpoint (``generate/run``, ``eval/run``,
``hf/run``, ``training/init_from=run:``, ``distill/teacher=run:``): parsed and resolved by
``theseus.runs.ref.RunRef``, each mistake one line naming what is there."""

from __future__ import annotations

from pathlib import Path

import pytest

from theseus.errors import CheckpointError, ConfigError, PluginError
from theseus.plugins.registry import Registry
from theseus.registry import get_registry
from theseus.runs.ref import RunRef
from theseus.training.sources import parse_source, source_model_class, source_reader


def make_run(root: Path, name: str, steps: tuple[int, ...] = ()) -> Path:
    """A run folder with its configuration and committed checkpoints at ``steps`` (no state inside)."""
    folder = root / "runs" / name
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("{}\n")
    for step in steps:
        (folder / "checkpoints" / str(step) / "state").mkdir(parents=True)
        (folder / "checkpoints" / str(step) / "commit_success.txt").write_text("")
    return folder


def test_a_reference_is_a_name_and_an_optional_step(tmp_path: Path) -> None:
    assert RunRef.parse("small", tmp_path, key="generate/run") == RunRef("small", None, tmp_path)
    assert RunRef.parse(" small@1000 ", tmp_path) == RunRef("small", 1000, tmp_path)
    assert RunRef.parse("", tmp_path) == RunRef("", None, tmp_path)
    assert str(RunRef("small", 1000, tmp_path)) == "small@1000" and str(RunRef("small", None, tmp_path)) == "small"
    with pytest.raises(ConfigError, match=r"^eval/run=a@x: after '@' comes a checkpoint step, e.g. a@1000$"):
        RunRef.parse("a@x", tmp_path, key="eval/run")
    with pytest.raises(ConfigError, match=r"^generate/run=a@-1: after '@' comes a checkpoint step"):
        RunRef.parse("a@-1", tmp_path, key="generate/run")


def test_a_separate_step_setting_agrees_or_is_refused(tmp_path: Path) -> None:
    ref = RunRef.parse("small", tmp_path, key="generate/run")
    assert ref.at(-1, step_key="generate/step") == ref  # -1: not given
    assert ref.at(200, step_key="generate/step") == RunRef("small", 200, tmp_path)
    assert RunRef.parse("small@200", tmp_path, key="hf/run").at(200, step_key="hf/step").step == 200
    with pytest.raises(ConfigError) as refused:
        RunRef.parse("small@200", tmp_path, key="hf/run").at(300, step_key="hf/step")
    assert str(refused.value) == (
        "hf/run=small@200 and hf/step=300 name different checkpoints; give the step once: hf/run=small@STEP"
    )


def test_resolving_chooses_the_only_run_and_the_latest_checkpoint(tmp_path: Path) -> None:
    make_run(tmp_path, "small", (1000, 2000))
    resolved = RunRef.parse("", tmp_path, key="generate/run").resolve()
    assert (resolved.name, resolved.step, resolved.root) == ("small", 2000, tmp_path.absolute())
    assert resolved.state == tmp_path / "runs" / "small" / "checkpoints" / "2000" / "state"
    assert RunRef.parse("small@1000", tmp_path).resolve().checkpoint == 1000


def test_resolving_mistakes_are_one_line_naming_what_is_there(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=rf"^no training runs under {runs}; train one first"):
        RunRef.parse("", tmp_path, key="generate/run").resolve()
    make_run(tmp_path, "small", (1000, 2000))
    fresh = make_run(tmp_path, "fresh")
    cases: list[tuple[str, type[Exception], str]] = [
        ("", ConfigError, f"several runs under {runs}; choose one with eval/run=<name> (fresh, small)"),
        ("smal", ConfigError, f"no run 'smal' under {runs} (available: fresh, small)"),
        ("../small", ConfigError, f"no run '../small' under {runs} (available: fresh, small)"),
        ("small@1500", CheckpointError, "run 'small' has no checkpoint at step 1500; available steps: 1000, 2000"),
        (
            "fresh",
            CheckpointError,
            f"run 'fresh' has no checkpoint yet in {fresh / 'checkpoints'}; let its training reach a checkpoint first",
        ),
    ]
    for text, error, message in cases:
        with pytest.raises(error) as raised:
            RunRef.parse(text, tmp_path, key="eval/run").resolve()
        assert str(raised.value) == message


def test_init_from_and_the_teacher_read_run_sources_as_references(tmp_path: Path) -> None:
    assert parse_source("run:small@1000", tmp_path) == RunRef("small", 1000, tmp_path)
    assert parse_source("hf:./gpt2", tmp_path) == "./gpt2"
    with pytest.raises(ConfigError, match=r"^training/init_from='small' is not a source; use run:<name>\[@step\]"):
        parse_source("small", tmp_path)
    with pytest.raises(ConfigError, match=r"^training/init_from=run:small@x: after '@' comes a checkpoint step, "):
        parse_source("run:small@x", tmp_path)
    with pytest.raises(ConfigError, match=r"^distill/teacher=run:@5: name the run, as in run:NAME\[@STEP\]$"):
        parse_source("run:@5", tmp_path, key="distill/teacher", what="a teacher")


def test_hf_sources_are_read_by_the_installed_init_source_component() -> None:
    entry = get_registry().component("init_source", "hf")
    assert entry.distribution == "theseus-models"
    assert callable(source_reader("hf", "hf:./gpt2").open)


def own_registry(monkeypatch: pytest.MonkeyPatch, registry: Registry) -> None:
    """``registry`` as the process's, for this test only."""
    from types import SimpleNamespace

    from theseus.plugins import discovery

    monkeypatch.setattr(discovery, "plugins", lambda: SimpleNamespace(registry=registry))


def test_without_theseus_models_an_hf_source_names_the_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    own_registry(monkeypatch, Registry())
    message = (
        r"^training/init_from='hf:./gpt2' reads Hugging Face checkpoints, which needs theseus-models: "
        r"pip install theseus-models$"
    )
    with pytest.raises(ConfigError, match=message):
        source_reader("hf", "hf:./gpt2")
    assert source_model_class("hf:./gpt2", tmp_path) is None  # opening the source later says why


def test_a_blocked_reader_says_it_is_blocked(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = Registry()
    registry.blocked_entries["init_source/hf"] = "theseus-models"
    own_registry(monkeypatch, registry)
    with pytest.raises(
        PluginError, match=r"^component 'init_source/hf' comes from theseus-models, which THESEUS_BLOCK"
    ):
        source_reader("hf", "hf:./gpt2")
