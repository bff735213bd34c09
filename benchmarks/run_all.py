"""Every performance figure of theseus, measured side by side in one run, printed as a Markdown table.

    python benchmarks/run_all.py            # full sizes (several minutes on 2 cores)
    python benchmarks/run_all.py --quick    # small sizes, a smoke check (1-2 minutes)

Figures (medians of several repetitions after warm-up; loops timed interleaved, round by round):

* matmul peak: a large jitted float32 ``jnp.dot`` (the MFU denominator);
* framework overhead: our ``trainer.run()`` loop ÷ a minimal flax + optax loop, same model and batches;
* trainer step ÷ bare loop: the jitted step alone (locates overhead: step vs host loop);
* ours ÷ PyTorch: our tokens/s ÷ a nanoGPT-style PyTorch loop (same architecture, AdamW), for the tiny
  and the 124M preset;
* MFU: model FLOP/s (``GPT.flops(seq)`` x batch / step time) over the matmul peak measured in the same
  rounds, tiny and 124M;
* ``theseus jobs`` wall time and time from a fresh process to the first training step (tiny), with an
  empty and a warm compilation cache, phase by phase;
* the demo speedrun: ``demo/gpt``'s bits per byte against gzip / bz2 / xz on the same held-out bytes
  (the demo itself only in full mode);
* data: memmap batch assembly and tokenization tokens/s (helpers of ``benchmarks/data_*.py``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, Timing, load_average, markdown_table, paired_ratio, percent, start_like_theseus_run

OVERHEAD_GOAL = 1.03
TORCH_GOAL = 1.0
MFU_GOAL = 0.50
JOBS_GOAL = 0.5
#: A tiny 1-step run's start-up until the first update, empty / warm compilation cache (issue goals).
FIRST_STEP_GOAL_COLD = 4.0
FIRST_STEP_GOAL_WARM = 2.5
ASSEMBLY_GOAL = 50e6


@dataclasses.dataclass(frozen=True)
class Sizes:
    """What one run measures; ``FULL`` and ``QUICK`` are the two settings of the command line."""

    peak_size: int
    peak_repeats: int
    peak_seconds: float  # the in-round peak window lasts at least this long
    small_preset: str
    small_batch: int
    small_seq: int
    small_steps: int
    large_preset: str
    large_batch: int
    large_seq: int
    large_steps: int
    repeats: int
    warmup: int
    large_repeats: int
    large_warmup: int
    large_bare: bool  # also time the bare loop on the large preset
    jobs_repeats: int
    data_tokens: int
    data_seconds: float
    tokenize_documents: int
    bpe_vocab: int  # 0 = skip the BPE tokenizer
    #: configuration values applied to both presets (tests shrink the model with them)
    model_overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: run ``demo/gpt`` with these overrides for the speedrun row (None: compressor rows only)
    demo_overrides: list[str] | None = None


FULL = Sizes(
    peak_size=2048,
    peak_repeats=7,
    peak_seconds=3.0,
    small_preset="tiny",
    small_batch=8,
    small_seq=256,
    small_steps=5,
    large_preset="gpt2-124m",
    large_batch=1,
    large_seq=512,
    large_steps=1,
    repeats=5,
    warmup=2,
    large_repeats=3,
    large_warmup=1,
    large_bare=False,
    jobs_repeats=5,
    data_tokens=20_000_000,
    data_seconds=2.0,
    tokenize_documents=300,
    bpe_vocab=4096,
    demo_overrides=[],
)

QUICK = Sizes(
    peak_size=1024,
    peak_repeats=5,
    peak_seconds=1.0,
    small_preset="tiny",
    small_batch=4,
    small_seq=128,
    small_steps=3,
    large_preset="gpt2-124m",
    large_batch=1,
    large_seq=128,
    large_steps=1,
    repeats=3,
    warmup=1,
    large_repeats=2,
    large_warmup=1,
    large_bare=False,
    jobs_repeats=5,
    data_tokens=2_000_000,
    data_seconds=0.5,
    tokenize_documents=60,
    bpe_vocab=0,
)

#: A tiny setting for tests: every row, trivially small sizes.
SMOKE = dataclasses.replace(
    QUICK,
    peak_size=128,
    peak_repeats=2,
    peak_seconds=0.0,
    small_batch=2,
    small_seq=16,
    small_steps=1,
    large_preset="tiny",
    large_batch=1,
    large_seq=16,
    repeats=1,
    warmup=0,
    large_repeats=1,
    large_warmup=0,
    jobs_repeats=1,
    data_tokens=200_000,
    data_seconds=0.05,
    tokenize_documents=3,
    model_overrides={"architecture/n_layers": 1, "architecture/n_embd": 32, "architecture/n_heads": 2},
)


def _failed(what: str, exc: BaseException) -> str:
    line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{what} failed: {type(exc).__name__}{': ' + line if line else ''}"


def _guard(what: str, rows: list[Row], fallback: list[Row], fn: Callable[[], list[Row]], log: Callable) -> None:
    """Append ``fn()``'s rows, or ``fallback`` rows noting the error (the run continues)."""
    try:
        rows.extend(fn())
    except Exception as exc:  # a benchmark section must not end the whole run
        log(traceback.format_exc())
        note = _failed(what, exc)
        rows.extend(dataclasses.replace(row, note=note) for row in fallback)


