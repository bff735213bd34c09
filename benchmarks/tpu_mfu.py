"""Training throughput on one TPU chip: the cases of the TPU table in benchmarks/README.md.

    python benchmarks/tpu_mfu.py                              # every case, each in a process of its own
    python benchmarks/tpu_mfu.py --cases gpt2-124m,llama-350m-8k
    python benchmarks/tpu_mfu.py --cases llama-350m-8k --set architecture/attention_impl=xla   # the old path
    python benchmarks/tpu_mfu.py --cpu-smoke                  # tiny sizes on CPU (tests the script)

Each case runs in its own process (so the chip's peak bytes in use are the case's own): our
``trainer.run()`` loop, for ``gpt2-124m`` also the bare flax + optax loop on the same model and batches and
a large bf16 matmul, interleaved round by round (medians after warm-up; see ``bare_loop.py``). MFU is
model FLOP/s (``model.flops(seq)`` x batch / step time: the full attention square, no causal saving)
over the chip's published dense bf16 peak. Activations bf16, parameters float32, every other key at its
default (attention ``auto`` = splash on TPU, the chunked loss, no remat unless a case sets it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import Row, paired_ratio, percent, publish_table, run_child
from theseus.base.chips import published_peak

LLAMA_350M = {
    "architecture/n_layers": 24,
    "architecture/n_heads": 16,
    "architecture/n_kv_heads": 8,
    "architecture/n_embd": 1024,
}
MIXTRAL_SHAPE = {
    "architecture/n_layers": 8,
    "architecture/n_heads": 12,
    "architecture/n_kv_heads": 4,
    "architecture/n_embd": 768,
    "architecture/mlp_ratio": 3.5,
    "architecture/moe/n_experts": 8,
    "architecture/moe/top_k": 2,
}


LLAMA_1B = {  # the 1.1B Llama shape: 16 x 2048, d_ff 8192, 32k vocabulary (TinyLlama's width at 16 layers)
    "architecture/n_layers": 16,
    "architecture/n_heads": 32,
    "architecture/n_kv_heads": 4,
    "architecture/n_embd": 2048,
    "architecture/d_ff": 8192,
}
#: A 350M-shaped Mamba-2 hybrid (Nemotron-H's one-branch layers at the 350M Llama's width and depth): per
#: Llama layer a Mamba-2 mixer and an MLP, one in four of the mixers attention instead; Mamba-2 at 2x the
#: width in heads of 64, state 128, 8 groups (Nemotron-H 8B's).
HYBRID_350M = {
    "architecture/n_layers": 48,
    "architecture/layer_types": ["mamba", "mlp", "mamba", "mlp", "mamba", "mlp", "full_attention", "mlp"] * 6,
    "architecture/n_heads": 16,
    "architecture/n_kv_heads": 8,
    "architecture/n_embd": 1024,
    "architecture/d_ff": 2816,
    "architecture/mamba_heads": 32,
    "architecture/mamba_head_dim": 64,
    "architecture/mamba_state_size": 128,
    "architecture/mamba_groups": 8,
}
BF16_STATE = {"optimizer/state_dtype": "bfloat16"}
OFFLOAD = {"optimizer/offload": True}
DENSE_SHAPE = {key: value for key, value in MIXTRAL_SHAPE.items() if not key.startswith("architecture/moe/")}


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    preset: str
    batch: int
    seq: int
    vocab: int
    overrides: dict[str, Any] = dataclasses.field(default_factory=dict)
    bare: bool = False
    goal: float | None = None
    trainer: dict[str, Any] = dataclasses.field(default_factory=dict)  # trainer keys (optimizer/offload, ...)
    finetune: bool = False  # the fine-tuning trainer (SFTTrainer: LoRA over a quantized base held out)

    def workload(self, extra: dict[str, Any] | None = None, build: bool = True) -> Any:
        """The case's workload: its model keys (and ``extra``) at bf16 activations, random batches."""
        from benchmarks.workload import Workload

        return Workload.create(
            self.preset,
            batch=self.batch,
            seq=self.seq,
            vocab_size=self.vocab,
            activation_dtype="bfloat16",
            overrides={**self.overrides, **(extra or {})},
            model=self.model,
            build=build,
        )


