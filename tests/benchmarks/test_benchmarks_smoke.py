"""The benchmark suite runs end to end at trivially small sizes and produces its tables.

Only structure is asserted (rows, columns, statuses), never timing: speed is measured by
``python benchmarks/run_all.py``, not by tests.
"""

from __future__ import annotations

import dataclasses
import math

import pytest

from benchmarks import gpu_mfu, run_all
from benchmarks.common import Loop, Row, Timing, interleaved, markdown_table, paired_ratio, percent
from benchmarks.torch_baseline import SKIPPED, torch_available

TINY = {"architecture/n_layers": 1, "architecture/n_embd": 32, "architecture/n_heads": 2}


def _table_lines(table: str) -> list[str]:
    return [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| Figure")]


def test_row_status_compares_with_the_goal_in_its_direction() -> None:
    assert Row("t", 0.4, "s", 0.5, "max").status == "pass"
    assert Row("t", 0.6, "s", 0.5, "max").status == "miss"
    assert Row("r", 1.2, "x", 1.0, "min").status == "pass"
    assert Row("r", 0.9, "x", 1.0, "min").status == "miss"
    assert Row("i", 3.0).status == "info"
    assert Row("n", None, goal=1.0).status == "n/a"
    assert percent("mfu", 0.5, 0.45).shown_value() == "50.0 %"
    assert percent("mfu", 0.5, 0.45).shown_goal() == "≥ 45.0 %"


def test_paired_ratio_is_the_median_of_per_round_ratios() -> None:
    a = Timing("a", 1.0, [2.0, 4.0, 9.0], 10, flops_per_step=100.0)
    b = Timing("b", 1.0, [1.0, 1.0, 3.0], 10)
    assert paired_ratio(a, b) == 3.0  # per-round ratios 2, 4, 3
    assert a.step_seconds == 4.0
    assert a.tokens_per_s == pytest.approx(10 / 4.0)
    assert a.flops_per_s == pytest.approx(100 / 4.0)
    assert b.flops_per_s is None


def test_interleaved_rounds_rotate_and_time_windows_after_one_untimed_step() -> None:
    calls: list[tuple[str, int]] = []

    class Recording(Loop):
        def __init__(self, name: str) -> None:
            self.name = name

        def prepare(self, warmup: int) -> float:
            return 0.0

        def run(self, steps: int) -> None:
            calls.append((self.name, steps))

    timings = interleaved([Recording("a"), Recording("b"), Recording("c")], steps=4, repeats=4, warmup=0)
    assert calls == [
        (name, steps)
        for order in ("abc", "bca", "cab", "abc")
        for name in order
        for steps in (1, 4)  # the untimed step, then the timed window
    ]
    assert all(len(t.windows) == 4 for t in timings.values())


def test_markdown_table_has_header_machine_and_one_line_per_row() -> None:
    rows = [Row("x", 1.0, "s", 2.0, "max"), Row("y", None, note="a|b")]
    table = markdown_table(rows, title="T")
    assert table.startswith("### T")
    assert "Machine:" in table and "cores" in table and "Date:" in table
    lines = _table_lines(table)
    assert lines == ["| x | 1 s | ≤ 2 s | pass |  |", "| y | — | — | n/a | a\\|b |"]


@pytest.mark.slow
def test_run_all_smoke_produces_every_row() -> None:
    rows = run_all.measure(run_all.SMOKE)
    names = [row.name for row in rows]
    small = "tiny 2x16"
    expected = [
        "Matmul peak (f32 jnp.dot)",
        f"Bare flax+optax loop ({small})",
        f"Our trainer.run() loop ({small})",
        f"Framework overhead: trainer.run() ÷ bare ({small})",
        f"Trainer step ÷ bare step ({small})",
        f"PyTorch nanoGPT-style loop ({small})",
        f"Ours ÷ PyTorch tokens/s ({small})",
        f"MFU {small}",
        "Our trainer.run() loop (tiny 1x16)",
        "PyTorch nanoGPT-style loop (tiny 1x16)",
        "Ours ÷ PyTorch tokens/s (tiny 1x16)",
        "MFU tiny 1x16 (goal figure)",
        "`theseus jobs` wall time",
        f"Time to first training step ({small})",
        f"Time to first training step, warm cache ({small})",
        "gzip -9 on the demo's validation split",
        "bz2 -9 on the demo's validation split",
        "xz -9e on the demo's validation split",
        "Demo bits/byte (demo/gpt)",
        "Batch assembly from memmap (pmd, 8x1024)",
        "Tokenization (byte)",
    ]
    assert names == expected
    failed = [f"{row.name}: {row.note}" for row in rows if "failed:" in row.note]
    assert not failed, failed
    for row in rows:
        if row.name == "Demo bits/byte (demo/gpt)":  # the demo itself runs in full mode only
            assert row.value is None and row.note == "not run in quick mode", row
        elif row.value is None:
            assert not torch_available() and row.note == SKIPPED, row
        else:
            assert math.isfinite(row.value) and row.value > 0, row
    statuses = {row.name: row.status for row in rows}
    assert statuses["`theseus jobs` wall time"] in {"pass", "miss"}
    assert statuses["MFU tiny 1x16 (goal figure)"] in {"pass", "miss"}
    table = markdown_table(rows)
    assert len(_table_lines(table)) == len(expected)


@pytest.mark.slow
def test_gpu_script_cpu_smoke_produces_its_table() -> None:
    # The bare loop is covered by the run_all smoke test; leaving it out here halves the compile time.
    setting = dataclasses.replace(gpu_mfu.CPU_SMOKE, model_overrides=TINY, bare=False)
    rows = gpu_mfu.measure(setting, log=lambda text: None)
    names = [row.name for row in rows]
    assert names[:4] == [
        "Device",
        "Published dense bf16 peak",
        "Measured bf16 matmul (size 128, in-round median)",
        "Our trainer.run() loop (tiny 2x32, bfloat16 activations)",
    ]
    assert "Framework overhead: trainer.run() ÷ bare" not in names
    mfu = {row.name: row for row in rows}["MFU vs measured bf16 matmul"]
    assert mfu.value is not None and mfu.value > 0
    # On CPU there is no published bf16 peak: that row says so instead of inventing one.
    published = {row.name: row for row in rows}["MFU vs published peak (tiny 2x32, bfloat16 activations)"]
    assert published.value is None and "no published peak" in published.note
    assert len(_table_lines(markdown_table(rows))) == len(rows)


def test_published_peaks_match_hopper_device_kinds() -> None:
    assert gpu_mfu.published_peak("NVIDIA H200") == 989e12
    assert gpu_mfu.published_peak("NVIDIA H100 80GB HBM3") == 989e12
    assert gpu_mfu.published_peak("NVIDIA H100 PCIe") == 756e12
    assert gpu_mfu.published_peak("cpu") is None


def test_every_tpu_case_is_a_configuration_the_models_accept() -> None:
    """Each case of the one-chip table resolves (keys, values, model) without building its model, and its
    dense case has the mixture's active width: a case with a wrong key would spend a chip visit failing."""
    from benchmarks import tpu_fit, tpu_mfu
    from theseus.training.config import BaseTrainerConfig

    trainer_keys = {f.metadata.get("theseus_key") for f in dataclasses.fields(BaseTrainerConfig)}
    for name, case in [*tpu_mfu.CASES.items(), *tpu_fit.CASES.items()]:
        work = case.workload(build=False)
        assert work.config["architecture/block_size"] == case.seq, name
        assert set(case.trainer) <= trainer_keys, name
    mixture, dense = tpu_mfu.CASES["mixtral-8x768"].overrides, tpu_mfu.CASES["dense-8x768"].overrides
    top_k = mixture["architecture/moe/top_k"]
    assert dense["architecture/mlp_ratio"] == top_k * mixture["architecture/mlp_ratio"]
    assert tpu_mfu.published_peak("TPU v5 lite") == 197e12


def test_trace_ops_reads_self_time_of_one_step(tmp_path):
    """Ops nested in a loop count once, only one whole execution of the step counts, and the top op and
    the split by HLO category are what a Perfetto trace of the chip says."""
    import gzip
    import json

    from benchmarks import trace_ops

    def meta(kind, pid, name, tid=0):
        return {"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": {"name": name}}

    def op(name, ts, dur, category, tid=2):
        return {"ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name, "args": {"hlo_category": category}}

    events = [
        meta("process_name", 1, "/device:TPU:0"),
        meta("thread_name", 1, "XLA Modules", tid=1),
        meta("thread_name", 1, "XLA Ops", tid=2),
        {"ph": "X", "pid": 1, "tid": 1, "ts": 0, "dur": 50, "name": "jit_step(1)"},  # a partial step before
        {"ph": "X", "pid": 1, "tid": 1, "ts": 100, "dur": 100, "name": "jit_step(1)"},
        op("fusion.1", 10, 40, "convolution fusion"),  # outside the whole step: not counted
        op("while.3", 100, 80, "while"),
        op("fusion.2", 110, 30, "convolution fusion"),
        op("splash_mha_fwd.4", 150, 20, "custom-call"),
        op("add_fusion.5", 185, 10, "loop fusion"),
    ]
    folder = tmp_path / "profile" / "plugins"
    folder.mkdir(parents=True)
    (folder / "perfetto_trace.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": events}).encode()))

    tracks, times = trace_ops.op_times(events)
    assert tracks == "/device:TPU:0 XLA Ops"
    assert times == {"while.3": 30, "fusion.2": 30, "splash_mha_fwd.4": 20, "add_fusion.5": 10}
    assert trace_ops.op_times(events, "hlo_category")[1]["convolution fusion"] == 30
    assert trace_ops.main([str(tmp_path)]) == 0


def test_moe_parts_times_each_part_against_the_dense_mlp(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/moe_parts.py at a tiny shape (the megablox kernels interpreted, one tile)."""
    from benchmarks import moe_parts

    argv = ["--tokens", "64", "--width", "32", "--expert-hidden", "32", "--experts", "4", "--dtype", "float32"]
    moe_parts.main([*argv, "--tiles", "32,32,32", "--paths", "ragged_dot", "--rounds", "1"])
    rows = [line.strip("| ").split(" | ") for line in _table_lines(capsys.readouterr().out)]
    assert [row[0] for row in rows] == [
        "part",
        "dense",
        "dispatch",
        "products ragged_dot",
        "products gmm 32x32x32",
        "layer ragged_dot",
    ]
    assert rows[1][2] == "1.00" and all(float(row[1]) > 0 for row in rows[1:])