# -- sections ------------------------------------------------------------------------------------


def peak_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    from benchmarks.peak import measure_peak

    peak = measure_peak(sizes.peak_size, "float32", repeats=sizes.peak_repeats)
    state["peak"] = peak.flops_per_s
    return [
        Row(
            "Matmul peak (f32 jnp.dot)",
            peak.flops_per_s / 1e9,
            "GFLOP/s",
            note=f"{peak.size}x{peak.size}, median of {sizes.peak_repeats}; MFU denominator",
            fmt="{:.1f}",
        )
    ]


def _loops_timed(
    preset: str,
    batch: int,
    seq: int,
    steps: int,
    sizes: Sizes,
    *,
    repeats: int,
    warmup: int,
    bare: bool,
    trainer_step: bool = False,
) -> tuple[Any, dict[str, Timing]]:
    """The workload and the timings of its loops: the bare loop (if ``bare``), the trainer's jitted step
    (if ``trainer_step``) and PyTorch, interleaved round by round with our ``trainer.run()`` loop."""
    from benchmarks.bare_loop import BareLoop, TrainerStepLoop, measure_trainer_loop, trainer_available
    from benchmarks.common import Loop, interleaved
    from benchmarks.peak import PeakLoop
    from benchmarks.torch_baseline import TorchLoop, torch_available
    from benchmarks.workload import Workload

    work = Workload.create(preset, batch=batch, seq=seq, overrides=sizes.model_overrides)
    loops: list[Loop] = [PeakLoop(sizes.peak_size, min_seconds=sizes.peak_seconds)]
    if bare:
        loops.append(BareLoop(work))
    if trainer_step and trainer_available() is None:
        loops.append(TrainerStepLoop(work))
    if torch_available():
        loops.append(TorchLoop(work.dims, work.torch_batches(), flops_per_step=work.flops_per_step()))
    try:
        if trainer_available() is None:
            timings = measure_trainer_loop(work, loops, steps=steps, repeats=repeats, warmup=warmup)
        else:
            timings = interleaved(loops, steps=steps, repeats=repeats, warmup=warmup)
    finally:
        for loop in loops:
            loop.close()
    return work, timings


def _describe(work: Any) -> str:
    return f"{work.preset} {work.batch}x{work.seq}"


def _ours(timings: dict[str, Timing]) -> Timing | None:
    from benchmarks.bare_loop import RUN_LOOP

    return timings.get(RUN_LOOP)


def _torch(timings: dict[str, Timing]) -> Timing | None:
    return next((t for name, t in timings.items() if name.startswith("pytorch")), None)


def small_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    from benchmarks.bare_loop import trainer_available

    work, timings = _loops_timed(
        sizes.small_preset,
        sizes.small_batch,
        sizes.small_seq,
        sizes.small_steps,
        sizes,
        repeats=sizes.repeats,
        warmup=sizes.warmup,
        bare=True,
        trainer_step=True,
    )
    where = _describe(work)
    bare, step = timings.get("bare flax+optax"), timings.get("trainer step")
    ours, torch = _ours(timings), _torch(timings)
    missing = trainer_available() or "trainer not measured"
    rows = [_tokens_row(f"Bare flax+optax loop ({where})", bare, "")]
    rows.append(_tokens_row(f"Our trainer.run() loop ({where})", ours, "" if ours else missing))
    rows.append(
        Row(
            f"Framework overhead: trainer.run() ÷ bare ({where})",
            None if ours is None or bare is None else paired_ratio(ours, bare),
            "x",
            OVERHEAD_GOAL,
            "max",
            "step-time ratio, median of paired rounds" if ours else missing,
            "{:.3f}",
        )
    )
    rows.append(
        Row(
            f"Trainer step ÷ bare step ({where})",
            None if step is None or bare is None else paired_ratio(step, bare),
            "x",
            note="the jitted step alone, without the host loop" if step else missing,
            fmt="{:.3f}",
        )
    )
    rows.extend(_torch_rows(where, ours or bare, torch, state))
    rows.append(_mfu_row(f"MFU {where}", ours or bare, timings, state, None))
    return rows


