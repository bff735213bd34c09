"""Memory verdicts at the edge: what the compiled step says it needs against what the chip runs.

    python benchmarks/tpu_fit.py                         # every case, each in a process of its own
    python benchmarks/tpu_fit.py --cases gpt2-16x1024-none,llama-1b-offload
    python benchmarks/tpu_fit.py --cpu-smoke             # tiny sizes on CPU (tests the script)

For each case the trainer's step is compiled on the device (``compile_train_step``: the program a run
calls), its memory analysis is read (arguments, outputs, aliased outputs, temporaries and the compiler's own
peak), and the verdict of ``theseus.training.memory.fits`` is taken against the device's ``bytes_limit``.
Then the compiled step runs three updates: the chip's answer is whether it ran and its peak bytes in use.
A case whose step the compiler refuses counts as "does not fit" on both sides. The same verdict is what
``theseus plan --target v5e:1`` prints (``tests/plan`` pins it for two of these cases).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, publish_table, run_child
from benchmarks.tpu_mfu import LLAMA_1B, Case

GPT2 = {"model": "gpt", "preset": "gpt2-124m", "vocab": 50304}


def gpt2(batch: int, remat: str, scan: bool) -> Case:
    return Case("gpt", "gpt2-124m", batch, 1024, 50304, {"model/remat": remat, "model/scan_layers": scan})


def llama_1b(**trainer_keys: Any) -> Case:
    return Case("llama", "tiny", 8, 2048, 32000, {**LLAMA_1B, "model/remat": "full"}, trainer=trainer_keys)


#: Qwen3-1.7B's widths on the Qwen3-0.6B preset (28 layers, 16/8 heads of 128), bfloat16 parameters, remat full.
QWEN3_1_7B = {
    "architecture/n_embd": 2048,
    "architecture/d_ff": 6144,
    "model/param_dtype": "bfloat16",
    "model/remat": "full",
}

#: Qwen3-8B's shape (36 x 4096, 32/8 heads of 128, d_ff 12288) on the Qwen3-0.6B preset, QLoRA: NF4 base
#: weights held out of the update, rank-16 adapters on every projection, remat full.
QWEN3_8B_QLORA = {
    "architecture/n_layers": 36,
    "architecture/n_embd": 4096,
    "architecture/n_heads": 32,
    "architecture/n_kv_heads": 8,
    "architecture/d_ff": 12288,
    "model/quantize": "nf4",
    "model/lora/rank": 16,
    "model/remat": "full",
}

CASES: dict[str, Case] = {
    "gpt2-16x1024-none-scanned": gpt2(16, "none", True),
    "gpt2-16x1024-none": gpt2(16, "none", False),
    "gpt2-20x1024-none": gpt2(20, "none", False),
    "gpt2-24x1024-none": gpt2(24, "none", False),
    "llama-1b-float32-state": llama_1b(),
    "llama-1b-bf16-state": llama_1b(**{"optimizer/state_dtype": "bfloat16"}),
    "llama-1b-offload": llama_1b(**{"optimizer/offload": True}),
    # Qwen3-0.6B as released (float32 parameters, remat chosen by auto) and a Qwen3-1.7B shape (28 x 2048,
    # 16/8 heads of 128, d_ff 6144) with bfloat16 parameters and the optimizer state in host memory: the step
    # full fine-tuning runs (SFT differs only in which tokens the loss counts)
    "qwen3-0.6b": Case("qwen3", "qwen3-0.6b", 8, 2048, 151936, {"model/remat": "full"}),
    "qwen3-1.7b-offload": Case(
        "qwen3",
        "qwen3-0.6b",
        8,
        2048,
        151936,
        QWEN3_1_7B,
        trainer={"optimizer/offload": True},
    ),
    "qwen3-1.7b-bf16-state": Case(
        "qwen3",
        "qwen3-0.6b",
        8,
        2048,
        151936,
        QWEN3_1_7B,
        trainer={"optimizer/state_dtype": "bfloat16"},
    ),
    # QLoRA SFT of the 8B shape: the fine-tuning trainer's step (random tokens, every one a target)
    "qwen3-8b-qlora": Case("qwen3", "qwen3-0.6b", 8, 2048, 151936, QWEN3_8B_QLORA, finetune=True),
    # the 1.1B shape with the state offloaded and model/remat=auto: the room its step leaves keeps state on the device
    "llama-1b-offload-auto": Case("llama", "tiny", 8, 2048, 32000, LLAMA_1B, trainer={"optimizer/offload": True}),
    "llama-1b-offload-bf16-auto": Case(
        "llama",
        "tiny",
        8,
        2048,
        32000,
        LLAMA_1B,
        trainer={"optimizer/offload": True, "optimizer/state_dtype": "bfloat16"},
    ),
}
CPU_CASES: dict[str, Case] = {
    "tiny": Case("gpt", "tiny", 2, 64, 256),
    "tiny-offload": Case("llama", "tiny", 2, 64, 256, {"model/remat": "full"}, trainer={"optimizer/offload": True}),
    "tiny-qlora": Case("qwen3", "tiny", 2, 64, 256, {"model/quantize": "nf4", "model/lora/rank": 4}, finetune=True),
}


def build_trainer(case: Case, root: str) -> Any:
    """The benchmark trainer of ``case`` (random batches, no validation), set up (with ``model/remat=auto``,
    fitted as a run fits it), and its workload."""
    from benchmarks.bare_loop import trainer_class, trainer_overrides

    work = case.workload()
    base = None
    if case.finetune:
        from theseus.model.finetune.trainer import SFTTrainer as base
    trainer = trainer_class(work, base).create(root, trainer_overrides(work, **case.trainer))
    trainer.setup()
    choice = trainer.fit_memory()
    if choice is not None:
        print(choice.line(), file=sys.stderr, flush=True)
    return trainer, work


def compile_and_run(trainer: Any, work: Any, steps: int = 3) -> dict[str, Any]:
    """Compile the trainer's step (the program a run calls) and run ``steps`` updates of it: its memory
    analysis, compile seconds, whether it ran, the median step time and the device's peak bytes in use."""
    import jax

    from theseus.training.compiled import StepTooLarge, compile_train_step

    found: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        step = compile_train_step(trainer)
    except StepTooLarge as refused:
        return {**found, "compiled": False, "needed": refused.needed_bytes, "error": str(refused)[:200]}
    found["compile_seconds"] = time.perf_counter() - started
    analysis = step.compiled.memory_analysis()
    found.update({name: int(getattr(analysis, name)) for name in dir(analysis) if name.endswith("_in_bytes")})
    found["total_bytes"] = step.total_bytes
    found["compiled"] = True
    try:
        state = trainer.init_state()
        batches = work.host_batches()
        times = []
        for index in range(steps):
            batch = trainer.device_train_batch(batches[index % len(batches)])
            begin = time.perf_counter()
            state, loss = step.compiled(state, batch, trainer.step_key(index))[:2]
            jax.block_until_ready(loss)
            times.append(time.perf_counter() - begin)
        found.update(ran=True, step_seconds=sorted(times)[len(times) // 2], loss=float(loss))
    except Exception as exc:  # the chip's own answer: out of memory at run time
        found.update(ran=False, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}")
    stats = jax.devices()[0].memory_stats() or {}
    found.update(peak_in_use=stats.get("peak_bytes_in_use"), limit=stats.get("bytes_limit"))
    return found


def measure(name: str, case: Case) -> dict[str, Any]:
    """One case in this process: the compiled memory, our verdict and what the device did."""
    from theseus.training import memory

    with tempfile.TemporaryDirectory() as root:
        trainer, work = build_trainer(case, root)
        found = compile_and_run(trainer, work)
        found["model_flops_per_step"] = work.flops_per_step()
        found["tokens_per_step"] = work.tokens_per_step
        room = memory.budget(0.0, memory._local_device(trainer))
        found["budget"] = room.bytes
        found["verdict"] = bool(found["compiled"]) and (room.bytes is None or found["total_bytes"] <= room.bytes)
    return {"case": name, **found}


def rows_of(result: dict[str, Any]) -> list[Row]:
    name = result["case"]
    if not result.get("compiled"):
        note = f"compiler refused: {result.get('error', '')}"
        return [Row(f"{name}: verdict / chip", None, note=note)]
    ran = result.get("ran")
    agree = result["verdict"] == ran
    note = (
        f"verdict {'fits' if result['verdict'] else 'does not fit'}, chip {'ran' if ran else 'ran out'}"
        f" ({'agree' if agree else 'DISAGREE'}); args {result['argument_size_in_bytes'] / 1e9:.2f} GB, "
        f"temp {result['temp_size_in_bytes'] / 1e9:.2f} GB, alias {result['alias_size_in_bytes'] / 1e9:.2f} GB, "
        f"compiler peak {result.get('peak_memory_in_bytes', 0) / 1e9:.2f} GB, "
        f"in use {(result.get('peak_in_use') or 0) / 1e9:.2f} of {(result.get('limit') or 0) / 1e9:.2f} GB; "
        f"compiled in {result['compile_seconds']:.0f} s"
        + (f"; {result['step_seconds'] * 1e3:.0f} ms/step" if ran else f"; {result.get('error', '')}")
    )
    return [Row(f"{name}: compiled total", result["total_bytes"] / 1e9, "GB", note=note, fmt="{:.2f}")]


def run_case(name: str, smoke: bool, timeout: float) -> dict[str, Any]:
    """One case in a child process of its own."""
    command = [sys.executable, __file__, "--one", name] + (["--cpu-smoke"] if smoke else [])
    started = time.perf_counter()
    done = run_child(command, timeout)
    if done is None:
        return {"case": name, "compiled": False, "error": f"did not finish in {timeout:.0f} s"}
    seconds = time.perf_counter() - started
    print(f"{name}: exit {done.returncode} in {seconds:.0f} s", file=sys.stderr, flush=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return {**json.loads(lines[-1]), "process_seconds": seconds}
    print(done.stderr[-3000:], file=sys.stderr)
    return {"case": name, "compiled": False, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a test of the script)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a case may take")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help="write every case's measurements to this file")
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    cases = CPU_CASES if args.cpu_smoke else CASES
    if args.one:
        print(json.dumps(measure(args.one, cases[args.one])))
        return 0
    names = args.cases.split(",") if args.cases else list(cases)
    results = []
    for name in names:
        result = run_case(name, args.cpu_smoke, args.timeout)
        print(json.dumps(result), flush=True)  # each case as it ends: a later one may run out of time
        results.append(result)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    rows = [row for result in results for row in rows_of(result)]
    publish_table(rows, args.output, title="memory verdicts against the chip")
    return 0


if __name__ == "__main__":
    sys.exit(main())
