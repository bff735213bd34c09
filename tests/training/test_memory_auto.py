"""``model/remat=auto`` through ``theseus run`` on CPU, where ``training/memory_limit_gb`` stands in for the
device's memory: the fastest setting that fits is chosen, said in one line, recorded and trained with, its
compiled step reused; a limit nothing fits is one error line and exit code 2."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import jax
import pytest
import yaml

from tests.reliability.conftest import call_cli, error_line

JOB_FILE = Path(__file__).with_name("memory_job.py")
#: A two-layer scanned GPT on 32-token rows. Its compiled step's peak per device on CPU: remat none 4.0 MB,
#: dots 1.9 MB, full 1.8 MB at 8 rows; full at 4 rows 1.3 MB, at 3 rows 1.1 MB; the state alone 0.37 MB.
SMALL = [
    "architecture/n_layers=2",
    "model/scan_layers=true",
    "architecture/n_embd=32",
    "architecture/n_heads=2",
    "architecture/block_size=32",
    "architecture/vocab_size=64",
    "training/steps=2",
    "training/eval_batches=0",
    "training/progress=false",
    "training/plots=false",
    "training/log_interval=1",
    "training/peak_flops=1e12",
    "model/remat=auto",
]
SIZE = r"([\d.]+) (GB|MB|kB)"
UNITS = {"GB": 1e9, "MB": 1e6, "kB": 1e3}


def auto_run(root: Path, *overrides: str) -> list[str]:
    return ["--load", str(JOB_FILE), "run", "test/memory/gpt", "--root", str(root), *SMALL, *overrides]


def megabytes(number: str, unit: str) -> float:
    return float(number) * UNITS[unit] / 1e6


def test_auto_trains_with_the_fastest_setting_that_fits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    with jax.log_compiles(), caplog.at_level(logging.WARNING):
        code = call_cli(auto_run(tmp_path, "training/batch_size=8", "training/memory_limit_gb=0.00172"))
    err = capsys.readouterr().err
    assert code == 0, err
    [line] = [text for text in err.splitlines() if text.startswith("model/remat=auto")]
    head, *tried = line.split("; ")
    chosen = re.fullmatch(
        rf"model/remat=auto: chose remat=dots, micro_batch_size=4: peak {SIZE} of {SIZE} "
        r"\(training/memory_limit_gb=0.00172\)",
        head,
    )
    assert chosen, line
    peak, usable = megabytes(*chosen.group(1, 2)), megabytes(*chosen.group(3, 4))
    assert usable == 1.72 and peak <= usable
    # every faster setting was compiled and needs more than the limit leaves
    assert [re.sub(SIZE, "", text) for text in tried] == [f"{p} at 8 rows needs " for p in ("none", "dots")]
    needs = [megabytes(*re.search(SIZE, text).group(1, 2)) for text in tried]  # type: ignore[union-attr]
    assert min(needs) > usable and needs[0] > 2 * usable  # without remat, more than twice the memory
    # three candidates compiled (two micro batches with dots come before full remat), the last of them the
    # very program the run called
    compiles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling jit(step)")]
    assert len(compiles) == 3
    run = tmp_path / "runs" / "test-memory-gpt"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert (saved["model"]["remat"], saved["training"]["micro_batch_size"]) == ("dots", 4)
    assert "8x32 tokens/step (2 micro-batches)" in err
    assert "trained 'test-memory-gpt' to step 2/2" in err


def test_auto_keeps_what_room_is_left_of_an_offloaded_state_on_the_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = call_cli(
        auto_run(tmp_path, "training/batch_size=8", "training/memory_limit_gb=0.02", "optimizer/offload=true")
    )
    err = capsys.readouterr().err
    assert code == 0, err
    [line] = [text for text in err.splitlines() if text.startswith("model/remat=auto")]
    kept = re.search(rf"; {SIZE} of the offloaded optimizer state kept on the device", line)
    assert line.startswith("model/remat=auto: chose remat=none, micro_batch_size=8") and kept, line
    saved = yaml.safe_load((tmp_path / "runs" / "test-memory-gpt" / "config.yaml").read_text())
    # the room left (about 16 MB) holds the whole state (0.37 MB at float32: two moments a parameter)
    assert saved["optimizer"]["offload_keep_gb"] * 1e3 == pytest.approx(megabytes(*kept.group(1, 2)), rel=0.01)
    assert 0.2 < megabytes(*kept.group(1, 2)) < 0.5
    assert "trained 'test-memory-gpt' to step 2/2" in err


def test_auto_with_nothing_that_fits_is_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = call_cli(auto_run(tmp_path, "training/batch_size=6", "training/memory_limit_gb=0.0007"))
    assert code == 2
    line = error_line(capsys.readouterr().err)
    assert re.fullmatch(
        rf"error: model/remat=auto: no setting fits in 700 kB \(training/memory_limit_gb=0.0007\): "
        rf"the smallest \(remat=full, micro_batch_size=3\) needs {SIZE}( \(the closest, [^)]*\))?; "
        r"keep the optimizer state in bfloat16 "
        r"\(optimizer/state_dtype=bfloat16\) or in host memory \(optimizer/offload=true\); "
        r"lower training/sequence_length=32 or "
        r"training/batch_size=6 \(its micro batches of 3 rows do not halve\), or train a smaller model",
        line,
    ), line
    assert not (tmp_path / "runs" / "test-memory-gpt" / "config.yaml").exists()


def test_the_device_limit_and_the_tpu_compilers_refusal_are_read() -> None:
    """What CPU runs cannot show: the limit a GPU or TPU reports, and the amount a TPU compile that ran out
    of memory names."""
    from theseus.training import memory
    from theseus.training.compiled import refused_sizes

    class Device:
        platform = "tpu"

        def memory_stats(self) -> dict[str, int]:
            return {"bytes_in_use": 0, "bytes_limit": 16_909_336_576}

    room = memory.budget(0.0, Device())
    assert room.bytes == 16_909_336_576 and str(room) == "16.9 GB (the device's memory)"
    assert str(memory.budget(2.5, Device())) == "2.5 GB (training/memory_limit_gb=2.5)"
    refusal = "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
    assert refused_sizes(refusal + "Used 26.20G of 15.48G hbm. Exceeded hbm capacity by 10.72G.") == (
        int(26.2 * 2**30),
        int(15.48 * 2**30),
    )


def test_a_tpu_step_is_judged_by_the_compilers_peak() -> None:
    """The figures of gpt2-124m's scanned step without remat on a v5e (16 x 1024 tokens, benchmarks/tpu_fit.py):
    the sum of arguments, unaliased outputs and temporaries says 17.62 GB, over the chip's 16.91 GB, but the
    compiler's peak is 16.82 GB and the chip ran it. Elsewhere (CPU, GPU) the sum stays the measure."""
    from theseus.training.compiled import CompiledStep

    figures = {
        "argument_bytes": 1_494_787_584,
        "output_bytes": 1_494_642_176,
        "alias_bytes": 1_494_640_128,
        "temporary_bytes": 16_126_678_016,
        "peak_bytes": 16_817_016_320,
        "code_bytes": 22_450_688,
        "batch_bytes": 196_608,  # x and y as int32, the padding mask as bool
    }
    limit = 16_909_336_064  # the chip's bytes_limit
    tpu = CompiledStep(None, None, "", 0, 0, 0, 0, compile_seconds=0.0, platform="tpu", **figures)
    assert tpu.summed_bytes == 17_621_467_648 and tpu.total_bytes == 16_839_467_008
    assert tpu.fits_in(limit)
    assert not tpu.fits_in(tpu.total_bytes + tpu.batch_bytes - 1)  # the next batch needs its room too
    cpu = CompiledStep(None, None, "", 0, 0, 0, 0, compile_seconds=0.0, platform="cpu", **figures)
    assert cpu.total_bytes == cpu.summed_bytes and not cpu.fits_in(limit)


