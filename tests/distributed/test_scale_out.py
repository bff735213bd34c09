"""Scale-out and elastic determinism: one job on 1 device, on 4 simulated devices in every layout,
and on 2 processes, all reading the same global batches from the same flywheel.

Everything runs in subprocesses (the device count is fixed when jax starts): two CLI processes
on localhost joined by ``jax.distributed`` (gloo collectives, 2 CPU devices each) train the
flywheel-fed job (a mixture of "pmd" and "padded" data) without gradient accumulation for 3 of
5 steps and checkpoint; then one process with 4 devices trains the same job on 1 device (4
micro-batches) and in the dp, fsdp, tp and fsdp+tp layouts (2 micro-batches), and finally
resumes the two-process checkpoint to step 5 as fsdp+tp. The data loader is the trainer's own
in every run: the global batch of a step is a function of the seed and step alone.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import REPO, clean_env, run_joined, xla_flags
from tests.distributed.settings import overrides
from tests.training.conftest import write_byte_corpus

HERE = Path(__file__).resolve().parent
TWO_PROCESS = overrides(
    training__stop_after=3,
    training__eval_interval=3,
    training__eval_batches=1,
    training__evaluation_interval=3,
    training__analysis_interval=3,
    evaluation__perplexity__batches=1,
    evaluation__multiple_choice__limit=3,
    analysis__activations__plot=False,
    run__name="two-process",
    training__micro_batch_size=8,  # no accumulation here; 2 and 4 micro-batches in the other runs
)
#: The plan of GPT restricted per layout: logical axis -> mesh axis.
PLANS = {
    "dp": {},
    "fsdp": {"embed": "data"},
    "tp": {"mlp": "model", "heads": "model", "kv_heads": "model", "vocab": "model"},
    "fsdp+tp": {"embed": "data", "mlp": "model", "heads": "model", "kv_heads": "model", "vocab": "model"},
}
MESHES = {"dp": {"data": 4, "model": 1}, "fsdp": {"data": 4, "model": 1}, "tp": {"data": 1, "model": 4}}
MESHES["fsdp+tp"] = {"data": 2, "model": 2}


def env_with_devices(count: int) -> dict[str, str]:
    return clean_env(XLA_FLAGS=xla_flags(devices=count), JAX_PLATFORMS="cpu")


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def scale_out(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("scale-out")
    write_byte_corpus(root, "fineweb")
    write_byte_corpus(root, "chat", documents=48, seed=1)
    args = [*("--load", str(HERE / "jobs.py")), *("run", "test/distributed/gpt", *TWO_PROCESS, "--root", str(root))]
    done = run_joined(args, env=lambda _: env_with_devices(2))
    logs = [{"rc": process.returncode, "out": process.stdout, "err": process.stderr} for process in done]
    run_dir = root / "runs" / "two-process"
    two = {"logs": logs, "run_dir": run_dir}
    if all(log["rc"] == 0 for log in logs):
        two["metrics"] = metrics(run_dir)
        two["provenance"] = json.loads((run_dir / "provenance.json").read_text())
        two["checkpoints"] = sorted(p.name for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    results = root / "layouts.json"
    command = [sys.executable, str(HERE / "layouts_run.py"), str(root), str(results)]
    if "metrics" in two:
        command.append("two-process")
    done = subprocess.run(command, capture_output=True, text=True, env=env_with_devices(4), cwd=REPO, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"two": two, "one": json.loads(results.read_text())}


def close(actual: list[float], expected: list[float]) -> None:
    assert len(actual) == len(expected)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=0)


def test_every_layout_gives_the_losses_of_one_device(scale_out: dict[str, Any]) -> None:
    runs = scale_out["one"]["runs"]
    assert scale_out["one"]["device_count"] == 4
    single = runs["single"]
    assert single["mesh"] == {"data": 1, "model": 1}
    assert single["losses"]["steps"] == [1, 2, 3, 4, 5]
    assert single["losses"]["train"][-1] < single["losses"]["train"][0] - 0.5  # it learns
    for layout, mesh in MESHES.items():
        run = runs[layout]
        assert run["mesh"] == mesh and run["layout"] == layout
        assert run["sharding_type"] == single["sharding_type"] == "TrainerSharding"
        close(run["losses"]["train"], single["losses"]["train"])


def expected_spec(logical: list[str | None], plan: dict[str, str]) -> list[str | None]:
    spec = [plan.get(axis) if axis else None for axis in logical]
    while spec and spec[-1] is None:
        spec.pop()
    return spec


def test_layouts_shard_parameters_and_optimizer_state_as_planned(scale_out: dict[str, Any]) -> None:
    runs = scale_out["one"]["runs"]
    for layout, plan in PLANS.items():
        run = runs[layout]
        mesh = run["mesh"]
        for path, info in run["params"].items():
            spec = expected_spec(run["logical"][path], plan)
            assert info["spec"] == spec, (layout, path)
            padded = spec + [None] * (len(info["shape"]) - len(spec))
            held = [size // (mesh[axis] if axis else 1) for size, axis in zip(info["shape"], padded, strict=True)]
            assert info["device_shapes"] == [held], (layout, path)
            assert info["devices"] == 4
            mirrors = [v for k, v in run["opt_state"].items() if k.endswith("/" + path) and v["shape"] == info["shape"]]
            assert len(mirrors) == 2, (layout, path)  # AdamW's two moments
            assert all(m["spec"] == spec and m["device_shapes"] == [held] for m in mirrors), (layout, path)
    up = "blocks/mlp/up/kernel"  # [layers, embed=32, mlp=128]: the scanned layers' axis is never split
    layers = runs["dp"]["params"][up]["shape"][0]
    assert runs["dp"]["params"][up]["device_shapes"] == [[layers, 32, 128]]  # replicated
    assert runs["fsdp"]["params"][up]["device_shapes"] == [[layers, 8, 128]]  # a quarter on each device
    assert runs["tp"]["params"][up]["device_shapes"] == [[layers, 32, 32]]  # the mlp dimension split
    assert runs["fsdp+tp"]["params"][up]["device_shapes"] == [[layers, 16, 64]]
    assert runs["tp"]["params"]["blocks/attn/query"]["device_shapes"] == [[layers, 32, 1, 8]]  # one head each


def test_memory_benchmark_counts_the_bytes_devices_hold(scale_out: dict[str, Any]) -> None:
    runs = scale_out["one"]["runs"]
    for layout in ["single", *PLANS]:
        sizes = runs[layout]["bytes"]
        assert sizes["planned"] == sizes["held"], layout  # the benchmark's arithmetic = the real shards
    whole = sum(runs["dp"]["bytes"]["whole"])
    assert sum(runs["dp"]["bytes"]["held"]) == whole  # replicated
    assert sum(runs["fsdp"]["bytes"]["held"]) < 0.3 * whole  # all but norms split four ways
    rows = {row["layout"]: row for row in scale_out["one"]["benchmark"]}
    assert set(rows) == set(PLANS) and all(row["preset"] == "tiny" and not row["error"] for row in rows.values())
    dp = rows["dp"]["param_bytes"] + rows["dp"]["opt_bytes"]
    assert rows["dp"]["param_bytes"] == rows["dp"]["total_param_bytes"] == 4 * rows["dp"]["parameters"]
    assert 0 <= rows["dp"]["opt_bytes"] - 2 * rows["dp"]["param_bytes"] <= 64  # AdamW: two moments and a count
    for layout in ("fsdp", "tp", "fsdp+tp"):
        assert 0.25 * dp <= rows[layout]["param_bytes"] + rows[layout]["opt_bytes"] < 0.3 * dp, layout
    assert scale_out["one"]["benchmark_table"].count("\n| tiny") == 4


def test_sizes_that_do_not_split_are_one_line_errors(scale_out: dict[str, Any]) -> None:
    errors = scale_out["one"]["errors"]
    assert all("\n" not in message for message in errors.values())
    assert (
        "'blocks/attn/key' dimension 2 (kv_heads=2) is not divisible by the model mesh axis of size 4"
        in (errors["heads"])
    )
    assert "(vocab=258) is not divisible by the model mesh axis of size 4" in errors["vocab"]
    assert "(embed=30) is not divisible by the data mesh axis of size 4" in errors["embed"]
    assert "micro batch of 6 rows cannot be split over 4 data-parallel devices" in errors["batch"]
    assert "mesh/data x mesh/model = 4" in errors["mesh"]


def test_two_processes_give_the_losses_of_one_process_with_four_devices(scale_out: dict[str, Any]) -> None:
    two = scale_out["two"]
    for index, log in enumerate(two["logs"]):
        assert log["rc"] == 0, f"process {index}:\n{log['err'][-3000:]}"
    assert two["provenance"]["process_count"] == 2 and len(two["provenance"]["devices"]) == 4
    train = [row for row in two["metrics"] if row["split"] == "train"]
    val = [row for row in two["metrics"] if row["split"] == "val"]
    assert [row["step"] for row in train] == [1, 2, 3]  # written once, by process 0
    reference = scale_out["one"]["runs"]["dp"]["losses"]
    close([row["loss"] for row in train], reference["train"][:3])
    close([row["loss"] for row in val], reference["val"][:1])
    assert two["checkpoints"] == ["3"]
    # Evaluations and analyses run on every process (they are collective); process 0 records them.
    (evaluated,) = [row for row in two["metrics"] if row["split"] == "eval"]
    close([evaluated["perplexity/loss"]], reference["val"][:1])  # the same batch as the validation
    assert evaluated["multiple_choice/questions"] == 3 and 0 <= evaluated["multiple_choice/acc"] <= 1
    (analysed,) = [row for row in two["metrics"] if row["split"] == "analysis"]
    assert analysed["activations/nonfinite"] == 0
    # step 3 by the two processes; step 5 by the resumed run (same job, so the same analyses) at its end
    written = sorted(p.name for p in (two["run_dir"] / "analysis" / "activations").iterdir())
    assert written == ["step_00000003.json", "step_00000005.json"]
    first, second = (log["err"] for log in two["logs"])
    assert "step 3/5" in first and "two-process:" in first
    assert "step 3/5" not in second and "two-process:" not in second and "val loss" not in second


def test_a_two_process_checkpoint_resumes_in_one_process_and_another_layout(scale_out: dict[str, Any]) -> None:
    assert "metrics" in scale_out["two"], "the two-process run failed"
    resumed = scale_out["one"]["resumed"]
    reference = scale_out["one"]["runs"]["dp"]["losses"]
    assert resumed["step"] == 5
    # restored into fsdp+tp, one entry per layer (the two processes saved the layers stacked)
    assert resumed["params"]["blocks_0/mlp/up/kernel"]["spec"] == ["data", "model"]
    assert resumed["losses"]["steps"] == [1, 2, 3, 4, 5]
    close(resumed["losses"]["train"][3:], reference["train"][3:])
    close(resumed["losses"]["val"], reference["val"])
