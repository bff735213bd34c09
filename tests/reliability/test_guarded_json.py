"""The one reader of JSON theseus did not write itself (``theseus.base.jsonfile``): nesting, size and numbers
are bounded before the parser runs, and a refusal is one line naming the file (and the field of a number)."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.reliability.conftest import error_line
from theseus.base import jsonfile
from theseus.errors import ConfigError

Cli = Callable[[list[str]], tuple[int, str]]

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


# -- every reader of a file theseus did not write in this process ---------------------------------------

#: Hostile contents of a JSON file, by what they try: the parser's recursion, a float past any finite one,
#: bytes that are no UTF-8.
HOSTILE: dict[str, bytes] = {
    "deep": DEEP.encode(),
    "1e400": b'{"format": "theseus-tokens", "version": 1, "name": "c", "tokenizer": {}, "fingerprint": {}, '
    b'"splits": {}, "vocab_size": 1e400, "position": 1e400}',
    "not utf-8": b'{"id": "\xff\xfe"}',
}
REASONS = {
    "deep": "it nests deeper than 64 levels",
    "1e400": 'field "vocab_size" holds 1e400, which is beyond any finite number',
    "not utf-8": "byte 8 is not UTF-8",
}


def hostile(path: Path, kind: str) -> Path:
    """Write the ``kind`` of hostile contents at ``path`` (``folder``: a folder in place of the file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "folder":
        (path / "inside").mkdir(parents=True)
    else:
        path.write_bytes(HOSTILE[kind])
    return path


@pytest.mark.parametrize("kind", [*HOSTILE, "folder"])
def test_a_hostile_dataset_header_is_one_data_error(tmp_path: Path, kind: str) -> None:
    """RecursionError and OverflowError (int(inf) of the vocabulary size) escaped before."""
    from theseus.data.format import read_header
    from theseus.errors import DataError

    path = hostile(tmp_path / "header.json", kind)
    with pytest.raises(DataError) as exc:
        read_header(tmp_path)
    reason = REASONS.get(kind, "Is a directory")
    assert str(exc.value) == f"{path} is unreadable ({reason}); re-prepare the data with data/force=true"
    with pytest.raises(DataError, match="does not exist: the data is not prepared"):
        read_header(tmp_path / "elsewhere")


@pytest.mark.parametrize("kind", [*HOSTILE, "folder"])
def test_a_hostile_staging_manifest_starts_the_preparation_over(tmp_path: Path, kind: str) -> None:
    from theseus.data.format import MANIFEST_FILE, PreparedWriter, resumable_staging

    staging = resumable_staging(tmp_path, "corpus")
    hostile(staging / MANIFEST_FILE, kind)
    writer = PreparedWriter(tmp_path, "corpus", vocab_size=257, eot_id=256, resume={"position": 1e300})
    try:
        assert writer.resumed_position == 0 and writer.counts() == {}
        assert sorted(p.name for p in staging.iterdir()) == []  # the hostile progress is gone
    finally:
        writer.abort()


@pytest.mark.parametrize("kind", [*HOSTILE, "folder"])
def test_hostile_run_files_are_treated_as_missing(tmp_path: Path, kind: str) -> None:
    """The data record, the tracker ids and the provenance a tracker gets: a new W&B/MLflow run, no data
    check, no provenance (RecursionError escaped each before)."""
    from theseus.tracking import mlflow, sinks, wandb
    from theseus.training import datacheck

    for name in ("data.json", "wandb.json", "mlflow.json", "provenance.json"):
        hostile(tmp_path / name, kind)
    assert datacheck.read_record(tmp_path) is None
    assert datacheck.check_resume(tmp_path, "r", {"corpus": {"digest": "new"}}, accept=False) is None
    assert wandb._stored_id(tmp_path) is None
    assert mlflow.MlflowSink._stored(tmp_path, "file:///tmp/mlruns") is None
    if kind != "1e400":  # the provenance a tracker gets keeps numbers unchecked (below)
        assert sinks.run_record(tmp_path, {"a": (1, 2)}) == {"a": [1, 2]}
    if kind != "folder":  # a record that is no UTF-8 (or no JSON) is replaced, not decoded
        datacheck.write_record(tmp_path, {"corpus": {"digest": "new"}})
        assert datacheck.read_record(tmp_path) == {"corpus": {"digest": "new"}}


def test_provenance_for_trackers_keeps_numbers_unchecked(tmp_path: Path) -> None:
    from theseus.tracking import sinks

    (tmp_path / "provenance.json").write_text('{"rope_theta": 1e400, "loss": NaN}')
    provenance = sinks.run_record(tmp_path, {})["provenance"]
    assert provenance["rope_theta"] == float("inf") and provenance["loss"] != provenance["loss"]


def test_a_data_record_of_wrong_types_or_numbers_is_no_traceback(tmp_path: Path) -> None:
    """``"tokens": "x"`` raised ValueError from int() before the refusal was written."""
    from theseus.training import datacheck

    (tmp_path / "data.json").write_text(
        json.dumps({"datasets": {"corpus": {"digest": "old", "splits": {"train": {"tokens": "x"}, "val": 3}}}})
    )
    now = {"corpus": {"digest": "new", "splits": {"train": {"tokens": 1200, "documents": 4}}}}
    with pytest.raises(ConfigError) as exc:
        datacheck.check_resume(tmp_path, "r", now, accept=False)
    assert str(exc.value).startswith(
        "run 'r' was trained on data 'corpus' as prepared ? (no splits); it was prepared again since "
        "(train 1,200 tokens now)"
    )
    (tmp_path / "data.json").write_text('{"datasets": {"corpus": {"splits": {"train": {"tokens": 1e400}}}}}')
    assert datacheck.check_resume(tmp_path, "r", now, accept=False) is None  # refused, as if none: OverflowError before


@pytest.mark.parametrize("kind", ["deep", "not utf-8", "folder"])
def test_a_hostile_checkpoint_meta_is_damage_not_an_old_checkpoint(tmp_path: Path, kind: str) -> None:
    """A step whose meta is unreadable and whose manifest is gone is not committed (RecursionError before;
    the meta's numbers are not checked: only whether it declares a manifest is read)."""
    from theseus.checkpoint import integrity
    from theseus.checkpoint.commits import is_committed

    step = tmp_path / "2"
    (step / "state").mkdir(parents=True)
    (step / "commit_success.txt").write_text("")
    hostile(step / integrity.META_FILE, kind)
    assert integrity.declares_checksums(step) is True
    assert not is_committed(step, "state")
    assert integrity.declares_checksums(tmp_path / "1") is False  # no meta: saved before manifests existed


@pytest.mark.parametrize("kind", HOSTILE)
def test_hostile_checkpoint_manifests_are_damage(tmp_path: Path, kind: str) -> None:
    """Before: the manifests said only "(RecursionError)", and a save finalising over a hostile part raised it."""
    from theseus.checkpoint import integrity

    (tmp_path / "ocdbt.process_0").mkdir()
    (tmp_path / "ocdbt.process_0" / "weights").write_bytes(b"w")
    part = integrity.write_part(tmp_path, 0)
    saved = part.read_bytes()
    hostile(part, kind)
    with pytest.raises(jsonfile.UnreadableJSON, match=re.escape(f"{part} is not readable JSON ({REASONS[kind]})")):
        integrity.write_manifest(tmp_path)
    part.write_bytes(saved)
    integrity.write_manifest(tmp_path)
    assert integrity.damage(tmp_path) is None
    manifest = tmp_path / integrity.MANIFEST
    manifest.write_text(json.dumps({"algorithm": "crc32", "files": {}, "parts": [part.name]}))
    hostile(part, kind)  # a part checksums.json does not record the checksum of
    assert integrity.damage(tmp_path) == f"its checksum manifest {part.name} is unreadable ({REASONS[kind]})"
    hostile(manifest, kind)
    assert integrity.damage(tmp_path) == f"its checksum manifest is unreadable ({REASONS[kind]})"


def test_a_hostile_lock_record_names_no_holder(tmp_path: Path) -> None:
    """4 KiB of brackets (all the lock record that is read) raised RecursionError from ``theseus runs``."""
    from theseus.runs import lock

    (tmp_path / lock.LOCK_FILE).write_text("[" * 4096)
    assert lock.holder(tmp_path) is None and not lock.abandoned(tmp_path)
    (tmp_path / lock.LOCK_FILE).write_text('{"pid": 1e400, "host": "h", "since": "s"}')
    assert not lock.abandoned(tmp_path)  # refused like any unreadable record


def test_runs_lists_a_run_with_a_hostile_lock_and_checkpoint_meta(cli: Cli, tmp_path: Path) -> None:
    """``theseus runs`` printed a RecursionError traceback for either file."""
    from theseus.checkpoint import integrity

    run = tmp_path / "runs" / "r"
    (run / "checkpoints" / "2" / "state").mkdir(parents=True)
    (run / "config.yaml").write_text("{}\n")
    (run / "checkpoints" / "2" / "commit_success.txt").write_text("")
    hostile(run / "checkpoints" / "2" / integrity.META_FILE, "deep")  # and no manifest: not a checkpoint
    (run / "lock").write_text("[" * 4096)
    code, err = cli(["runs", "--root", str(tmp_path)])
    assert code == 0 and err == ""
    code, err = cli(["runs", "show", "r", "--root", str(tmp_path)])
    assert code == 0 and err == ""


def test_resuming_keeps_a_metrics_line_of_a_huge_integer_as_it_is(tmp_path: Path) -> None:
    """A 5,000-digit step raised ValueError (past Python's digit limit) when a resume cut the file."""
    from theseus.training.metrics import cut_records

    huge = '{"step": ' + "9" * 5000 + "}\n"
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n' + huge + '{"step": 2, "loss": 1.0}\n')
    assert cut_records(path, 1) == [{"step": 1, "loss": 2.0}]
    assert path.read_text() == '{"step": 1, "loss": 2.0}\n' + huge  # like a line that is not UTF-8


# -- rows of a dataset ------------------------------------------------------------------------------------

#: Lines of a JSON-lines file that the reader refuses, and the reason it gives.
HOSTILE_LINES = {
    "deep": ('{"text": ' + "[" * 100_000 + "]" * 100_000 + "}", "it nests deeper than 64 levels"),
    "digits": ('{"text": "t", "id": ' + "9" * 5000 + "}", "it holds an integer of more digits than Python converts"),
}
#: Numbers in columns no reader takes: a corpus exported with them is read, not refused.
ODD_NUMBERS = '{"text": "t", "prompt": "p", "answer": 0, "context": "c", "choices": ["a", "b"], "score": NaN, '
ODD_NUMBERS += '"weight": 1e999, "id": 123456789012345678901234567890}'
GOOD_LINE = '{"text": "fine", "prompt": "p", "answer": 0, "context": "c", "choices": ["a", "b"]}'


def lines_file(path: Path, line: str | bytes) -> Path:
    """A JSON-lines file whose second line is ``line``."""
    path.write_bytes(GOOD_LINE.encode() + b"\n" + (line if isinstance(line, bytes) else line.encode()) + b"\n")
    return path


@pytest.mark.parametrize("kind", HOSTILE_LINES)
def test_a_hostile_dataset_line_is_one_line_naming_it(tmp_path: Path, kind: str) -> None:
    """Before: RecursionError or ValueError escaped (the RL environment's rows, multiple-choice questions)."""
    from theseus.data.json_lines import json_lines
    from theseus.errors import DataError
    from theseus.evaluation.multiple_choice import read_questions
    from theseus.rl.environments.jsonl import JSONL

    line, reason = HOSTILE_LINES[kind]
    path = lines_file(tmp_path / "rows.jsonl", line)
    with pytest.raises(DataError) as data:
        list(json_lines(path))
    assert str(data.value) == f"{path}:2 is not valid JSON ({reason}); fix the line"
    with pytest.raises(DataError) as questions:
        read_questions(path)
    assert str(questions.value) == f"{path}:2 is not valid JSON ({reason}); fix the line"
    with pytest.raises(ConfigError) as rows:
        JSONL(path=str(path))
    assert str(rows.value) == f"{path}:2 is not valid JSON ({reason}); fix the line or set environment/jsonl/path"


def test_dataset_lines_that_are_no_utf8_are_one_line_naming_them(tmp_path: Path) -> None:
    """UnicodeDecodeError escaped from the RL environment's rows and the multiple-choice questions."""
    from theseus.errors import DataError
    from theseus.evaluation.multiple_choice import read_questions
    from theseus.rl.environments.jsonl import JSONL

    path = lines_file(tmp_path / "rows.jsonl", b'{"prompt": "\xff"}')
    with pytest.raises(DataError) as questions:
        read_questions(path)
    not_utf8 = f"{path}:2 is not UTF-8 text (byte 0xff at column 13); save the file as UTF-8"
    assert str(questions.value) == not_utf8
    with pytest.raises(ConfigError) as rows:
        JSONL(path=str(path))
    assert str(rows.value) == not_utf8
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + GOOD_LINE.encode() + b"\n")
    assert read_questions(bom)[0].choices == ("a", "b")
    assert JSONL(path=str(bom), eval_fraction=0.0).rows["train"][0].metadata == {"answer": "0"}


def test_preparing_a_hostile_local_line_is_one_error_line(cli: Cli, tmp_path: Path) -> None:
    path = lines_file(tmp_path / "docs.jsonl", HOSTILE_LINES["deep"][0])
    root = tmp_path / "root"
    code, err = cli(["run", "data/tokenize", "--root", str(root), "data/dataset=local", f"data/local/path={path}"])
    assert code == 2
    assert error_line(err) == (
        f"error: {path}:2 is not valid JSON (it nests deeper than 64 levels); fix the line or the data/local/text_field"
    )


def test_numbers_in_columns_no_reader_takes_do_not_stop_a_dataset(tmp_path: Path) -> None:
    from theseus.data.json_lines import json_lines
    from theseus.evaluation.multiple_choice import read_questions
    from theseus.rl.environments.jsonl import JSONL

    path = lines_file(tmp_path / "rows.jsonl", ODD_NUMBERS)
    rows = [value for _, value in json_lines(path)]
    assert rows[1]["id"] == 123456789012345678901234567890 and rows[1]["weight"] == float("inf")
    assert [q.choices for q in read_questions(path)] == [("a", "b"), ("a", "b")]
    assert len(JSONL(path=str(path), eval_fraction=0.0).rows["train"]) == 2
