"""Hugging Face import and export of a large checkpoint: seconds and peak RSS ÷ checkpoint bytes.

    python benchmarks/hf_convert.py                  # ~1.1B parameters, float32 (4.4 GB); needs ~15 GB disk
    python benchmarks/hf_convert.py --params 2e8     # a smaller model

A random Llama-layout checkpoint (``config.json`` + ``model.safetensors``) is written first.
Then each phase runs in a fresh interpreter that reports its own peak RSS: ``baseline`` (the
same imports and a jax device, no model), ``import`` (``hf/import``: checks, sha256 of the files,
tensor-by-tensor conversion, the orbax step-0 checkpoint) and ``export`` (``hf/export``: orbax
restore, safetensors written tensor by tensor). Goal: peak RSS ÷ checkpoint bytes ≤ 1.25.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GOAL = 1.25

PHASE = r"""
import json, resource, sys, time
from pathlib import Path
import jax
from theseus.model.huggingface.importer import prepare, write_run
from theseus.model.huggingface.exporter import export_run
from theseus.model.huggingface.jobs import HFImport
phase, work = sys.argv[1], Path(sys.argv[2])
jax.devices()
start = time.perf_counter()
if phase == "import":
    write_run(work / "root", "big", prepare(work / "source"), {"source": str(work / "source")}, HFImport, "hf/import")
elif phase == "export":
    export_run(work / "root", "big", str(work / "export"))
seconds = time.perf_counter() - start
print(json.dumps({"seconds": seconds, "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
"""


def llama_shape(params: float) -> dict[str, int]:
    """A Llama-3-like shape (width 2048, GQA 32/8, d_ff 8192, vocab 32000, untied) with enough layers."""
    width, kv_width, d_ff, vocab = 2048, 512, 8192, 32000
    per_layer = 2 * width * width + 2 * width * kv_width + 3 * width * d_ff
    layers = max(1, round((params - 2 * vocab * width) / per_layer))
    return {"hidden_size": width, "num_hidden_layers": layers, "intermediate_size": d_ff, "vocab_size": vocab}


def write_source(folder: Path, params: float) -> int:
    """A random float32 Llama checkpoint in ``folder``; returns its safetensors size in bytes."""
    import numpy as np

    from theseus.model.huggingface.names import llama_maps
    from theseus.model.huggingface.safetensors_io import PlannedTensor, write_checkpoint
    from theseus.model.stack.architecture import Architecture

    shape = llama_shape(params)
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **shape,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
    }
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    arch = Architecture.from_keys(
        n_layers=shape["num_hidden_layers"],
        n_heads=32,
        n_kv_heads=8,
        n_embd=shape["hidden_size"],
        d_ff=shape["intermediate_size"],
        activation="swiglu",
        vocab_size=shape["vocab_size"],
        block_size=2048,
        norm="rmsnorm",
        norm_eps=1e-5,
        use_bias=False,
        rotary=True,
        rope_theta=500000.0,
        tied_embeddings=False,
        learned_positions=False,
        dropout=0.0,
        attention_impl="xla",
    )
    rng = np.random.default_rng(0)

    def random(shape: tuple[int, ...]) -> Callable[[], np.ndarray]:
        return lambda: rng.random(shape, dtype=np.float32) * np.float32(0.02)

    planned = [PlannedTensor(m.hf, m.hf_shape, "F32", random(m.hf_shape)) for m in llama_maps(arch)]
    write_checkpoint(folder, planned, shard_bytes=2 * 10**9)
    return sum(p.nbytes for p in planned)


def run_phase(phase: str, work: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PHASE, phase, str(work)], capture_output=True, text=True, cwd=REPO, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"{phase} failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=float, default=1.0e9, help="approximate parameter count")
    parser.add_argument("--workdir", type=Path, default=None, help="scratch folder (default: a temporary one)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="theseus-hf-bench-", dir=args.workdir))
    try:
        start = time.perf_counter()
        size = write_source(work / "source", args.params)
        print(
            f"checkpoint: {size / 1e9:.2f} GB float32 ({size / 4 / 1e9:.2f}B parameters), "
            f"written in {time.perf_counter() - start:.0f} s"
        )
        baseline = run_phase("baseline", work)
        print("| Phase | Seconds | Peak RSS | ÷ checkpoint | ÷ checkpoint, baseline removed | Goal |")
        print("|---|---|---|---|---|---|")
        print(f"| baseline (imports, no model) | — | {baseline['peak_rss'] / 1e9:.2f} GB | — | — | — |")
        for phase in ("import", "export"):
            result = run_phase(phase, work)
            ratio = result["peak_rss"] / size
            net = (result["peak_rss"] - baseline["peak_rss"]) / size
            status = "pass" if ratio <= GOAL else "miss"
            print(
                f"| {phase} | {result['seconds']:.1f} | {result['peak_rss'] / 1e9:.2f} GB | {ratio:.2f} | "
                f"{net:.2f} | ≤ {GOAL} ({status}) |"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