CASES: dict[str, Case] = {
    "gpt2-124m": Case("gpt", "gpt2-124m", 16, 1024, 50304, goal=0.50),
    # our loop against the bare loop and a matmul, interleaved: three states resident, so a batch that leaves room
    "gpt2-124m-pair": Case("gpt", "gpt2-124m", 8, 1024, 50304, bare=True),
    "llama-350m-2k": Case("llama", "tiny", 8, 2048, 32000, LLAMA_350M, goal=0.42),
    "llama-350m-8k": Case("llama", "tiny", 2, 8192, 32000, LLAMA_350M),
    "llama-350m-32k": Case("llama", "tiny", 1, 32768, 32000, LLAMA_350M),
    "hybrid-350m-2k": Case("nemotron_h", "tiny", 8, 2048, 32000, HYBRID_350M),
    # the 1.1B shape with AdamW's state in bfloat16, or in host memory: no other key
    "llama-1b-bf16-state": Case("llama", "tiny", 8, 2048, 32000, LLAMA_1B, goal=0.35, trainer=BF16_STATE),
    "llama-1b-offload": Case("llama", "tiny", 8, 2048, 32000, LLAMA_1B, goal=0.35, trainer=OFFLOAD),
    "llama-1b-offload-bf16": Case(
        "llama", "tiny", 8, 2048, 32000, LLAMA_1B, goal=0.35, trainer={**OFFLOAD, **BF16_STATE}
    ),
    "mixtral-8x768": Case("mixtral", "tiny", 16, 1024, 32000, MIXTRAL_SHAPE),
    # dense with the Mixtral shape's active parameters: two experts' width in one MLP
    "dense-8x768": Case("llama", "tiny", 16, 1024, 32000, {**DENSE_SHAPE, "architecture/mlp_ratio": 7.0}),
}
CPU_CASES: dict[str, Case] = {
    "tiny": Case("gpt", "tiny", 2, 64, 256, bare=True),
    "tiny-llama": Case("llama", "tiny", 2, 64, 256, {"model/remat": "full"}),
}


def measure_case(
    name: str,
    case: Case,
    extra: dict[str, Any],
    steps: int,
    repeats: int,
    profile: Path | None = None,
    memory: bool = False,
) -> list[dict[str, Any]]:
    """The rows of one case, as dicts (this process runs only this case)."""
    import jax

    from benchmarks.bare_loop import RUN_LOOP, BareLoop, measure_trainer_loop
    from benchmarks.common import Loop
    from benchmarks.peak import PeakLoop

    device = jax.devices()[0]
    kind = str(getattr(device, "device_kind", device.platform))
    peak = published_peak(kind)
    work = case.workload(extra)
    where = f"{name} ({case.model}, {case.batch}x{case.seq}{_keys(extra)})"
    compiled = [compiled_memory(work, where)] if memory else []
    others: list[Loop] = []
    if case.bare:
        others = [PeakLoop(8192 if device.platform == "tpu" else 128, "bfloat16", chain=8), BareLoop(work)]
    try:
        # the update dispatched just before the first round's boundary, which waits for everything in flight
        # anyway: the trace's own wait at its end then delays no timed window (the update after the boundary
        # would start the first window with nothing in flight, 16 % fast for Mixtral at --steps 3)
        warmup = 2
        traced = warmup + 1
        trace = {"training/profile": f"{traced}:{traced}"} if profile else {}
        timings = measure_trainer_loop(
            work, others, steps=steps, repeats=repeats, warmup=warmup, extra={**case.trainer, **trace}, keep=profile
        )
    finally:
        for loop in others:
            loop.close()
    ours = timings[RUN_LOOP]
    stats = device.memory_stats() or {}
    rows = [
        *compiled,
        Row(
            f"{where}: tokens/s",
            ours.tokens_per_s,
            "tok/s",
            note=f"{ours.step_seconds * 1e3:.1f} ms/step; peak {stats.get('peak_bytes_in_use', 0) / 1e9:.2f} GB "
            f"of {stats.get('bytes_limit', 0) / 1e9:.2f} GB",
            fmt="{:,.0f}",
        ),
        percent(
            f"{where}: MFU", None if peak is None or ours.flops_per_s is None else ours.flops_per_s / peak, case.goal
        ),
    ]
    if case.bare:
        bare = timings[BareLoop.name]
        rows.append(Row(f"{where}: ours ÷ bare", paired_ratio(ours, bare), "x", 1.03, "max", fmt="{:.3f}"))
        matmul = next(t for n, t in timings.items() if n not in (RUN_LOOP, BareLoop.name))
        rate = None if matmul.flops_per_s is None else matmul.flops_per_s / 1e12
        rows.append(Row("bf16 matmul 8192³", rate, "TFLOP/s", fmt="{:.1f}"))
    return [dataclasses.asdict(row) for row in rows]


def compiled_memory(work: Any, where: str) -> Row:
    """The bytes per device of the trainer's step as this device's compiler lays it out (arguments, outputs
    not aliased to them, temporaries: what ``theseus plan`` reports as the total), compiled before any run."""
    import tempfile

    from benchmarks.bare_loop import trainer_class, trainer_overrides
    from theseus.training.compiled import compile_train_step

    with tempfile.TemporaryDirectory() as tmp:
        trainer = trainer_class(work).create(tmp, trainer_overrides(work))
        trainer.setup()
        trainer.fit_memory()  # model/remat=auto: the setting the run would choose
        step = compile_train_step(trainer)
    note = (
        f"state and batch {step.argument_bytes / 1e9:.2f} GB, temporaries {step.temporary_bytes / 1e9:.2f} GB; "
        f"compiled in {step.compile_seconds:.0f} s"
    )
    return Row(f"{where}: compiled step", step.total_bytes / 1e9, "GB", note=note, fmt="{:.2f}")


