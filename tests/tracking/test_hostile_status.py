"""``theseus runs`` over hostile ``status.json`` records: values of the wrong type or range, escape
sequences, deep nesting and huge files are dropped or shown escaped, one run never breaks the listing
of the others, and nothing reaches the terminal raw."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.reliability.conftest import call_cli
from theseus.tracking.status import STATUS_FILE, printable, read_status

GOOD = {"job": "train/pretrain", "state": "completed", "step": 4, "total_steps": 4, "updated": 1.7e9, "tokens": 64}
HOSTILE = {
    "pid-huge": {**GOOD, "state": "running", "pid": 2**70, "host": "elsewhere"},
    "step-text": {**GOOD, "step": "x", "tokens": -5, "total_steps": True},
    "updated-far": {**GOOD, "updated": 1e308, "wall_time": -1.0},
    "escapes": {**GOOD, "state": "failed", "error": "boom\x1b[2J\x1b]0;owned\x07\nsecond line", "job": "j\x1b[31m"},
}


def write(root: Path, name: str, text: str) -> None:
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / STATUS_FILE).write_text(text)


def test_hostile_records_are_listed_without_breaking_the_others(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    write(tmp_path, "good", json.dumps(GOOD))
    for name, record in HOSTILE.items():
        write(tmp_path, name, json.dumps(record))
    write(tmp_path, "deep", "[" * 100_000 + "]" * 100_000)
    write(tmp_path, "huge", json.dumps({**GOOD, "job": "x" * (2 << 20)}))

    code = call_cli(["runs", "--root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "\x1b" not in out + err and "\x07" not in out
    lines = out.splitlines()
    assert {line.split()[0] for line in lines[1:]} == {"good", "deep", "huge", *HOSTILE}  # one line a run
    escaped = next(line for line in lines if line.startswith("escapes"))
    assert "failed: boom\\x1b[2J" in escaped and "\\nsecond line" in escaped

    for name in [*HOSTILE, "good"]:
        code = call_cli(["runs", "--root", str(tmp_path), "show", name])
        out, err = capsys.readouterr()
        assert code == 0 and "\x1b" not in out, (name, err)
    rows = json.loads((call_cli(["runs", "--root", str(tmp_path), "--json"]), capsys.readouterr().out)[1])
    assert len(rows) == 2 + len(HOSTILE) + 1


def test_a_record_keeps_only_fields_of_their_type_and_range(tmp_path: Path) -> None:
    bad = {"step": "x", "tokens": -5, "total_steps": True, "updated": 1e308, "wall_time": -1.0, "pid": 2**70}
    write(tmp_path, "r", json.dumps({**GOOD, **bad, "extra": [1]}))
    record = read_status(tmp_path / "runs" / "r")
    assert record is not None
    assert "step" not in record and "tokens" not in record and "total_steps" not in record and "pid" not in record
    assert "updated" not in record and "wall_time" not in record
    assert record["job"] == "train/pretrain" and record["extra"] == [1]  # unknown fields pass as they are
    assert printable("a\x1b[0mb\nc") == "a\\x1b[0mb\\nc" and len(printable("y" * 5000)) == 2000
