"""Generated hostile records in a run folder: ``status.json``, ``metrics.jsonl``, ``provenance.json``, the
lock record and a checkpoint's meta hold values of every type, numbers past any float or 64 bits, nesting
100,000 deep, bytes that are not UTF-8, or are folders. ``theseus runs`` and ``theseus runs show`` list
and show the run (exit 0) or refuse in one line (exit 2), never with a traceback.
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.conftest import call_cli
from tests.reliability.fuzzing import fuzz_settings, hostile_value

#: JSON texts no well-behaved writer makes: nesting past any parser's recursion, numbers past a float or
#: 64 bits (where a step, a count or a time is read), bytes that are not UTF-8, text cut short.
HOSTILE_TEXTS: tuple[bytes, ...] = (
    b"[" * 100_000 + b"]" * 100_000,
    b'{"step": ' * 3000 + b"1" + b"}" * 3000,
    b"[" * 4096,
    b'{"step": 1e400, "loss": 1e400}',
    b'{"step": -1e400, "time": NaN, "updated": Infinity}',
    b'{"step": ' + b"9" * 5000 + b"}",
    b'{"step": 9223372036854775808, "tokens_seen": 18446744073709551616}',
    b'{"updated": 1' + b"0" * 400 + b', "best_val_loss": 1' + b"0" * 400 + b"}",
    b'{"split": "val", "step": 1, "loss": 1' + b"0" * 400 + b"}",
    b'{"step": 3, "loss": "\xff\xfe"}',
    b"\xef\xbb\xbf{}",
    b'{"step": 1',
    b"",
)
#: The fields theseus reads from these records, given values of every type.
FIELDS = (
    "step", "split", "loss", "val_loss", "best_val_loss", "tokens_seen", "time", "updated", "state", "pid", "host",
    "since", "job",
)  # fmt: skip
#: The files written, relative to the run folder.
FILES = ("status.json", "metrics.jsonl", "provenance.json", "lock", "checkpoints/2/meta/metadata")


def typed_record() -> st.SearchStrategy[bytes]:
    """An object of the fields theseus reads, each of any type (NaN and infinity written as JSON does)."""
    fields = st.dictionaries(st.sampled_from(FIELDS), hostile_value(), max_size=4)
    return st.one_of(fields, hostile_value()).map(lambda value: json.dumps(value, allow_nan=True).encode())


def contents() -> st.SearchStrategy[bytes | None]:
    """A file's contents; None: a folder in its place."""
    return st.one_of(st.sampled_from(HOSTILE_TEXTS), typed_record(), st.none())


@st.composite
def run_files(draw: st.DrawFn) -> dict[str, bytes | None]:
    """Some of ``FILES`` and their contents (metrics.jsonl: several lines)."""
    chosen = draw(st.lists(st.sampled_from(FILES), min_size=1, max_size=len(FILES), unique=True))
    files: dict[str, bytes | None] = {}
    for name in sorted(chosen):
        if name == "metrics.jsonl" and draw(st.booleans()):
            lines = draw(st.lists(st.one_of(typed_record(), st.sampled_from(HOSTILE_TEXTS)), min_size=1, max_size=4))
            files[name] = b"\n".join(lines) + b"\n"
        else:
            files[name] = draw(contents())
    return files


def write_run(root: Path, files: dict[str, bytes | None]) -> None:
    """Run ``r``: its configuration, a committed checkpoint at step 2 (state, commit marker, no manifest)
    and ``files``."""
    run = root / "runs" / "r"
    (run / "checkpoints" / "2" / "state").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "checkpoints" / "2" / "commit_success.txt").write_text("")
    for name, data in files.items():
        path = run / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if data is None:
            (path / "inside").mkdir(parents=True)
        else:
            path.write_bytes(data)


def command(args: list[str]) -> tuple[int, str]:
    """``theseus ARGS`` in this process: its exit code and stderr (an exception other than the
    command's own exit propagates, failing the test with the generated files)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = call_cli(args)
    return code, err.getvalue()


@fuzz_settings(max_examples=40)
@given(files=run_files())
def test_hostile_run_records_are_listed_or_refused_in_one_line(files: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        write_run(root, files)
        for args in (["runs", "--root", str(root)], ["runs", "show", "r", "--root", str(root)]):
            code, err = command(args)
            assert code in (0, 2), (args, code, err)
            assert "Traceback" not in err, err
            errors = [line for line in err.splitlines() if line.startswith("error: ")]
            assert (code == 2) == (len(errors) == 1), err


def test_integers_past_a_floats_range_are_no_numbers_to_list() -> None:
    """A status.json ``updated`` and a validation line's ``loss`` of 401 digits broke ``theseus runs`` with an
    OverflowError (they are finite JSON integers, but no float)."""
    huge = b"1" + b"0" * 400
    files = {
        "status.json": b'{"state": "done", "step": 2, "updated": ' + huge + b"}",
        "metrics.jsonl": b'{"step": 1, "loss": 2.0}\n{"split": "val", "step": 2, "loss": ' + huge + b"}\n",
    }
    with tempfile.TemporaryDirectory() as folder:
        write_run(Path(folder), files)
        for args in (["runs", "--root", folder], ["runs", "show", "r", "--root", folder]):
            assert command(args)[0] == 0
