"""``theseus plan`` estimates for GPUs this machine does not have, beside the peers' published figures.

    PYTHONPATH=.compilers python benchmarks/plan_estimates.py            # every table (minutes on 2 cores)
    PYTHONPATH=.compilers python benchmarks/plan_estimates.py --quick    # the 124M row and one MoE shape
    PYTHONPATH=.compilers python benchmarks/plan_estimates.py --tables fp8   # fp8 against bf16 only

Each row compiles the job's real training step for the target (deviceless: jax on the CPU, XLA's GPU
compiler) and reads the compiled program: memory per device, matmul FLOPs against the model's
``flops()``, collectives, and the roofline step time of ``theseus.plan.estimate``. These are estimates
from compiled programs, not measurements (no GPU here); ``benchmarks/gpu_mfu.py`` measures on a GPU.
The compilers: ``pip install --target .compilers -r requirements-compilers.txt`` (or the
``theseus-core[plan-cuda]`` extra).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: Dense training rows: (label, job, overrides), 8 x H100, fsdp, AdamW, bf16 activations.
DENSE = [
    (
        "gpt2-124m, 64 x 1024",
        "train/pretrain",
        ["architecture/preset=gpt2-124m", "architecture/vocab_size=50304", "architecture/block_size=1024"],
        64,
        1024,
    ),
    (
        "Llama 3.2 1B shape, 32 x 4096",
        "train/pretrain",
        [
            "model=llama",
            "architecture/preset=llama3-1b",
            "architecture/tied_embeddings=true",
            "architecture/vocab_size=128256",
        ],
        32,
        4096,
    ),
    (
        "Llama 3 8B shape, 8 x 4096",
        "train/pretrain",
        ["model=llama", "architecture/preset=llama3-8b", "architecture/vocab_size=128256"],
        8,
        4096,
    ),
]
#: Published MFU of the peers (their own measurements on real hardware).
PEERS = [
    ("maxtext", "Llama 3.1 8B", "v6e-256", "45.5%"),
    ("torchtitan", "Llama 3.1 8B, no Float8", "8 x H100", "33-39%"),
    ("TinyLlama", "1.1B", "A100", "52%"),
]
#: Mixture shapes, two layers (four for DeepSeek-V3: its dense first layers), 8 x 1024 tokens.
MIXTURES = [
    ("Qwen3-30B-A3B", ["model=qwen3_moe", "architecture/preset=qwen3-30b-a3b", "architecture/n_layers=2"], 151936),
    ("Mixtral-8x7B", ["model=mixtral", "architecture/preset=mixtral-8x7b", "architecture/n_layers=2"], 32000),
    ("DeepSeek-V3", ["model=deepseek_v3", "architecture/preset=deepseek-v3", "architecture/n_layers=4"], 129280),
]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def plan(job: str, overrides: list[str], target: str = "h100x8") -> Any:
    import gc

    import jax

    from theseus.plan.report import make_plan
    from theseus.registry import get_registry

    with tempfile.TemporaryDirectory() as root:
        result = make_plan(job, get_registry().load_job(job), target, overrides, Path(root))
    jax.clear_caches()  # large programs add up: a run of every table otherwise outgrows 24 GB of host memory
    gc.collect()
    return result


def dense_rows(quick: bool) -> list[list[str]]:
    rows = []
    for label, job, overrides, batch, seq in DENSE[:1] if quick else DENSE:
        sizes = [f"architecture/block_size={seq}", f"training/sequence_length={seq}", f"training/batch_size={batch}"]
        result = plan(job, [*overrides, *sizes, "mesh/layout=fsdp"])
        est = result.estimate
        rows.append(
            [
                label,
                f"{result.step.total_bytes / 1e9:.1f} GB",
                f"{result.flops_ratio:.2f}",
                f"{est.step_seconds * 1e3:.0f} ms",
                f"{batch * seq / est.step_seconds:,.0f}",
                f"{est.mfu(result.model_flops):.0%}",
            ]
        )
    return rows


def fp8_rows(quick: bool) -> list[list[str]]:
    """The dense rows in bf16 and with ``training/precision=fp8``: the estimated step, its compute and
    memory-bound parts, and the share of matmul FLOPs that run on FP8 inputs."""
    rows = []
    for label, job, overrides, batch, seq in DENSE[:1] if quick else DENSE:
        sizes = [f"architecture/block_size={seq}", f"training/sequence_length={seq}", f"training/batch_size={batch}"]
        steps = {}
        for precision in ("auto", "fp8"):
            result = plan(job, [*overrides, *sizes, "mesh/layout=fsdp", f"training/precision={precision}"])
            est, by_type = result.estimate, result.cost.flops_by_dtype()
            fp8_share = sum(v for k, v in by_type.items() if k.startswith("f8")) / max(sum(by_type.values()), 1.0)
            steps[precision] = est.step_seconds
            rows.append(
                [
                    label if precision == "auto" else "",
                    "bf16" if precision == "auto" else "fp8",
                    f"{est.step_seconds * 1e3:.1f} ms",
                    f"{est.compute_seconds * 1e3:.1f} / {est.memory_seconds * 1e3:.1f} ms",
                    f"{fp8_share:.0%}",
                    f"{result.step.temporary_bytes / 1e9:.1f} GB",
                    f"{est.mfu(result.model_flops):.0%}",
                    "" if precision == "auto" else f"{steps['auto'] / est.step_seconds:.2f}x",
                ]
            )
    return rows


#: Projection kernels a LoRA run can freeze and ``model/quantize`` stores quantized.
PROJECTIONS = {"query", "key", "value", "out", "up", "gate", "down"}


def held_by_kind(result: Any) -> dict[str, int]:
    """Bytes one device holds of the frozen projection kernels (``base``, quantized or not), the LoRA
    adapters, everything else in the parameters, and the optimizer state."""
    import jax

    from theseus.model.layers.quantization import method_of
    from theseus.plan.build import shard_bytes
    from theseus.training.adapters import is_adapter

    trainer = result.step.trainer
    held = {"base": 0, "adapters": 0, "other": 0, "optimizer": 0}
    params, shardings = trainer.abstract_state.params, trainer.state_shardings.params
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=True):
        names = [str(getattr(key, "key", key)) for key in path]
        base = any(n in PROJECTIONS or (method_of(n) and n.rsplit("_", 1)[0] in PROJECTIONS) for n in names)
        kind = "adapters" if is_adapter(path) else "base" if base else "other"
        held[kind] += shard_bytes(leaf, sharding)
    opt, opt_shardings = jax.tree.leaves(trainer.abstract_state.opt_state), trainer.state_shardings.opt_state
    held["optimizer"] = sum(shard_bytes(a, b) for a, b in zip(opt, jax.tree.leaves(opt_shardings), strict=True))
    return held


#: QLoRA rows: (label, overrides, batch, sequence), 8 x H100, fsdp, rank 16 on every projection.
QLORA = [
    (
        "Llama 3.2 1B shape",
        ["architecture/preset=llama3-1b", "architecture/tied_embeddings=true", "architecture/vocab_size=128256"],
        8,
        4096,
    ),
    ("Llama 3 8B shape", ["architecture/preset=llama3-8b", "architecture/vocab_size=128256"], 8, 4096),
]


def qlora_rows(quick: bool) -> list[list[str]]:
    """LoRA (rank 16, every projection) over a bf16, int8 and nf4 base: what one device holds."""
    rows = []
    for label, overrides, batch, seq in QLORA[:1] if quick else QLORA:
        sizes = [f"architecture/block_size={seq}", f"training/sequence_length={seq}", f"training/batch_size={batch}"]
        lora_keys = ["model/lora/rank=16", "model/lora/targets=[query,key,value,out,up,gate,down]"]
        bf16_base = 0
        for quantize in ("none", "int8", "nf4"):
            dtype = ["model/param_dtype=bfloat16"] if quantize == "none" else []
            job_keys = [*overrides, *sizes, *lora_keys, *dtype, f"model/quantize={quantize}", "mesh/layout=fsdp"]
            result = plan("train/sft", ["model=llama", *job_keys])
            held = held_by_kind(result)
            bf16_base = held["base"] if quantize == "none" else bf16_base
            rows.append(
                [
                    label if quantize == "none" else "",
                    "bf16" if quantize == "none" else quantize,
                    f"{held['base'] / 1e9:.3f} GB",
                    f"{held['base'] / bf16_base:.3f}",
                    f"{held['adapters'] / 1e6:.1f} MB",
                    f"{held['optimizer'] / 1e6:.1f} MB",
                    f"{result.step.total_bytes / 1e9:.1f} GB",
                    f"{result.estimate.step_seconds * 1e3:.0f} ms",
                ]
            )
    return rows


def mixture_rows(quick: bool) -> list[list[str]]:
    rows = []
    for label, overrides, vocab in MIXTURES[:1] if quick else MIXTURES:
        sizes = [f"architecture/vocab_size={vocab}", "architecture/block_size=1024", "training/sequence_length=1024"]
        base = [*overrides, *sizes, "training/batch_size=8", "mesh/layout=fsdp"]
        cells = [label]
        for dispatch in ("ragged_dot", "auto"):
            result = plan("train/pretrain", [*base, f"architecture/moe/dispatch={dispatch}"])
            executed = sum(int(c["count"]) for c in result.cost.collective_summary().values())
            cells += [f"{result.flops_ratio:.2f}", f"{result.step.temporary_bytes / 1e9:.1f} GB", str(executed)]
        rows.append(cells)
    return rows


def expert_bytes(result: Any, n_experts: int = 8) -> int:
    """Bytes one device holds of the stacked experts (``[layers, experts, ...]`` gate/up/down) and their
    optimizer state."""
    import jax

    from theseus.plan.build import shard_bytes

    trainer = result.step.trainer
    held = 0
    for tree, shardings in (
        (trainer.abstract_state.params, trainer.state_shardings.params),
        (trainer.abstract_state.opt_state, trainer.state_shardings.opt_state),
    ):
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=True):
            names = {str(getattr(key, "key", "")) for key in path}
            if names & {"gate", "up", "down"} and len(leaf.shape) == 4 and leaf.shape[1] == n_experts:
                held += shard_bytes(leaf, sharding)
    return held


def expert_bytes_rows() -> list[list[str]]:
    """Parameter + optimizer bytes per device of a Mixtral-8x7B-shaped model, experts split 8 ways or not."""
    rows = []
    base = [
        "model=mixtral",
        "architecture/preset=mixtral-8x7b",
        "architecture/vocab_size=32000",
        "architecture/block_size=1024",
        "training/sequence_length=1024",
        "training/batch_size=8",
    ]
    for layout, expert in (("fsdp", 1), ("fsdp+ep", 8), ("ep", 8)):
        result = plan("train/pretrain", [*base, f"mesh/layout={layout}", f"mesh/expert={expert}"])
        state = result.step.parameter_bytes + result.step.optimizer_bytes
        temporaries = f"{result.step.temporary_bytes / 1e9:.1f} GB"
        rows.append([layout, str(expert), f"{expert_bytes(result) / 1e9:.2f} GB", f"{state / 1e9:.2f} GB", temporaries])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the 124M row and one mixture shape")
    parser.add_argument(
        "--tables", default="dense,fp8,qlora,moe,experts", help="which tables (dense, fp8, qlora, moe, experts)"
    )
    args = parser.parse_args()
    tables = set(args.tables.split(","))
    from theseus.plan.devices import start_cpu_backend

    start_cpu_backend()
    if "dense" in tables:
        print("### Estimated training on 8 x H100 (fsdp, AdamW, bf16 activations): compiled here, not measured\n")
        header = ["Model", "Memory / device", "Compiled ÷ model FLOPs", "Step (est.)", "Tokens/s (est.)", "MFU (est.)"]
        print(table(header, dense_rows(args.quick)))
        print("\n### Published by the peers (measured on the hardware)\n")
        print(table(["Peer", "Model", "Hardware", "MFU"], [list(row) for row in PEERS]), flush=True)
    if "fp8" in tables:
        print("\n### training/precision=fp8 against bf16 on 8 x H100 (fsdp): compiled here, not measured\n")
        header = ["Model", "Matmuls", "Step (est.)", "compute / memory-bound", "FLOPs on FP8", "Temporaries"]
        print(table([*header, "MFU (est.)", "fp8 speed-up"], fp8_rows(args.quick)), flush=True)
    if "qlora" in tables:
        print("\n### QLoRA on 8 x H100 (fsdp, rank 16 on every projection, 8 x 4096 tokens): per device\n")
        header = ["Model", "Base", "Base kernels", "÷ bf16", "Adapters", "Optimizer state", "Total", "Step (est.)"]
        print(table(header, qlora_rows(args.quick)), flush=True)
    if "moe" in tables:
        print("\n### MoE dispatch on 8 x H100 (fsdp, 8 x 1024 tokens): ragged_dot against the default blocks\n")
        cells = ["FLOPs ratio", "temporaries", "collectives run"]
        header = ["Shape", *(f"ragged_dot {c}" for c in cells), *(f"auto {c}" for c in cells)]
        print(table(header, mixture_rows(args.quick)), flush=True)
    if "experts" in tables and not args.quick:
        print("\n### Mixtral-8x7B shape on 8 x H100: parameters + optimizer state per device\n")
        header = ["Layout", "mesh/expert", "Experts + their optimizer state / device", "All state", "Temporaries"]
        print(table(header, expert_bytes_rows()))


if __name__ == "__main__":
    main()