def test_the_line_for_nothing_that_fits_names_the_closest_setting() -> None:
    """Fewer rows can need more (a micro batch adds a float32 gradient accumulator): the 1.1B Llama shape on one
    v5e needed 19.4 GB at one row per micro batch against 17.7 GB at eight, and the line names both."""
    from types import SimpleNamespace

    from theseus.training.memory import GB, Budget, Candidate, Trial, nothing_fits

    needs = {("none", 8): 36.6, ("dots", 8): 25.5, ("full", 8): 17.7, ("full", 4): 18.5, ("full", 1): 19.4}
    trials = [Trial(Candidate(remat, rows), int(gb * GB)) for (remat, rows), gb in needs.items()]
    trainer = SimpleNamespace(
        sharding=SimpleNamespace(data_size=1),
        sequence_length=2048,
        args=SimpleNamespace(batch_size=8),
        context=SimpleNamespace(config={"optimizer/offload": True, "optimizer/state_dtype": "bfloat16"}),
    )
    line = nothing_fits(trials, Budget(int(16.9 * GB), "the device's memory"), trainer)  # type: ignore[arg-type]
    assert line.startswith(
        "model/remat=auto: no setting fits in 16.9 GB (the device's memory): the smallest (remat=full, "
        "micro_batch_size=1) needs 19.4 GB (the closest, remat=full, micro_batch_size=8, 17.7 GB); lower "
        "training/sequence_length=2048"
    ), line
