"""Configuration: fields, schemas, YAML round trip, overrides and every error path."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Literal

import pytest

from theseus.config import (
    MISSING,
    Configuration,
    Schema,
    configuration,
    configure,
    current_configuration,
    field,
    load,
    parse_overrides,
    read_yaml,
    resolve,
    write_yaml,
)
from theseus.errors import ConfigError


@dataclasses.dataclass
class Training:
    lr: float = field("training/lr", default=3e-4, help="peak learning rate")
    steps: int = field("training/steps", default=100)
    name: str = field("run/name", default="demo")
    layers: list[int] = field("architecture/layers", default_factory=lambda: [1, 2])
    precise: bool = field("training/precise", default=False)
    mode: Literal["a", "b"] = field("training/mode", default="a")
    budget: int | None = field("training/budget", default=None)
    not_configured: int = 7


@dataclasses.dataclass
class Required:
    root: str = field("data/root")
    steps: int = field("training/steps", default=100)


@dataclasses.dataclass
class OtherDefault:
    steps: int = field("training/steps", default=200)


@dataclasses.dataclass
class OtherType:
    steps: float = field("training/steps", default=100.0)


def test_schema_collects_keys_types_and_defaults() -> None:
    schema = Schema.build([Training, Required])
    assert schema.keys() == [
        "architecture/layers",
        "data/root",
        "run/name",
        "training/budget",
        "training/lr",
        "training/mode",
        "training/precise",
        "training/steps",
    ]
    assert schema["training/lr"].default == 3e-4
    assert schema["training/lr"].help == "peak learning rate"
    assert schema["data/root"].required
    assert schema.owners("training/steps") == [Training, Required]
    assert schema.defaults()["data/root"] is MISSING


def test_duplicate_keys_must_agree_on_default_and_type() -> None:
    with pytest.raises(ConfigError, match=r"'training/steps' has default 100 in .*Training but 200 in .*OtherDefault"):
        Schema.build([Training, OtherDefault])
    with pytest.raises(ConfigError, match=r"'training/steps' has type int in .*Training but float in .*OtherType"):
        Schema.build([Training, OtherType])


def test_key_cannot_be_value_and_section() -> None:
    @dataclasses.dataclass
    class Section:
        x: int = field("training/steps/inner", default=1)

    with pytest.raises(ConfigError, match="cannot be both a value and a section"):
        Schema.build([Training, Section])


def test_invalid_field_declarations() -> None:
    with pytest.raises(ConfigError, match="invalid configuration key"):
        field("bad key", default=1)
    with pytest.raises(ConfigError, match="default_factory"):
        field("a/b", default=[1])


def test_overrides_are_coerced_to_field_types() -> None:
    schema = Schema.build([Training])
    cfg = load(
        schema,
        overrides=[
            "training/lr=1e-3",
            "training.steps=5",
            "architecture/layers=[3, 4]",
            "training/precise=true",
            "run/name=123",
            "training/budget=null",
        ],
    )
    assert cfg["training/lr"] == pytest.approx(1e-3)
    assert cfg["training/steps"] == 5 and isinstance(cfg["training/steps"], int)
    assert cfg["architecture/layers"] == [3, 4]
    assert cfg["training/precise"] is True
    assert cfg["run/name"] == "123"
    assert cfg["training/budget"] is None


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("training/steps=many", r"training/steps: expected int, got 'many'"),
        ("training/lr=[1]", r"training/lr: expected float"),
        ("training/precise=maybe", r"training/precise: expected bool"),
        ("training/mode=c", r"training/mode: 'c' is not one of 'a', 'b'"),
        (
            "training/stpes=3",
            r"unknown configuration key 'training/stpes' \(override\); did you mean 'training/steps'\?",
        ),
        ("training/steps", r"override 'training/steps' is not of the form key=value"),
        ("=3", r"is not of the form key=value"),
    ],
)
def test_override_errors(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load(Schema.build([Training]), overrides=[override])


def test_missing_required_value() -> None:
    with pytest.raises(
        ConfigError, match=r"missing required configuration value 'data/root' \(str\); pass data/root=<value>"
    ):
        load(Schema.build([Required]))
    assert load(Schema.build([Required]), overrides=["data/root=/x"])["data/root"] == "/x"


def test_yaml_round_trip(tmp_path: Path) -> None:
    schema = Schema.build([Training, Required])
    values = schema.defaults()
    values["training/steps"] = 9
    path = write_yaml(values, tmp_path / "sub" / "cfg.yaml", schema)
    text = path.read_text()
    assert "training:\n" in text and "steps: 9" in text
    assert "# required (replace ???): data/root" in text
    flat = read_yaml(path)
    assert flat["training/steps"] == 9 and flat["architecture/layers"] == [1, 2] and flat["data/root"] == "???"
    with pytest.raises(ConfigError, match="missing required configuration value 'data/root'"):
        load(schema, path)
    cfg = load(schema, path, ["data/root=/data"])
    assert cfg["training/steps"] == 9 and cfg["data/root"] == "/data"
    # the written file round-trips to the same resolved configuration
    write_yaml(dict(cfg), tmp_path / "again.yaml", schema)
    assert load(schema, tmp_path / "again.yaml") == cfg


def test_yaml_errors(tmp_path: Path) -> None:
    schema = Schema.build([Training])
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  steps: [1, 2\n")
    with pytest.raises(ConfigError, match=r"is not valid YAML"):
        load(schema, bad)
    listing = tmp_path / "list.yaml"
    listing.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load(schema, listing)
    with pytest.raises(ConfigError, match="does not exist; write one with 'theseus configure"):
        load(schema, tmp_path / "absent.yaml")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("training:\n  stepz: 3\n")
    with pytest.raises(ConfigError, match=r"unknown configuration key 'training/stepz' \(config file\); did you mean"):
        load(schema, unknown)


def test_yaml_is_loaded_safely(tmp_path: Path) -> None:
    evil = tmp_path / "evil.yaml"
    evil.write_text("run:\n  name: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(Schema.build([Training]), evil)


def test_configure_reads_active_configuration() -> None:
    schema = Schema.build([Training])
    cfg = resolve(schema, overrides={"training/steps": 11})
    assert configure(Training).steps == 100
    with configuration(cfg):
        assert current_configuration() is cfg
        built = configure(Training)
        assert built.steps == 11 and built.not_configured == 7
        assert configure(Training, steps=3).steps == 3
    assert current_configuration() is None
    with pytest.raises(ConfigError, match="missing required configuration value 'data/root' for Required"):
        configure(Required)


def test_configuration_is_hashable_mapping() -> None:
    a = Configuration({"a/b": [1, 2], "c": {"d": 1}})
    b = Configuration({"a/b": [1, 2], "c": {"d": 1}})
    assert a == b and hash(a) == hash(b)
    assert a.with_values({"a/b": [3]})["a/b"] == [3]


def test_parse_overrides_accepts_dots_and_slashes() -> None:
    assert parse_overrides(["a.b=1", "c/d=x", "e="]) == {"a/b": 1, "c/d": "x", "e": ""}


def test_colons_keep_a_value_text() -> None:
    """YAML 1.1 reads ``2:3`` as the base-60 number 123 (``training/profile=2:3`` became ``"123"``)."""
    assert parse_overrides(["w=2:3", "t=10:30:00", "n=12", "f=1.5e-3"]) == {
        "w": "2:3",
        "t": "10:30:00",
        "n": 12,
        "f": 1.5e-3,
    }


def test_job_defaults_replace_declared_defaults() -> None:
    from theseus.base.job import Job

    class Short(Job):
        CONFIG = Training
        DEFAULTS = {"training/steps": "7"}

    schema = Short.schema()
    assert schema["training/steps"].default == 7
    assert resolve(schema)["training/steps"] == 7
    assert resolve(schema, overrides={"training/steps": 9})["training/steps"] == 9

    class Typo(Job):
        CONFIG = Training
        DEFAULTS = {"training/stepz": 1}

    with pytest.raises(ConfigError, match=r"Typo.DEFAULTS sets 'training/stepz'.*did you mean 'training/steps'"):
        Typo.schema()

    class BadType(Job):
        CONFIG = Training
        DEFAULTS = {"training/steps": "many"}

    with pytest.raises(ConfigError, match="training/steps: expected int"):
        BadType.schema()


def test_configure_replaces_only_a_regular_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``theseus configure OUT`` once renamed its file over whatever OUT was: a device, a pipe, a link."""
    from theseus.cli.main import main

    target = tmp_path / "target.txt"
    target.write_text("kept")
    link, pipe, regular = tmp_path / "link.yaml", tmp_path / "pipe.yaml", tmp_path / "old.yaml"
    link.symlink_to(target)
    os.mkfifo(pipe)
    regular.write_text("old")
    for out, kind in ((link, "a symbolic link"), (pipe, "not a regular file")):
        with pytest.raises(SystemExit) as ended:
            main(["configure", "train/pretrain", str(out)])
        assert ended.value.code == 2
        assert capsys.readouterr().err == (
            f"error: {str(out)!r} is {kind}, which theseus does not write through; move it away, or write to "
            "another name\n"
        )
    assert link.is_symlink() and target.read_text() == "kept" and pipe.is_fifo()
    write_yaml({"a/b": 1}, regular)
    assert regular.read_text().endswith("a:\n  b: 1\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.yaml", "old.yaml", "pipe.yaml", "target.txt"]
