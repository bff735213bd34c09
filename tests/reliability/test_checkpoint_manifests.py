"""Per-process checksum manifests and the split of a checkpoint's verification among processes, in one
process: a state folder laid out as orbax writes one of two processes (``ocdbt.process_<i>``,
``array_metadatas/process_<i>`` and the files of the merge), with made-up contents."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from theseus.checkpoint import integrity
from theseus.checkpoint.agreement import agreed_verification, combine, decode, encode

FILES = {
    "_METADATA": 300,
    "manifest.ocdbt": 100,
    "d/merged": 500,
    "array_metadatas/process_0": 200,
    "array_metadatas/process_1": 200,
    "ocdbt.process_0/manifest.ocdbt": 150,
    "ocdbt.process_0/d/big": 40_000,
    "ocdbt.process_0/d/small": 3_000,
    "ocdbt.process_1/manifest.ocdbt": 150,
    "ocdbt.process_1/d/big": 41_000,
    "ocdbt.process_1/d/small": 2_000,
}


def saved(folder: Path, processes: int = 2) -> Path:
    """Write ``FILES`` under ``folder``, the part manifests of ``processes`` processes, then the manifest
    (as a save does: each process its part, process 0 the rest)."""
    rng = np.random.default_rng(0)
    for name, size in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(rng.integers(0, 256, size, dtype=np.uint8).tobytes())
    for process in range(processes):
        integrity.write_part(folder, process)
    integrity.write_manifest(folder)
    return folder


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def two_processes(folder: Path) -> list[integrity.Verification]:
    """What :func:`agreed_verification` returns on processes 0 and 1, with the gather done here."""
    locals_ = [integrity.verify_share(folder, process, 2) for process in range(2)]
    rows = np.stack([encode(verdict) for verdict in locals_])
    return [agreed_verification(folder, process=p, count=2, gather=lambda _record: rows) for p in range(2)]


def test_each_process_records_its_own_files_and_process_0_the_rest(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    part1 = json.loads((folder / "checksums.process_1.json").read_text())
    assert sorted(part1["files"]) == [
        "array_metadatas/process_1",
        "ocdbt.process_1/d/big",
        "ocdbt.process_1/d/small",
        "ocdbt.process_1/manifest.ocdbt",
    ]
    assert part1["files"]["ocdbt.process_1/d/big"] == [
        41_000,
        integrity.file_checksum(folder / "ocdbt.process_1/d/big"),
    ]
    main = json.loads((folder / integrity.MANIFEST).read_text())
    assert main["parts"] == ["checksums.process_0.json", "checksums.process_1.json"]
    assert sorted(main["files"]) == sorted(
        ["_METADATA", "manifest.ocdbt", "d/merged", "checksums.process_0.json", "checksums.process_1.json"]
    )
    assert integrity.read_manifest(folder) == {
        name: (size, integrity.file_checksum(folder / name)) for name, size in FILES.items()
    }


def test_the_split_is_balanced_by_bytes_and_covers_every_file_once(tmp_path: Path) -> None:
    files = {name: (size, "0") for name, size in FILES.items()}
    shares = integrity.shares(files, 2)
    assert shares[0] == sorted(shares[0]) and sorted(shares[0] + shares[1]) == sorted(files)
    assert "ocdbt.process_1/d/big" in shares[0] and "ocdbt.process_0/d/big" in shares[1]
    loads = [sum(FILES[name] for name in share) for share in shares]
    assert max(loads) - min(loads) <= 500  # the largest file first, each to the lighter process
    assert integrity.shares(files, 1) == [sorted(files)]
    three = integrity.shares(files, 3)
    assert sorted(name for share in three for name in share) == sorted(files) and all(three)


def test_each_process_reads_only_its_share(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    files = integrity.read_manifest(folder)
    assert files is not None
    shares = integrity.shares(files, 2)
    for process in range(2):
        verdict = integrity.verify_share(folder, process, 2)
        assert verdict.problem is None and verdict.files == len(shares[process])
        assert verdict.bytes_read == sum(FILES[name] for name in shares[process])
    whole = integrity.verify_share(folder)
    assert (whole.problem, whole.files, whole.bytes_read) == (None, len(FILES), sum(FILES.values()))


@pytest.mark.parametrize("damaged", ["ocdbt.process_1/d/big", "ocdbt.process_0/d/big", "_METADATA"])
def test_a_damaged_file_in_one_share_gives_both_processes_the_verdict(tmp_path: Path, damaged: str) -> None:
    folder = saved(tmp_path)
    flip(folder / damaged)
    finder = next(
        p for p, share in enumerate(integrity.shares(integrity.read_manifest(folder) or {}, 2)) if damaged in share
    )
    assert integrity.verify_share(folder, 1 - finder, 2).problem is None  # the other process's share is intact
    expected = f"{damaged} does not match its checksum"
    assert [verdict.problem for verdict in two_processes(folder)] == [expected, expected]
    assert integrity.damage(folder) == expected  # as one process checking everything says it


def test_two_damaged_files_give_the_verdict_one_process_would(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    (folder / "ocdbt.process_1/d/small").write_bytes(b"short")
    flip(folder / "_METADATA")
    single = integrity.damage(folder)
    assert single == "_METADATA does not match its checksum"
    assert [verdict.problem for verdict in two_processes(folder)] == [single, single]


def test_damaged_or_missing_part_manifests(tmp_path: Path) -> None:
    folder = saved(tmp_path)
    part = folder / "checksums.process_1.json"
    part.write_text(part.read_text().replace("41000", "41001"))
    expected = "checksums.process_1.json does not match its checksum"  # the manifest records the part's CRC
    assert [verdict.problem for verdict in two_processes(folder)] == [expected, expected]
    part.unlink()
    assert integrity.damage(folder) == "checksums.process_1.json is missing"


def test_a_manifest_without_parts_still_verifies(tmp_path: Path) -> None:
    folder = saved(tmp_path, processes=0)  # as saved before part manifests existed: every file in one
    assert sorted(json.loads((folder / integrity.MANIFEST).read_text())["files"]) == sorted(FILES)
    assert [verdict.problem for verdict in two_processes(folder)] == [None, None]
    flip(folder / "ocdbt.process_0/d/small")
    assert [verdict.problem for verdict in two_processes(folder)] == [
        "ocdbt.process_0/d/small does not match its checksum"
    ] * 2


def test_verdict_records_round_trip() -> None:
    long = "x/" * 600 + " does not match its checksum"
    verdict = integrity.Verification(long, rank=7)
    rank, problem = decode(encode(verdict))
    assert rank == 7 and problem is not None and long.startswith(problem) and len(problem.encode()) == 1016
    assert decode(encode(integrity.Verification(None, rank=3))) == (-2, None)
    agreed = combine(integrity.Verification(None, 9, files=2, bytes_read=5), [(-2, None), (4, "b"), (1, "a")])
    assert (agreed.problem, agreed.rank, agreed.files, agreed.bytes_read) == ("a", 1, 2, 5)


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.bin", "d/../../outside.bin", "./_METADATA", "d//merged"])
def test_a_manifest_naming_a_path_outside_the_checkpoint_is_refused(tmp_path: Path, name: str) -> None:
    """A name outside the state folder once had that file's size read and, matching, passed verification."""
    folder = saved(tmp_path / "state")
    (tmp_path / "outside.bin").write_bytes(b"outside")
    record = json.loads((folder / integrity.MANIFEST).read_text())
    record["files"][name] = [7, integrity.file_checksum(tmp_path / "outside.bin")]
    (folder / integrity.MANIFEST).write_text(json.dumps(record))
    assert (
        integrity.damage(folder)
        == f"its checksum manifest checksums.json names {name!a}, a path outside the checkpoint"
    )


def test_a_part_outside_the_checkpoint_or_a_link_out_of_it_is_refused(tmp_path: Path) -> None:
    folder = saved(tmp_path / "state")
    record = json.loads((folder / integrity.MANIFEST).read_text())
    part = tmp_path / "checksums.process_9.json"
    part.write_text(json.dumps({"files": {}}))  # a part that records nothing: every file of its process unchecked
    record["parts"] = ["../checksums.process_9.json"]
    (folder / integrity.MANIFEST).write_text(json.dumps(record))
    assert integrity.damage(folder) == (
        "its checksum manifest checksums.json names '../checksums.process_9.json', a path outside the checkpoint"
    )
    folder = saved(tmp_path / "linked")
    (tmp_path / "big").write_bytes((folder / "ocdbt.process_0/d/big").read_bytes())
    (folder / "ocdbt.process_0/d/big").unlink()
    (folder / "ocdbt.process_0/d/big").symlink_to(tmp_path / "big")
    assert integrity.damage(folder) == "ocdbt.process_0/d/big is a link to a file outside the checkpoint"
