"""The step benchmarks (layer layouts, host memory, Muon, DPO, sliding windows) run at trivially
small sizes and return their timings; only structure is asserted, never speed."""

from __future__ import annotations

import os

import pytest

from tests.benchmarks.test_benchmarks_smoke import TINY


def test_scan_layers_benchmark_times_both_layouts_side_by_side() -> None:
    from benchmarks import scan_layers

    # two layers: the scan (two iterations, unrolled 2) against the same two layers unrolled
    result = scan_layers.steady_state("tiny", 2, 16, width=32, layers=2, unrolls=(2,), steps=1, repeats=2)
    assert list(result) == ["unrolled", "scanned, unroll 2"] and result["unrolled"][1] == 1.0
    assert all(ms > 0 and ratio > 0 for ms, ratio in result.values())


def test_host_memory_benchmark_runs_both_allocators_in_fresh_processes() -> None:
    from benchmarks import host_memory
    from theseus.base.host_memory import TUNABLES, huge_page_environment

    if huge_page_environment({k: v for k, v in os.environ.items() if k != TUNABLES}) is None:
        pytest.skip("needs glibc >= 2.35 and transparent huge pages")
    small = {"architecture/n_layers": 1, "architecture/n_embd": 32, "architecture/n_heads": 2}
    windows = host_memory.compare("tiny", 2, 16, steps=2, warmup=0, rounds=1, overrides=small)
    assert [w.side for w in windows] == ["huge", "system"]
    assert all(w.step_seconds > 0 and w.page_faults >= 0 and w.peak_rss_mb > 0 for w in windows)
    assert host_memory.huge_ratio(windows) > 0


def test_muon_benchmark_times_both_muons_beside_adamw() -> None:
    from benchmarks import muon_step

    _, result = muon_step.compare("tiny", 2, 16, {**TINY, "architecture/vocab_multiple": 1}, steps=1, repeats=2)
    assert list(result) == ["AdamW", muon_step.PER_PARAMETER, muon_step.BATCHED]
    assert result[muon_step.PER_PARAMETER][1] == 1.0
    assert all(ms > 0 and ratio > 0 for ms, ratio in result.values())


def test_dpo_step_benchmark_times_every_update() -> None:
    from benchmarks import dpo_step

    times = dpo_step.measure(layers=1, width=32, block=64, rows=4, rounds=1)
    assert set(times) == {"sft", "dpo copy", "dpo precomputed", "sft lora", "dpo lora"}
    assert all(t > 0 for t in times.values())


def test_sliding_window_benchmark_times_both_masks() -> None:
    from benchmarks import sliding_window

    found = sliding_window.measure(width=32, heads=2, seq=256, window=32, rounds=1)
    for kind in ("attention", "block"):
        assert found[f"{kind} full"] > 0 and found[f"{kind} window"] > 0 and found[f"{kind} ratio"] > 0


def test_moe_model_benchmark_times_the_mixture_against_its_dense_twin() -> None:
    from benchmarks import moe_model

    shape = {**moe_model.shapes(quick=True), "layers": 1}  # one mixture layer and its dense twin: half the compile
    assert moe_model.overrides(shape, moe=False)["architecture/d_ff"] == shape["top_k"] * shape["hidden"]
    found = moe_model.throughput(shape, rounds=1, steps=1)
    assert found["dense_ms"] > 0 and found["moe_ms"] > 0 and found["ratio"] > 0


def test_checkpoint_verify_benchmark_times_the_three_reads(tmp_path) -> None:
    from benchmarks import checkpoint_verify

    result = checkpoint_verify.measure("tiny", 1, tmp_path / "checkpoints")
    assert sorted(result["seconds"]) == ["restore (unverified)", "restore (verified)", "verification alone"]
    assert all(len(times) == 1 and times[0] > 0 for times in result["seconds"].values())
    assert result["saved_bytes"] > 0 and result["bytes"] > 0
    assert "| verification alone |" in checkpoint_verify.report("tiny", result)


def test_checkpoint_verify_benchmark_splits_the_reads_between_two_processes() -> None:
    from benchmarks import checkpoint_verify

    results = checkpoint_verify.launch(2, megabytes=4, rounds=1)
    assert [result["process"] for result in results] == [0, 1]
    saved = results[0]["bytes_read"]["alone"]
    shares = [result["bytes_read"]["split"] for result in results]
    assert sum(shares) == saved and max(shares) < 0.6 * saved  # each reads its share, about half
    assert all(result["bytes_read"]["share"] == result["bytes_read"]["split"] for result in results)
    assert "| process 1 of 2, its share, verdicts exchanged |" in checkpoint_verify.report_processes(results)
