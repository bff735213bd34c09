"""Two processes verify a checkpoint together: each reads only its share of the files, and a damaged
file that only one of them reads makes both fall back to the same step.

``verify_processes.py`` runs as processes 0 and 1 (one CPU device each): they save steps 1-3 of a
small sharded state, step 3 is damaged in process 0's share and step 2 in process 1's, and both
restore the newest intact checkpoint.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, free_port
from tests.distributed.test_scale_out import HERE, env_with_devices
from theseus.checkpoint import integrity


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("verify") / "checkpoints"
    port = str(free_port())
    processes = [
        subprocess.Popen(
            [sys.executable, str(HERE / "verify_processes.py"), port, str(index), str(directory)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env_with_devices(1),
            cwd=REPO,
        )
        for index in range(2)
    ]
    results = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=240)
            assert process.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    return {"directory": directory, "results": results}


def recorded(folder: Path) -> dict[str, tuple[int, str]]:
    files = integrity.read_manifest(folder)
    assert files is not None
    return files


def test_each_process_reads_only_its_share(verified: dict[str, Any]) -> None:
    directory, results = verified["directory"], verified["results"]
    files = recorded(directory / "1" / "state")
    parts = [integrity.part_name(0), integrity.part_name(1)]
    assert json.loads((directory / "1" / "state" / integrity.MANIFEST).read_text())["parts"] == parts
    shares = integrity.shares(files, 2)
    assert sorted(shares[0] + shares[1]) == sorted(files) and not set(shares[0]) & set(shares[1])
    total = sum(size for size, _ in files.values())
    for index, result in enumerate(results):
        # the intact step: every process checks the part manifests (small), then all of its share, nothing else
        assert result["read"]["1"] == parts + shares[index]
        assert sum(files[name][0] for name in shares[index]) < 0.6 * total
    for step in ("3", "2"):  # the damaged steps: within its share (stopped at a damaged file)
        shares = integrity.shares(recorded(directory / f"{step}.corrupt" / "state"), 2)
        for index, result in enumerate(results):
            assert result["read"][step][:2] == parts and set(result["read"][step][2:]) <= set(shares[index])


def test_a_damage_either_process_finds_makes_both_fall_back(verified: dict[str, Any]) -> None:
    directory, (first, second) = verified["directory"], verified["results"]
    assert (first["step"], second["step"]) == (1, 1) and first["equal"] and second["equal"]
    assert first["warnings"] == second["warnings"]
    assert sorted(p.name for p in directory.iterdir()) == ["1", "2.corrupt", "3.corrupt"]
    for step, finder in (("3", first), ("2", second)):
        folder = directory / f"{step}.corrupt" / "state"
        damaged = next(
            name for name, (_, crc) in recorded(folder).items() if integrity.file_checksum(folder / name) != crc
        )
        assert damaged == finder["read"][step][-1]  # found by that process ...
        other = second if finder is first else first
        assert damaged not in other["read"][step]  # ... which the other never read
        warning = next(line for line in first["warnings"] if f"/{step}'" in line)
        assert f"is damaged: {damaged} does not match its checksum; moved it to" in warning
        assert warning.endswith(f"{step}.corrupt' and resumed from step 1")