def large_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    work, timings = _loops_timed(
        sizes.large_preset,
        sizes.large_batch,
        sizes.large_seq,
        sizes.large_steps,
        sizes,
        repeats=sizes.large_repeats,
        warmup=sizes.large_warmup,
        bare=sizes.large_bare,
    )
    where = _describe(work)
    ours, bare, torch = _ours(timings), timings.get("bare flax+optax"), _torch(timings)
    measured = ours or bare
    rows = [_tokens_row(f"Our trainer.run() loop ({where})", measured, "" if ours else "bare loop (no trainer)")]
    rows.extend(_torch_rows(where, measured, torch, state))
    rows.append(_mfu_row(f"MFU {where} (goal figure)", measured, timings, state, MFU_GOAL))
    if bare is not None:
        rows.append(_mfu_row(f"MFU {where}, bare flax+optax loop", bare, timings, state, None))
        if ours is not None:
            rows.append(
                Row(
                    f"Framework overhead: trainer.run() ÷ bare ({where})",
                    paired_ratio(ours, bare),
                    "x",
                    OVERHEAD_GOAL,
                    "max",
                    "step-time ratio, median of paired rounds",
                    "{:.3f}",
                )
            )
    return rows


def _tokens_row(name: str, timing: Timing | None, note: str) -> Row:
    return Row(
        name,
        None if timing is None else timing.tokens_per_s,
        "tok/s",
        note=note or ("" if timing is None else f"{timing.step_seconds * 1e3:.0f} ms/step"),
        fmt="{:,.0f}",
    )


def _torch_rows(where: str, ours: Timing | None, torch: Timing | None, state: dict[str, Any]) -> list[Row]:
    from benchmarks.torch_baseline import SKIPPED

    if torch is None:
        return [
            Row(f"PyTorch nanoGPT-style loop ({where})", None, "tok/s", note=SKIPPED),
            Row(f"Ours ÷ PyTorch tokens/s ({where})", None, "x", TORCH_GOAL, "min", SKIPPED, "{:.2f}"),
        ]
    best = "" if ours is None else f"; best rounds {min(torch.windows) / min(ours.windows):.2f}x"
    return [
        _tokens_row(f"PyTorch nanoGPT-style loop ({where})", torch, ""),
        Row(
            f"Ours ÷ PyTorch tokens/s ({where})",
            None if ours is None else paired_ratio(torch, ours),
            "x",
            TORCH_GOAL,
            "min",
            f"{ours.name if ours else ''} vs torch {_torch_version()} CPU eager, median of paired rounds{best} "
            "(torch's threads slow down sharply when the cores are shared: see the best-round ratio)",
            "{:.2f}",
        ),
    ]


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return "?"


def _mfu_row(
    name: str, timing: Timing | None, timings: dict[str, Timing], state: dict[str, Any], goal: float | None
) -> Row:
    """Median model FLOP/s ÷ median matmul peak, the peak timed in the same rounds as the model.

    A ratio of medians, not a median of per-round ratios: a peak window and a training window of one
    round differ in length, so they do not sample the machine's load at the same moments.
    """
    peak = timings.get("matmul peak")
    if timing is None or timing.flops_per_s is None or peak is None or peak.flops_per_s is None:
        return percent(name, None, goal, "no step time or no peak")
    best = max(peak.flops_per_step / w for w in peak.windows) if peak.flops_per_step else peak.flops_per_s
    note = (
        f"{timing.flops_per_s / 1e9:.1f} GFLOP/s model FLOPs ({timing.name}) vs in-round peak "
        f"{peak.flops_per_s / 1e9:.1f} GFLOP/s (best round {best / 1e9:.1f})"
    )
    return percent(name, timing.flops_per_s / peak.flops_per_s, goal, note)


