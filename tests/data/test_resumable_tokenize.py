"""Resumable tokenization: ``data/tokenize`` commits chunks with a manifest; killed part way, the same
command continues from the last committed chunk and publishes the same bytes as an uninterrupted run.

The python-stdlib corpus capped at 300 documents is about 4.5 MB, five chunks of 1 MB, committed
after every chunk (``data/commit_seconds=0``). ``THESEUS_TEST_KILL_AT`` SIGKILLs the command after
a chunk was written but not committed (``chunk:N``) and right after a commit (``commit:N``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env
from theseus.data.datasets import PythonStdlib
from theseus.data.format import MANIFEST_FILE, PreparedWriter, resumable_staging
from theseus.data.prepare import prepare
from theseus.errors import DataError

SHARDS = ("train.bin", "train.idx", "val.bin", "val.idx")
DOCUMENTS = 300


def tokenize(root: Path, *extra: str, kill_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    if kill_at:
        env["THESEUS_TEST_KILL_AT"] = kill_at
    command = [sys.executable, "-m", "theseus.cli.main", "run", "data/tokenize", "--root", str(root)]
    command += [f"data/max_documents={DOCUMENTS}", "data/commit_seconds=0", *extra]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


def digests(folder: Path) -> dict[str, str]:
    return {name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in SHARDS}


def header(folder: Path) -> dict:
    data = json.loads((folder / "header.json").read_text())
    data.pop("created")
    return data


def manifest(root: Path) -> dict:
    return json.loads((resumable_staging(root, "python-stdlib") / MANIFEST_FILE).read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted preparation (in this process: the same code path as the command)."""
    root = tmp_path_factory.mktemp("tokenize-reference")
    prepare(PythonStdlib(max_documents=DOCUMENTS), root)
    return root / "data" / "python-stdlib"


def test_killed_twice_then_resumed_gives_identical_shards(reference: Path, tmp_path: Path) -> None:
    first = tokenize(tmp_path, kill_at="chunk:2")  # chunk 2 written, not committed
    assert first.returncode == -signal.SIGKILL, first.stderr
    assert not (tmp_path / "data" / "python-stdlib").exists()  # nothing published
    after_first = manifest(tmp_path)
    committed = after_first["position"]
    assert 0 < committed < DOCUMENTS  # chunk 1 is committed

    second = tokenize(tmp_path, kill_at="commit:2")  # killed right after committing its second chunk
    assert second.returncode == -signal.SIGKILL, second.stderr
    assert f"resuming 'python-stdlib' after {committed:,} documents" in second.stdout + second.stderr
    after_second = manifest(tmp_path)
    assert committed < after_second["position"] < DOCUMENTS

    third = tokenize(tmp_path, "data/workers=2")  # another worker count changes nothing
    assert third.returncode == 0, third.stderr
    output = third.stdout + third.stderr
    assert f"resuming 'python-stdlib' after {after_second['position']:,} documents" in output
    assert f"(resumed at {after_second['position']:,})" in output  # the progress bar starts there
    published = tmp_path / "data" / "python-stdlib"
    assert digests(published) == digests(reference)
    assert header(published) == header(reference)
    assert sorted(p.name for p in published.iterdir()) == sorted([*SHARDS, "header.json"])  # no manifest
    assert not resumable_staging(tmp_path, "python-stdlib").exists()


def test_a_full_disk_is_one_line_and_keeps_the_previous_data(
    reference: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prepare(PythonStdlib(max_documents=120), tmp_path)  # data published before
    published = tmp_path / "data" / "python-stdlib"
    before = digests(published)
    original = PreparedWriter.append
    calls = {"n": 0}

    def append(self: PreparedWriter, *args: object, **kwargs: object) -> None:
        calls["n"] += 1
        if calls["n"] == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        original(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PreparedWriter, "append", append)
    with pytest.raises(DataError) as caught:
        prepare(PythonStdlib(max_documents=DOCUMENTS), tmp_path, force=True, commit_seconds=0)
    message = str(caught.value)
    assert "\n" not in message
    staging = resumable_staging(tmp_path, "python-stdlib")
    assert message == (
        f"no space left on the device while preparing 'python-stdlib' in {staging}; free disk space and run the "
        f"same command again to continue from the last committed chunk; the previous data in {published} is untouched"
    )
    assert digests(published) == before
    assert 0 < manifest(tmp_path)["position"] < DOCUMENTS

    monkeypatch.setattr(PreparedWriter, "append", original)  # space freed
    prepare(PythonStdlib(max_documents=DOCUMENTS), tmp_path, force=True, commit_seconds=0)
    assert digests(published) == digests(reference)


def test_other_settings_start_over(tmp_path: Path) -> None:
    first = tokenize(tmp_path, kill_at="commit:1")
    assert first.returncode == -signal.SIGKILL
    assert manifest(tmp_path)["position"] > 0
    writer = PreparedWriter(tmp_path, "python-stdlib", vocab_size=257, eot_id=256, resume={"other": 1})
    try:
        assert writer.resumed_position == 0 and writer.counts() == {}
        assert not (writer.staging / MANIFEST_FILE).exists()
    finally:
        writer.abort()


def test_chat_masks_are_committed_and_cut_back_with_the_tokens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A masked (chat) preparation interrupted after uncommitted appends resumes to the same bytes, masks included."""
    from theseus.config import configuration, configure
    from theseus.data import prepare as prepare_module
    from theseus.data.datasets import Chat

    rows = [
        {
            "messages": [
                {"role": "user", "content": f"question {i} " * (1 + i % 5)},
                {"role": "assistant", "content": f"a{i}"},
            ]
        }
        for i in range(60)
    ]
    (tmp_path / "chat.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    def chat() -> Chat:
        with configuration({"data/chat/path": str(tmp_path / "chat.jsonl"), "data/val_fraction": 0.1}):
            return configure(Chat)

    monkeypatch.setattr(prepare_module, "CHUNK_DOCUMENTS", 8)  # chunks of eight documents (val: 9, 19, 29, ...)
    files = ("train.bin", "train.idx", "train.mask", "val.bin", "val.idx", "val.mask")
    reference = prepare(chat(), tmp_path / "reference", tokenizer="byte", commit_seconds=0).folder
    assert reference.joinpath("train.mask").stat().st_size == reference.joinpath("train.bin").stat().st_size // 2

    original = PreparedWriter.append
    calls = {"n": 0}

    def append(self: PreparedWriter, split: str, *args: object, **kwargs: object) -> None:
        calls["n"] += 1
        original(self, split, *args, **kwargs)  # type: ignore[arg-type]
        if calls["n"] == 7:  # chunk 4 (train, then val) is written, not committed
            raise KeyboardInterrupt

    monkeypatch.setattr(PreparedWriter, "append", append)
    root = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        prepare(chat(), root, tokenizer="byte", commit_seconds=0)
    staging = resumable_staging(root, "chat")
    progress = json.loads((staging / MANIFEST_FILE).read_text())
    committed_tokens = progress["splits"]["train"][0]
    assert progress["position"] == 24  # three chunks of eight documents
    assert (staging / "train.mask").stat().st_size > committed_tokens  # uncommitted learned flags to cut off

    monkeypatch.setattr(PreparedWriter, "append", original)
    published = prepare(chat(), root, tokenizer="byte", commit_seconds=0).folder
    for name in files:
        assert (published / name).read_bytes() == (reference / name).read_bytes(), name
    assert header(published) == header(reference)
