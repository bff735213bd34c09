"""The one reader of JSON theseus did not write itself (``theseus.base.jsonfile``): nesting, size and numbers
are bounded before the parser runs, and a refusal is one line naming the file (and the field of a number)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from theseus.base import jsonfile
from theseus.errors import ConfigError

DEEP = "[" * 100_000 + "]" * 100_000


def refusal(text: str, **kwargs: object) -> str:
    with pytest.raises(jsonfile.UnreadableJSON) as exc:
        jsonfile.parse(text, **kwargs)  # type: ignore[arg-type]
    return exc.value.reason


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (DEEP, "it nests deeper than 64 levels"),
        ('{"a": ' * 100_000 + "1" + "}" * 100_000, "it nests deeper than 64 levels"),
        ("[" * 100_000, "it nests deeper than the parser follows"),  # never closed: the parser's own guard
        ('{"rope_theta": NaN}', 'field "rope_theta" holds NaN, which is not a finite number'),
        ('{"eps": -Infinity}', 'field "eps" holds -Infinity, which is not a finite number'),
        ('{"a": {"factor": 1e999}}', 'field "factor" holds 1e999, which is beyond any finite number'),
        ('{"n_layer": ' + "1" + "0" * 30 + "}", 'field "n_layer" holds an integer of 31 digits, beyond 64 bits'),
        ("[9223372036854775808]", "it holds the integer 9223372036854775808, beyond 64 bits"),
        (b'{"a": "\xff"}', "byte 7 is not UTF-8"),
    ],
)
def test_hostile_text_is_refused_with_its_reason(text: str, reason: str) -> None:
    assert refusal(text) == reason


def test_what_is_within_the_bounds_reads_as_json() -> None:
    nested = "[" * 64 + "]" * 64
    assert jsonfile.parse(nested) == json.loads(nested)  # exactly the limit
    assert refusal("[" * 65 + "]" * 65) == "it nests deeper than 64 levels"
    brackets_in_text = '{"a": "[[[[\\"{{{{", "b": [-9223372036854775808, 1.5]}'
    assert jsonfile.parse(brackets_in_text, max_depth=2) == {"a": '[[[["{{{{', "b": [-(2**63), 1.5]}
    assert jsonfile.parse('{"loss": NaN}', check_numbers=False)["loss"] != 0  # a caller that checks each number


def test_a_deep_file_is_refused_quickly_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "provenance.json"
    path.write_text(DEEP)
    started = time.monotonic()
    with pytest.raises(jsonfile.UnreadableJSON) as exc:
        jsonfile.read(path)
    assert time.monotonic() - started < 2
    assert str(exc.value) == f"{path} is not readable JSON (it nests deeper than 64 levels)"


def test_a_file_over_the_size_limit_is_not_read_past_it(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text('{"pad": "' + "x" * 2000 + '"}')
    with pytest.raises(jsonfile.UnreadableJSON) as exc:
        jsonfile.read(path, max_bytes=1000)
    assert exc.value.reason == "it is larger than 1000 bytes"
    assert jsonfile.read_object(path, max_bytes=4000)["pad"] == "x" * 2000


def test_run_records_go_through_the_reader(tmp_path: Path) -> None:
    from theseus.runs import records

    (tmp_path / "provenance.json").write_text(DEEP)
    assert records.read_json(tmp_path / "provenance.json") == {}  # listings go on
    with pytest.raises(ConfigError) as exc:
        records.read_provenance(tmp_path)  # loading refuses, in one line
    assert str(exc.value) == (
        f"{tmp_path / 'provenance.json'} is not readable JSON (it nests deeper than 64 levels); train the run again"
    )
