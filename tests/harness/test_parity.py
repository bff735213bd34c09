"""``theseus run eval/harness`` on a run against lm-eval's own Hugging Face model on the run's export.

The run (a random GPT-2 imported with ``hf/import``) is exported with ``hf/export``; lm-eval's
``hf`` model (float32, CPU) evaluates the export on the same local tasks. Metrics, every request's
log-likelihood (within 1e-4) and every generated string must agree.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.harness.conftest import POSITIONS, Imported, logliks, theseus_main
from tests.tolerances import float32_tolerance, transformer_ops

TASKS = ["tiny_choice", "tiny_generate", "tiny_rolling"]
TOLERANCE = 1e-4
#: A metric summed from log-likelihoods (bits per byte) of the 2-layer, 32-wide GPT-2 of 300 ids, computed
#: by either framework's float32 kernels: relative to its value.
METRIC_TOLERANCE = float32_tolerance(transformer_ops(2, 32, POSITIONS, 300))


@pytest.fixture(scope="module")
def evaluated(imported: Imported, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The results of both sides: ours from the files eval/harness wrote, lm-eval's as returned."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    folder = tmp_path_factory.mktemp("parity")
    export, out = folder / "export", folder / "out" / "harness.json"
    root = ["--root", str(imported.root)]
    assert theseus_main("run", "hf/export", f"hf/run={imported.run}", f"hf/out={export}", *root) == 0
    code = theseus_main(
        "run",
        "eval/harness",
        f"eval/run={imported.run}@0",
        f"eval/tasks={','.join(TASKS)}",
        f"eval/include_path={imported.tasks}",
        f"eval/out={out}",
        "eval/log_samples=true",
        "eval/batch_size=4",
        *root,
    )
    assert code == 0
    theirs = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(export), "dtype": "float32"},
        tasks=TASKS,
        device="cpu",
        batch_size=4,
        log_samples=True,
        task_manager=TaskManager(include_path=str(imported.tasks), include_defaults=False),
    )
    ours = json.loads(out.read_text())
    samples = {
        task: {row["doc_id"]: row for row in map(json.loads, (out.parent / f"samples_{task}.jsonl").open())}
        for task in TASKS
    }
    return {"ours": ours, "samples": samples, "theirs": theirs, "out": out}


def test_metrics_match_lm_eval_on_the_export(evaluated: dict[str, Any]) -> None:
    ours, theirs = evaluated["ours"]["results"], evaluated["theirs"]["results"]
    assert sorted(ours) == sorted(theirs) == TASKS
    for task in TASKS:
        assert sorted(ours[task]) == sorted(theirs[task])
        for key, value in theirs[task].items():
            if isinstance(value, float) and "perplexity" in key:
                assert ours[task][key] == pytest.approx(value, rel=1e-5), (task, key)
            elif isinstance(value, float):
                assert ours[task][key] == pytest.approx(value, rel=METRIC_TOLERANCE, abs=1e-6), (task, key)
            else:
                assert ours[task][key] == value, (task, key)
    assert evaluated["ours"]["n-samples"] == evaluated["theirs"]["n-samples"]


def test_every_request_matches(evaluated: dict[str, Any]) -> None:
    worst = 0.0
    generated = 0
    for task, rows in evaluated["theirs"]["samples"].items():
        mine = evaluated["samples"][task]
        assert sorted(mine) == sorted(row["doc_id"] for row in rows)
        for row in rows:
            ours = mine[row["doc_id"]]
            # the same requests: lm-eval wrote the arguments by position
            assert [list(arg.values()) for arg in ours["arguments"].values()] == [list(a) for a in row["arguments"]]
            if task == "tiny_generate":
                assert ours["resps"] == row["resps"], row["doc_id"]
                generated += 1
                continue
            theirs = logliks(row["resps"])
            got = logliks(ours["resps"])
            assert len(got) == len(theirs)
            worst = max(worst, *(abs(a - b) for a, b in zip(got, theirs, strict=True)))
            if task == "tiny_choice":  # is-greedy flags too
                assert [r[0][1] for r in ours["resps"]] == [str(r[0][1]) for r in row["resps"]]
    assert worst <= TOLERANCE, worst
    assert generated == 4


def test_results_file_is_lm_evals_results_json(evaluated: dict[str, Any]) -> None:
    ours = evaluated["ours"]
    for key in ("results", "configs", "versions", "n-shot", "higher_is_better", "n-samples", "config", "task_hashes"):
        assert key in ours, key
    assert ours["config"]["model"] == "TheseusLM"
    assert ours["config"]["model_args"] == {"run": "tiny", "step": 0}
    assert ours["config"]["theseus_run"] == "tiny" and ours["config"]["max_length"] == 48
    assert ours["configs"]["tiny_generate"]["generation_kwargs"]["until"] == ["\n", ">", "a"]
    assert sorted(p.name for p in Path(evaluated["out"]).parent.iterdir()) == [
        "harness.json",
        *(f"samples_{task}.jsonl" for task in TASKS),
    ]