def startup_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    from benchmarks.first_step import theseus_jobs_seconds

    seconds = theseus_jobs_seconds(repeats=sizes.jobs_repeats)
    return [
        Row(
            "`theseus jobs` wall time",
            seconds,
            "s",
            JOBS_GOAL,
            "max",
            f"median of {sizes.jobs_repeats} subprocess runs",
            "{:.3f}",
        )
    ]


def first_step_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    """Fresh-process start-up, phase by phase, with an empty and then a warm compilation cache."""
    from benchmarks.startup import PHASES, startup_breakdown

    runs = startup_breakdown(sizes.small_preset, sizes.small_batch, sizes.small_seq, overrides=sizes.model_overrides)
    where = f"{sizes.small_preset} {sizes.small_batch}x{sizes.small_seq}"

    def until_first_step(times: dict[str, float]) -> float:
        return sum(times[name] for name in PHASES[: PHASES.index("first step") + 1])

    def breakdown(times: dict[str, float]) -> str:
        return " + ".join(f"{name} {times[name]:.2f}" for name in PHASES) + " s"

    return [
        Row(
            f"Time to first training step ({where})",
            until_first_step(runs["cold"]),
            "s",
            FIRST_STEP_GOAL_COLD,
            "max",
            note=f"fresh process, empty compilation cache: {breakdown(runs['cold'])}",
            fmt="{:.2f}",
        ),
        Row(
            f"Time to first training step, warm cache ({where})",
            until_first_step(runs["warm"]),
            "s",
            FIRST_STEP_GOAL_WARM,
            "max",
            note=f"fresh process, compilation cache of the run before: {breakdown(runs['warm'])}",
            fmt="{:.2f}",
        ),
    ]


DEMO_GOAL = 2.06  # gzip -9 on the same bytes


def speedrun_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    """The demo's bits per byte on its whole validation split against compressors on the same bytes."""
    from benchmarks.demo_speedrun import compressor_bits_per_byte, demo_bits_per_byte

    with tempfile.TemporaryDirectory(prefix="theseus-speedrun-") as tmp:
        root = Path(tmp)
        rows = [
            Row(f"{name} on the demo's validation split", bits, "bits/byte", note="python-stdlib val", fmt="{:.3f}")
            for name, bits in compressor_bits_per_byte(root).items()
        ]
        if sizes.demo_overrides is None:
            demo = Row("Demo bits/byte (demo/gpt)", None, "bits/byte", DEMO_GOAL, "max", "not run in quick mode")
        else:
            bits, validation, seconds = demo_bits_per_byte(root, sizes.demo_overrides)
            settings = " ".join(sizes.demo_overrides) or "default settings"
            demo = Row(
                "Demo bits/byte (demo/gpt)",
                bits,
                "bits/byte",
                DEMO_GOAL,
                "max",
                f"whole split after {seconds:.0f} s wall ({settings}; random-window validation {validation:.3f}); "
                "goal: beat gzip -9",
                "{:.3f}",
            )
    return [*rows, demo]


def data_rows(sizes: Sizes, state: dict[str, Any]) -> list[Row]:
    """Batch assembly and tokenization rates, through the data benchmarks' helpers."""
    from benchmarks import data_loader

    measure = getattr(data_loader, "measure_batch_assembly", None)
    if measure is not None:
        assembly = float(measure(tokens=sizes.data_tokens, seconds=sizes.data_seconds))
    else:
        assembly = _assembly_rate(data_loader, sizes)
    rows = [
        Row(
            "Batch assembly from memmap (pmd, 8x1024)",
            assembly,
            "tok/s",
            ASSEMBLY_GOAL,
            "min",
            "Flywheel.assemble, one source, warm page cache",
            "{:,.3g}",
        )
    ]
    for label, rate in _tokenize_rates(sizes).items():
        rows.append(Row(f"Tokenization ({label})", rate, "tok/s", note="Python stdlib corpus", fmt="{:,.3g}"))
    return rows


def _assembly_rate(data_loader: Any, sizes: Sizes) -> float:
    import numpy as np

    from theseus.training.flywheel import Flywheel, Sampling

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data_loader.write_synthetic(root, "bench-a", sizes.data_tokens)
        shard = np.memmap(root / "data" / "bench-a" / "train.bin", dtype=np.uint16, mode="r")
        int(np.asarray(shard[::4096]).sum())  # warm the page cache
        flywheel = Flywheel(Sampling("bench-a"), root=root, block_size=1024, batch_size=8, prefetch=0)
        try:
            return float(data_loader.rate(flywheel.assemble, 8 * 1024, sizes.data_seconds))
        finally:
            flywheel.close()


