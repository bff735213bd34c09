"""docs/evaluation.md's harness flow, as written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.docs.doc_flows import Shell
from tests.docs.flow_common import flows


@pytest.mark.slow
def test_evaluation_harness_flow(tmp_path: Path) -> None:
    pytest.importorskip("lm_eval")
    shell = Shell.create(tmp_path / "work", HF_DATASETS_CACHE=str(tmp_path / "datasets"))
    shell.run(flows("docs/evaluation.md")["harness"])
    run = shell.root / "runs" / "small"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (logged,) = [r for r in records if r["split"] == "eval"]
    assert logged["step"] == 20 and logged["harness/capitals/samples"] == 4 and "perplexity/loss" in logged
    results = json.loads((shell.cwd / "results.json").read_text())
    assert results["results"]["capitals"]["acc,none"] == pytest.approx(logged["harness/capitals/acc"])
    assert results["config"]["model_args"] == {"run": "small", "step": 20}
    table = shell.result("theseus run eval/harness").stdout
    assert "|capitals|" in table and "acc_norm" in table