def plan_command(case: Case, extra: dict[str, Any], target: str = "v5e:1") -> str:
    """The ``theseus plan`` line that compiles the case's step for ``target`` (the pretraining job, same keys)."""
    keys = {
        "model": case.model,
        "architecture/preset": case.preset,
        "architecture/vocab_size": case.vocab,
        "architecture/block_size": case.seq,
        "architecture/dropout": 0.0,
        "model/activation_dtype": "bfloat16",
        **case.overrides,
        **extra,
        **case.trainer,
        "training/batch_size": case.batch,
        "training/sequence_length": case.seq,
    }
    return f"theseus plan train/pretrain --target {target} " + " ".join(f"{k}={v}" for k, v in keys.items())


def _keys(extra: dict[str, Any]) -> str:
    return "".join(f", {key}={value}" for key, value in extra.items())


def run_in_processes(names: list[str], extra: list[str], args: argparse.Namespace) -> list[Row]:
    """Each case in a child process of its own; a case that fails gives a row saying how."""
    rows = []
    for name in names:
        out = Path(f"/tmp/tpu_mfu_{os.getpid()}_{name}.json")
        command = [sys.executable, __file__, "--one", name, "--json", str(out), "--steps", str(args.steps)]
        command += ["--repeats", str(args.repeats)] + [f"--set={item}" for item in extra]
        command += ["--cpu-smoke"] if args.cpu_smoke else []
        command += [f"--profile={args.profile}"] if args.profile else []
        command += ["--memory"] if args.memory else []
        started = time.perf_counter()
        done = run_child(command, args.timeout)
        if done is None:
            rows.append(Row(f"{name}: failed", None, note=f"did not finish in {args.timeout:.0f} s"))
            print(f"{name}: did not finish in {args.timeout:.0f} s", file=sys.stderr, flush=True)
            continue
        print(f"{name}: exit {done.returncode} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        for line in (done.stdout + done.stderr).splitlines():  # what the run chose or fell back to
            if line.startswith("notice:") or "model/remat=auto" in line:
                print(f"  {line}", file=sys.stderr, flush=True)
        if done.returncode == 0 and out.exists():
            found = [Row(**row) for row in json.loads(out.read_text())]
            for row in found:  # each case as it ends: a later one may run out of time
                print(f"  {row.name}: {row.value} {row.unit} {row.note}", file=sys.stderr, flush=True)
            rows += found
        else:
            reason = _last_error(done.stderr + done.stdout)
            rows.append(Row(f"{name}: failed", None, note=reason))
            print(done.stderr[-4000:], file=sys.stderr)
    return rows


def _last_error(text: str) -> str:
    lines = [line for line in text.splitlines() if "Error" in line or "error:" in line]
    lines = lines or text.strip().splitlines() or ["no output"]
    return lines[-1][:200]


def parse_sets(items: list[str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for item in items:
        key, _, value = item.partition("=")
        values[key] = value
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a test of the script)")
    parser.add_argument("--cases", help="comma-separated case names (default: all)")
    parser.add_argument("--set", action="append", default=[], help="KEY=VALUE for every case (e.g. attention)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a case may take")
    parser.add_argument("--profile", type=Path, help="trace one update of each case (training/profile) into DIR/CASE")
    parser.add_argument("--memory", action="store_true", help="also compile each case's step on the device first")
    parser.add_argument("--plan-commands", action="store_true", help="print the theseus plan line of each case")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--output", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    cases = CPU_CASES if args.cpu_smoke else CASES
    if args.one:
        where = None if args.profile is None else args.profile / args.one
        sets = parse_sets(args.set)
        found = measure_case(args.one, cases[args.one], sets, args.steps, args.repeats, where, args.memory)
        if args.json:
            args.json.write_text(json.dumps(found))
        return 0
    names = args.cases.split(",") if args.cases else list(cases)
    unknown = [name for name in names if name not in cases]
    if unknown:
        print(f"error: unknown case {unknown[0]!r}; choose from {', '.join(cases)}")
        return 2
    if args.plan_commands:
        for name in names:
            print(plan_command(cases[name], parse_sets(args.set)))
        return 0
    started = time.perf_counter()
    rows = run_in_processes(names, args.set, args)
    publish_table(rows, args.output, title="theseus on one TPU chip", extra=f"{time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
