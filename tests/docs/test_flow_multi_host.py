"""docs/multi-host.md's two-processes flow, as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows


@pytest.mark.slow
def test_multi_host_two_processes_on_one_machine(tmp_path: Path) -> None:
    # the page's coordinator port is ${PORT:-12345}: a free one here, so parallel test runs never collide
    shell = Shell.create(tmp_path / "work", PORT=str(free_port()))
    (script,) = shell.run(flows("docs/multi-host.md")["two-processes"])
    run = shell.root / "runs" / "train-pretrain"
    # `wait` succeeds whatever its children did: the run directory says whether both processes trained
    assert "trained 'train-pretrain' to step 20/20" in script.stderr, script.output[-3000:]
    assert script.stderr.count("trained 'train-pretrain'") == 1  # process 0 reports, process 1 is quiet
    record = json.loads((run / "provenance.json").read_text())
    assert record["process_count"] == 2
    assert sorted(d["process_index"] for d in record["devices"]) == [0, 0, 1, 1]
    assert json.loads((run / "status.json").read_text())["state"] == "completed"
    assert (run / "checkpoints" / "20").is_dir()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["split"] == "train"] == [1, 10, 20]  # written once, by process 0
    assert len({(r["step"], r["split"]) for r in records}) == len(records)
