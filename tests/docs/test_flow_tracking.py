"""docs/tracking.md's runs flow, as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows, train_losses
from tests.tracking.readers import jsonl_scalars, tensorboard_scalars, wandb_offline_run


def row_of(listing: str, name: str) -> str:
    rows = [line for line in listing.splitlines() if line.split()[:1] == [name]]
    assert len(rows) == 1, listing
    return rows[0]


@pytest.mark.slow
def test_tracking_runs_flow(tmp_path: Path) -> None:
    shell = Shell.create(tmp_path / "work")
    shell.run(flows("docs/tracking.md")["runs"])
    baseline = shell.root / "runs" / "baseline"

    listing = shell.result("theseus runs").stdout
    assert listing.split()[:3] == ["NAME", "JOB", "STATUS"]
    assert re.search(r"train/pretrain\s+completed\s+20/20\s+\d", row_of(listing, "baseline"))
    assert re.search(r"train/pretrain\s+stopped at step 10\s+10/20\s+-", row_of(listing, "lr-6e-4"))

    # the sinks: TensorBoard's and W&B's records hold the metrics.jsonl values
    jsonl = jsonl_scalars(baseline)
    assert [step for step, _ in jsonl["train/loss"]] == [1, 10, 20]
    board = tensorboard_scalars(baseline)
    assert [step for step, _ in board["train/loss"]] == [1, 10, 20]
    assert [v for _, v in board["train/loss"]] == pytest.approx([v for _, v in jsonl["train/loss"]], rel=1e-6)
    (offline,) = baseline.glob("wandb/offline-run-*/run-*.wandb")
    wandb_run = wandb_offline_run(offline)
    assert wandb_run["id"] == json.loads((baseline / "wandb.json").read_text())["id"]
    assert wandb_run["history"][20]["train/loss"] == pytest.approx(jsonl["train/loss"][-1][1], rel=1e-6)
    assert not list((shell.root / "runs" / "lr-6e-4").glob("events.out.tfevents.*"))

    shown = shell.result("theseus runs show baseline").stdout
    assert re.search(r"^status\s+completed$", shown, re.MULTILINE)
    assert re.search(rf"^\s+tensorboard\s+tensorboard --logdir {re.escape(str(baseline))}$", shown, re.MULTILINE)
    assert re.search(rf"^\s+wandb\s+run id {wandb_run['id']} ", shown, re.MULTILINE)
    assert re.search(r"^\s+step\s+20\s.*best$", shown, re.MULTILINE)

    compared = shell.result("theseus runs compare").stdout
    assert compared.split()[:4] == ["RUN", "POINTS", "LAST", "train/loss"]
    last = {name: float(row_of(compared, name).split()[2]) for name in ("baseline", "lr-6e-4")}
    assert last["baseline"] == pytest.approx(jsonl["train/loss"][-1][1], abs=0.01)
    assert last["lr-6e-4"] == pytest.approx(train_losses(shell.root / "runs" / "lr-6e-4")[-1][1], abs=0.01)
    assert re.search(r"^training/lr\s+0.0003\s+0.0006$", compared, re.MULTILINE)
    assert "wrote cmp.png" in compared
    assert (shell.cwd / "cmp.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