def _tokenize_rates(sizes: Sizes) -> dict[str, float]:
    from benchmarks import data_tokenize

    measure = getattr(data_tokenize, "measure_tokenization", None)
    if measure is not None:
        return dict(measure(max_documents=sizes.tokenize_documents, bpe_vocab=sizes.bpe_vocab))
    from theseus.data.datasets import PythonStdlib
    from theseus.data.tokenizers.base import encode_arrays
    from theseus.data.tokenizers.byte import ByteTokenizer
    from theseus.data.tokenizers.spec import load_tokenizer

    dataset = PythonStdlib(max_documents=sizes.tokenize_documents, val_fraction=0.01)
    texts = [document.text for document in dataset.documents()]
    tokenizers: dict[str, Any] = {"byte": ByteTokenizer()}
    with tempfile.TemporaryDirectory() as tmp:
        if sizes.bpe_vocab:
            from theseus.data.tokenizers.bpe import train_bpe

            path = train_bpe(texts, Path(tmp) / "bpe.json", vocab_size=sizes.bpe_vocab)
            tokenizers[f"BPE {sizes.bpe_vocab}"] = load_tokenizer(f"hf:{path}")
        rates = {}
        for label, tokenizer in tokenizers.items():
            start = time.perf_counter()
            tokens = sum(array.size for array in encode_arrays(tokenizer, texts))
            rates[label] = tokens / (time.perf_counter() - start)
    return rates


# -- the run -------------------------------------------------------------------------------------


def measure(sizes: Sizes, *, log: Callable[[str], None] = lambda text: None) -> list[Row]:
    """Every row of the table; a section that fails yields its rows with the error as the note."""
    state: dict[str, Any] = {}
    rows: list[Row] = []
    small = f"{sizes.small_preset} {sizes.small_batch}x{sizes.small_seq}"
    large = f"{sizes.large_preset} {sizes.large_batch}x{sizes.large_seq}"
    sections: list[tuple[str, Callable[[Sizes, dict[str, Any]], list[Row]], list[Row]]] = [
        ("peak", peak_rows, [Row("Matmul peak (f32 jnp.dot)", None, "GFLOP/s")]),
        (
            "small-preset loops",
            small_rows,
            [
                Row(f"Framework overhead: trainer.run() ÷ bare ({small})", None, "x", OVERHEAD_GOAL, "max"),
                Row(f"Ours ÷ PyTorch tokens/s ({small})", None, "x", TORCH_GOAL, "min"),
            ],
        ),
        (
            "large-preset loops",
            large_rows,
            [
                Row(f"Ours ÷ PyTorch tokens/s ({large})", None, "x", TORCH_GOAL, "min"),
                percent(f"MFU {large} (goal figure)", None, MFU_GOAL),
            ],
        ),
        ("theseus jobs", startup_rows, [Row("`theseus jobs` wall time", None, "s", JOBS_GOAL, "max")]),
        ("first step", first_step_rows, [Row("Time to first training step", None, "s")]),
        ("demo speedrun", speedrun_rows, [Row("Demo bits/byte (demo/gpt)", None, "bits/byte", DEMO_GOAL, "max")]),
        (
            "data",
            data_rows,
            [Row("Batch assembly from memmap (pmd, 8x1024)", None, "tok/s", ASSEMBLY_GOAL, "min")],
        ),
    ]
    for what, fn, fallback in sections:
        start = time.perf_counter()
        log(f"[run_all] {what} ...")
        _guard(what, rows, fallback, lambda fn=fn: fn(sizes, state), log)  # type: ignore[misc]
        log(f"[run_all] {what} done in {time.perf_counter() - start:.1f} s")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes: a 1-2 minute smoke check")
    parser.add_argument("--output", type=Path, help="also write the Markdown table to this file")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL

    def log(text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    started, load_before = time.perf_counter(), load_average()
    rows = measure(sizes, log=log)
    mode = "quick" if args.quick else "full"
    load = f"load average {load_before:.1f} -> {load_average():.1f}" if load_before is not None else ""
    table = markdown_table(rows, extra=f"mode: {mode}, {time.perf_counter() - started:.0f} s, {load}")
    print(table)
    if args.output:
        args.output.write_text(table + "\n")
    if args.json:
        args.json.write_text(
            json.dumps([dataclasses.asdict(row) | {"status": row.status} for row in rows], indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    start_like_theseus_run()
    sys.exit(main())
