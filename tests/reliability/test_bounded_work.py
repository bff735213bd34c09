"""Inputs that once made a command run forever: a YAML file of nested aliases (a "billion laughs"). It now
ends within seconds, in one line naming the file. The tests run under timeouts, so a hang fails them
instead of stopping the suite.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import error_line, train_args
from theseus.config import read_yaml, yaml_limits
from theseus.errors import ConfigError
from theseus.runs import records

Cli = Callable[[list[str]], tuple[int, str]]
#: The module (``theseus.config.configuration`` is also the name of a function the package exports).
CONFIGURATION = importlib.import_module("theseus.config.configuration")

#: Nine anchors, each a list of nine of the one before: 9**9 (387 million) values in ten short lines.
LAUGHS = 'a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]\n' + "".join(
    f"{name}: &{name} [{', '.join(f'*{before}' for _ in range(9))}]\n"
    for before, name in zip("abcdefgh", "bcdefghi", strict=True)
)
BOUND = (
    "stands for more than 100,000 values once its aliases are expanded (nested anchors and aliases); "
    "write the values out without anchors and aliases"
)


# -- YAML ------------------------------------------------------------------------------------------


def test_expanded_values_are_counted_once_per_node() -> None:
    assert yaml_limits.expanded_values("a: 1\nb: [1, 2]") == 7  # the mapping, two keys, 1, the list and its two
    assert yaml_limits.expanded_values("x: &x [1, 2]\ny: [*x, *x]") == 13  # an alias counts what it stands for
    assert yaml_limits.expanded_values(LAUGHS) == yaml_limits.MAX_VALUES + 1  # counted up to just past the bound
    assert yaml_limits.expanded_values("a: &a [1, *a]") is None  # a value that contains itself
    assert yaml_limits.expanded_values("a: [unclosed") == 0  # left to the loader to report


@pytest.mark.timeout(30)
def test_a_billion_laughs_config_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(LAUGHS + "a: 1\n")  # a key given twice: the message once walked every alias
    with pytest.raises(ConfigError) as refused:
        read_yaml(path)
    assert str(refused.value) == f"config file {str(path)!r} {BOUND}"
    assert records.read_yaml(path) == {}  # listings read it as unreadable and go on
    assert CONFIGURATION._duplicate_key(LAUGHS + "a: 1\n") == "key 'a' given twice, at lines 1 and 10"


def test_a_value_that_contains_itself_and_an_oversized_file_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "self.yaml"
    path.write_text("training: &t\n  steps: *t\n")
    with pytest.raises(ConfigError, match="has an alias inside the anchor it names"):
        read_yaml(path)
    monkeypatch.setattr(yaml_limits, "MAX_BYTES", 16)
    path.write_text("training:\n  steps: 3\n")  # 23 bytes
    with pytest.raises(ConfigError, match="is larger than 0 MiB"):
        read_yaml(path)


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("compilation_cache")
def test_a_billion_laughs_in_config_or_in_a_run_folder_stops_run_resume_and_runs_show(
    cli: Cli, root: Path, tmp_path: Path
) -> None:
    config = tmp_path / "laughs.yaml"
    config.write_text(LAUGHS)
    code, err = cli(train_args(root, "--config", str(config)))
    assert code == 2 and error_line(err) == f"error: config file {str(config)!r} {BOUND}"
    run = root / "runs" / "laughs"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(LAUGHS)
    code, err = cli(train_args(root, "run/name=laughs"))  # resuming reads the run's config.yaml
    assert code == 2 and error_line(err) == f"error: config file {str(run / 'config.yaml')!r} {BOUND}"
    code, _ = cli(["runs", "show", "laughs", "--root", str(root)])
    assert code == 0
