"""One GPU check in one process tree: cuDNN attention against XLA's, a short real training run, and the plan.

    python benchmarks/gpu_check.py --out DIR                 # on a GPU: attention, then training runs
    python benchmarks/gpu_check.py --cpu-smoke --out DIR     # tiny sizes on CPU: keeps the script tested
    PYTHONPATH=.compilers python benchmarks/gpu_check.py --parts plan --out DIR   # the plans, no GPU

Parts (``--parts``, comma-separated; default ``env,attention,train``):

- ``attention``: ``dot_product_attention`` (``theseus.model.layers.attention``) in bf16 with
  ``implementation="xla"``, ``"cudnn"`` and ``"auto"``, against XLA in float32 on the same inputs
  upcast, for causal attention alone, with a key padding mask (sent to cuDNN as sequence lengths),
  a sliding window, both, grouped-query heads, packed rows (a mask per query: a bias for cuDNN) and a
  row that is all padding. Outputs and the gradients of q, k and v (of a random projection of the
  outputs at real query positions) are compared: max |cuDNN - XLA| and ||x - ref|| / ||ref|| of each
  bf16 path. ``auto``'s compiled program is searched for cuDNN's fused attention call.
- ``train``: ``theseus run train/pretrain`` in a child process (the job as the command runs it, on
  the offline Python standard library corpus), one per configuration; the trainer's own logged
  tokens/s, step time and MFU (published bf16 peak), the median step from its per-step log, the
  device's ``peak_bytes_in_use``, and the count of cuDNN attention calls in the compiled train step.
- ``plan``: ``theseus plan`` of the same configurations for one H100 and one H200 (needs XLA's GPU
  compiler on ``PYTHONPATH``, no GPU): predicted memory per device, step and MFU.
- ``compare``: the side-by-side table from ``--measured`` and ``--planned`` results files.

Every part catches its own failure, records it and carries on; results go to ``DIR/results.json``
(rewritten after each part), the log to ``DIR/log.txt``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: ``train/pretrain`` configurations: name -> overrides. Byte-level data (the offline corpus) with the
#: GPT-2 vocabulary size padded to 64, so the model has GPT-2's 124M / 355M parameters.
TRAIN_CONFIGS: dict[str, list[str]] = {
    "gpt2-124m": [
        "model=gpt",
        "architecture/preset=gpt2-124m",
        "architecture/block_size=1024",
        "architecture/vocab_size=50304",
        "training/batch_size=16",
        "training/sequence_length=1024",
    ],
    "gpt2-350m": [
        "model=gpt",
        "architecture/preset=gpt2-350m",
        "architecture/block_size=1024",
        "architecture/vocab_size=50304",
        "training/batch_size=16",
        "training/sequence_length=1024",
    ],
}
#: The families of 2025 (measured on an H200) and of late 2026 (measured on a TPU v5e chip).
FAMILIES_2025 = ("gpt_oss", "llama4_text", "qwen3_next", "olmo3", "deepseek_v3", "gemma3")
FAMILIES_2026 = ("qwen3_5", "qwen3_5_moe", "gemma4", "glm4_moe", "minimax_m2", "smollm3", "deepseek_v32", "glm_moe_dsa")
#: The hybrids of late 2026: Mamba-2, short convolutions, delta rules and hyper-connections beside attention.
FAMILIES_HYBRID = (
    "lfm2", "nemotron_h", "falcon_h1", "olmo_hybrid", "granitemoehybrid", "kimi_linear", "qwen4_exp"
)  # fmt: skip
#: The newest families' tiny presets (``--configs families``, or ``families-2026``): each trains on an
#: accelerator as it does on the CPU.
FAMILY_CONFIGS: dict[str, list[str]] = {
    f"{family}-tiny": [
        f"model={family}",
        "architecture/preset=tiny",
        "architecture/block_size=256",
        "training/batch_size=8",
        "training/sequence_length=256",
    ]
    for family in (*FAMILIES_2025, *FAMILIES_2026, *FAMILIES_HYBRID)
}
SMOKE_CONFIGS: dict[str, list[str]] = {
    "tiny": [
        "model=gpt",
        "architecture/preset=tiny",
        "architecture/block_size=64",
        "training/batch_size=2",
        "training/sequence_length=64",
    ],
}
#: Keys every training run gets: a short run, a log line per step, no validation or evaluation.
RUN_KEYS = [
    "training/log_interval=1",
    "training/progress=false",
    "training/eval_batches=0",
    "evaluation=",
    "training/checkpoint_interval=100000",
]
PLAN_TARGETS = ("h100x1", "h200x1")
CUDNN_CALL = "__cudnn$fmha"


class Recorder:
    """Collects results and the log under ``out``; writes both after every part."""

    def __init__(self, out: Path) -> None:
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.results: dict[str, Any] = {}
        self.log_file = (out / "log.txt").open("a")
        self.started = time.perf_counter()

    def log(self, text: str) -> None:
        line = f"[{time.perf_counter() - self.started:7.1f}s] {text}"
        print(line, flush=True)
        self.log_file.write(line + "\n")
        self.log_file.flush()

    def save(self) -> None:
        (self.out / "results.json").write_text(json.dumps(self.results, indent=1, default=str))

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


# -- environment -------------------------------------------------------------------------------


def environment(rec: Recorder) -> dict[str, Any]:
    import jax

    info: dict[str, Any] = {"python": platform.python_version(), "jax": jax.__version__}
    for name in ("jaxlib", "flax", "optax", "orbax.checkpoint", "numpy", "omegaconf"):
        try:
            module = __import__(name, fromlist=["__version__"])
            info[name] = getattr(module, "__version__", "?")
        except Exception as error:
            info[name] = f"missing: {error}"
    devices = jax.devices()
    info["backend"] = jax.default_backend()
    info["devices"] = [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in devices]
    try:
        import theseus.model.layers.attention as attention_module

        info["theseus_models"] = attention_module.__file__
    except Exception as error:
        info["theseus_models"] = f"import failed: {error!r}"
    if info["backend"] == "gpu":
        try:
            smi = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm", "--format=csv"],
                capture_output=True,
                text=True,
                timeout=30,
            )
            info["nvidia_smi"] = smi.stdout.strip()
        except Exception as error:
            info["nvidia_smi"] = repr(error)
        try:
            from jax._src.lib import cuda_versions

            info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions else None
        except Exception as error:
            info["cudnn"] = repr(error)
        try:
            info["bf16_matmul_tflops"] = matmul_tflops(8192) / 1e12
        except Exception as error:
            info["bf16_matmul_tflops"] = repr(error)
    rec.log(f"environment: {json.dumps(info)}")
    return info


def matmul_tflops(size: int, repeats: int = 10) -> float:
    """FLOP/s of a bf16 ``size``-cubed matmul on random data (median of ``repeats`` after warm-up)."""
    import jax
    import jax.numpy as jnp

    a, b = (jax.random.normal(key, (size, size), jnp.bfloat16) for key in jax.random.split(jax.random.key(0)))
    matmul = jax.jit(lambda x, y: x @ y)
    for _ in range(3):
        matmul(a, b).block_until_ready()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        matmul(a, b).block_until_ready()
        times.append(time.perf_counter() - start)
    return 2.0 * size**3 / statistics.median(times)


# -- attention ---------------------------------------------------------------------------------


def attention_cases(smoke: bool) -> list[dict[str, Any]]:
    """Shapes and masks: GPT-2 124M's heads (12 x 64) at 1024 tokens; Llama-like GQA (16 x 128, 4 KV)."""
    if smoke:
        return [
            {"name": "causal", "batch": 2, "steps": 256, "heads": 2, "kv": 2, "dim": 16},
            {"name": "causal+padding", "batch": 2, "steps": 256, "heads": 2, "kv": 2, "dim": 16, "lengths": [256, 100]},
            {"name": "causal+window", "batch": 2, "steps": 256, "heads": 2, "kv": 2, "dim": 16, "window": 64},
            {"name": "packed rows", "batch": 2, "steps": 256, "heads": 2, "kv": 1, "dim": 16, "segments": [100, 120]},
            {"name": "empty row", "batch": 2, "steps": 256, "heads": 2, "kv": 2, "dim": 16, "lengths": [256, 0]},
        ]
    return [
        {"name": "causal", "batch": 4, "steps": 1024, "heads": 12, "kv": 12, "dim": 64},
        {
            "name": "causal+padding",
            "batch": 4,
            "steps": 1024,
            "heads": 12,
            "kv": 12,
            "dim": 64,
            "lengths": [1024, 777, 300, 1],
        },
        {"name": "causal+window", "batch": 4, "steps": 1024, "heads": 12, "kv": 12, "dim": 64, "window": 256},
        {
            "name": "causal+padding+window",
            "batch": 4,
            "steps": 1024,
            "heads": 12,
            "kv": 12,
            "dim": 64,
            "lengths": [1024, 777, 300, 1],
            "window": 256,
        },
        {
            "name": "GQA 16q/4kv x128 +padding",
            "batch": 2,
            "steps": 2048,
            "heads": 16,
            "kv": 4,
            "dim": 128,
            "lengths": [2048, 1500],
        },
        {"name": "packed rows", "batch": 2, "steps": 1024, "heads": 12, "kv": 12, "dim": 64, "segments": [400, 500]},
        {"name": "empty row", "batch": 2, "steps": 1024, "heads": 12, "kv": 12, "dim": 64, "lengths": [1024, 0]},
    ]


def _masks(case: dict[str, Any]) -> tuple[Any, Any]:
    """The padding mask handed to ``attention_mask`` (bool lengths or int segment ids) and the
    ``[B, T]`` mask of real query positions."""
    import numpy as np

    batch, steps = case["batch"], case["steps"]
    if "lengths" in case:
        real = np.arange(steps)[None, :] < np.asarray(case["lengths"])[:, None]
        return real, real
    if "segments" in case:
        ids = np.zeros((batch, steps), np.int32)
        for row in range(batch):
            at = 0
            for index, size in enumerate(case["segments"], start=1):
                ids[row, at : at + size] = index
                at += size
        return ids, ids > 0
    return None, np.ones((batch, steps), bool)


def check_attention_case(case: dict[str, Any], seed: int, rec: Recorder) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from theseus.model.layers.attention import attention_mask, dot_product_attention

    batch, steps, heads, kv, dim = case["batch"], case["steps"], case["heads"], case["kv"], case["dim"]
    window = case.get("window")
    padding, real = _masks(case)
    mask = None if padding is None else attention_mask(jnp.asarray(padding))
    real_j = jnp.asarray(real)
    keys = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(keys[0], (batch, steps, heads, dim), jnp.float32)
    k = jax.random.normal(keys[1], (batch, steps, kv, dim), jnp.float32)
    v = jax.random.normal(keys[2], (batch, steps, kv, dim), jnp.float32)
    cotangent = jax.random.normal(keys[3], (batch, steps, heads, dim), jnp.float32)

    def make(implementation: str) -> Any:
        def attend(q: Any, k: Any, v: Any) -> Any:
            return dot_product_attention(
                q, k, v, mask=mask, is_causal=True, implementation=implementation, window=window
            )

        def loss(q: Any, k: Any, v: Any) -> Any:
            out = attend(q, k, v).astype(jnp.float32)
            out = jnp.where(real_j[:, :, None, None], out, 0.0)  # only real queries count, as in a loss
            return jnp.sum(out * cotangent)

        def both(q: Any, k: Any, v: Any) -> Any:
            out = attend(q, k, v)
            grads = jax.grad(loss, argnums=(0, 1, 2))(q, k, v)
            return out, grads

        return jax.jit(both)

    bf = [x.astype(jnp.bfloat16) for x in (q, k, v)]
    result: dict[str, Any] = {"case": case}
    outputs: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for implementation, inputs in (("ref-f32", (q, k, v)), ("xla", bf), ("cudnn", bf), ("auto", bf)):
        impl = "xla" if implementation == "ref-f32" else implementation
        try:
            fn = make(impl)
            compiled = fn.lower(*inputs).compile()
            text = compiled.as_text()
            result[f"{implementation}_cudnn_calls"] = text.count(CUDNN_CALL)
            out, grads = jax.block_until_ready(compiled(*inputs))
            outputs[implementation] = [np.asarray(x.astype(jnp.float32)) for x in (out, *grads)]
            times = []
            for _ in range(5):
                start = time.perf_counter()
                jax.block_until_ready(compiled(*inputs))
                times.append(time.perf_counter() - start)
            timings[implementation] = statistics.median(times)
        except Exception as error:
            result[f"{implementation}_error"] = f"{type(error).__name__}: {str(error)[:800]}"
            rec.log(f"  {case['name']} {implementation}: {result[f'{implementation}_error']}")
    result["median_seconds_fwd_bwd"] = timings
    if "ref-f32" not in outputs:
        return result
    ref = outputs["ref-f32"]
    names = ("out", "dq", "dk", "dv")
    row_mask = real[:, :, None, None]

    def selected(array: Any, index: int) -> Any:
        return array * row_mask if index == 0 else array  # outputs: real query rows only

    for implementation in ("xla", "cudnn", "auto"):
        if implementation not in outputs:
            continue
        got = outputs[implementation]
        for index, name in enumerate(names):
            a, r = selected(got[index], index), selected(ref[index], index)
            result[f"{implementation}_{name}_rel_err"] = float(np.linalg.norm(a - r) / max(np.linalg.norm(r), 1e-30))
            result[f"{implementation}_{name}_finite"] = bool(np.isfinite(got[index]).all())
    for implementation in ("cudnn", "auto"):
        if implementation in outputs and "xla" in outputs:
            for index, name in enumerate(names):
                a = selected(outputs[implementation][index], index)
                b = selected(outputs["xla"][index], index)
                result[f"{implementation}_vs_xla_{name}_max_abs"] = float(np.max(np.abs(a - b)))
    if "cudnn" in outputs and not real.all():
        padded = outputs["cudnn"][0][~real]
        result["cudnn_padded_rows_max_abs"] = float(np.max(np.abs(padded))) if padded.size else 0.0
        result["cudnn_padded_rows_finite"] = bool(np.isfinite(padded).all())
    if "cudnn" in outputs and "auto" in outputs:
        result["auto_equals_cudnn"] = all(
            np.array_equal(a, b) for a, b in zip(outputs["auto"], outputs["cudnn"], strict=True)
        )
    return result


def attention_part(rec: Recorder, smoke: bool) -> list[dict[str, Any]]:
    results = []
    for seed, case in enumerate(attention_cases(smoke)):
        started = time.perf_counter()
        try:
            result = check_attention_case(case, seed, rec)
        except Exception as error:
            result = {"case": case, "error": traceback.format_exc()[-1500:]}
            rec.log(f"attention {case['name']}: {error!r}")
        result["seconds"] = time.perf_counter() - started
        results.append(result)
        rec.log(f"attention {case['name']}: {_attention_line(result)}")
    return results


def _attention_line(result: dict[str, Any]) -> str:
    parts = []
    for key in (
        "cudnn_vs_xla_out_max_abs",
        "cudnn_vs_xla_dq_max_abs",
        "cudnn_vs_xla_dk_max_abs",
        "cudnn_vs_xla_dv_max_abs",
    ):
        if key in result:
            parts.append(f"{key.split('_')[3]} {result[key]:.3g}")
    for implementation in ("xla", "cudnn"):
        errs = [result.get(f"{implementation}_{n}_rel_err") for n in ("out", "dq", "dk", "dv")]
        if all(e is not None for e in errs):
            parts.append(f"{implementation} rel " + "/".join(f"{e:.2g}" for e in errs))
    parts.append(f"auto cuDNN calls {result.get('auto_cudnn_calls')}")
    if "cudnn_padded_rows_finite" in result:
        parts.append(f"padded rows finite {result['cudnn_padded_rows_finite']}")
    times = result.get("median_seconds_fwd_bwd", {})
    if "xla" in times and "cudnn" in times:
        parts.append(f"fwd+bwd xla {times['xla'] * 1e3:.2f} ms, cudnn {times['cudnn'] * 1e3:.2f} ms")
    return "; ".join(parts)


# -- training ----------------------------------------------------------------------------------


def train_child(name: str, overrides: list[str], root: Path, result_file: Path, dump: Path | None) -> None:
    """Run ``train/pretrain`` in this process, as ``theseus run`` would, then record the device's memory."""
    record: dict[str, Any] = {"name": name, "overrides": overrides}
    started = time.perf_counter()
    try:
        from theseus.cli.running import run_job

        run_job("train/pretrain", overrides, None, root)
    except SystemExit as stop:
        record["exit"] = stop.code
    except BaseException as error:
        record["error"] = traceback.format_exc()[-3000:]
        print(f"training {name} failed: {error!r}", flush=True)
    record["seconds"] = time.perf_counter() - started
    try:
        import jax

        stats = jax.local_devices()[0].memory_stats() or {}
        record["memory_stats"] = {key: stats[key] for key in sorted(stats) if "bytes" in key}
    except Exception as error:
        record["memory_stats_error"] = repr(error)
    if dump is not None and dump.exists():
        calls = {}
        for file in dump.glob("*after_optimizations.txt"):
            count = file.read_text(errors="replace").count(CUDNN_CALL)
            if count:
                calls[file.name] = count
        record["cudnn_calls_in_compiled_modules"] = calls
    result_file.write_text(json.dumps(record, default=str))


def read_metrics(run_dir: Path) -> dict[str, Any]:
    """The trainer's logged train rows: its last figures and the median step from per-step logs."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    train = [row for row in (json.loads(line) for line in lines) if row.get("split") == "train"]
    timed = [row for row in train if "step_time" in row]
    summary: dict[str, Any] = {"logged_steps": len(train), "losses": [round(r["loss"], 4) for r in train]}
    if timed:
        last = timed[-1]
        summary.update(
            {
                "last_step": last["step"],
                "tokens_per_sec": last["tokens_per_sec"],
                "step_time": last["step_time"],
                "mfu": last.get("mfu"),
            }
        )
        # step_time is the mean since the window began after step 1: recover each step's interval
        elapsed = {row["step"]: row["step_time"] * (row["step"] - 1) for row in timed}
        steps = sorted(elapsed)
        intervals = [elapsed[b] - elapsed[a] for a, b in itertools.pairwise(steps) if b == a + 1]
        if intervals:
            summary["median_step_time"] = statistics.median(intervals)
            summary["min_step_time"] = min(intervals)
    return summary


def train_part(rec: Recorder, configs: dict[str, list[str]], steps: int, root: Path, deadline: float) -> list[Any]:
    results = []
    for name, overrides in configs.items():
        left = deadline - rec.elapsed()
        if left < 60:
            rec.log(f"train {name}: skipped, {left:.0f} s left before the deadline")
            results.append({"name": name, "skipped": f"{left:.0f} s left"})
            continue
        run_name = f"gpucheck-{name}"
        shutil.rmtree(root / "runs" / run_name, ignore_errors=True)  # a fresh run, not a resumed one
        keys = [*overrides, *RUN_KEYS, f"training/steps={steps}", f"run/name={run_name}"]
        result_file = rec.out / f"train-{name}.json"
        dump = Path(f"/tmp/gpucheck-dump-{name}")
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.pop("XLA_PYTHON_CLIENT_PREALLOCATE", None)  # the run takes the device as a user's run does
        dump_flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_step"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {dump_flags}".strip()
        command = [sys.executable, str(Path(__file__).resolve()), "--train-child", name, "--root", str(root)]
        command += ["--child-result", str(result_file), "--child-dump", str(dump), "--"]
        command += keys
        rec.log(f"train {name}: theseus run train/pretrain {' '.join(keys)}")
        started = time.perf_counter()
        record: dict[str, Any] = {"name": name, "keys": keys}
        try:
            child = subprocess.run(
                command, env=env, capture_output=True, text=True, timeout=max(30.0, deadline - rec.elapsed())
            )
            record["returncode"] = child.returncode
            record["output_tail"] = (child.stdout + child.stderr)[-4000:]
            for line in (child.stdout + child.stderr).splitlines():
                shown = line.startswith(("step 1/", "step 2/", f"step {steps}/")) or "trained" in line
                if shown or "parameters" in line or "error" in line.lower():
                    rec.log(f"  | {line[:300]}")
        except subprocess.TimeoutExpired as error:
            record["error"] = f"timed out after {error.timeout:.0f} s"
        record["wall_seconds"] = time.perf_counter() - started
        if result_file.exists():
            record.update(json.loads(result_file.read_text()))
        try:
            record["metrics"] = read_metrics(root / "runs" / run_name)
        except Exception as error:
            record["metrics_error"] = repr(error)
        results.append(record)
        rec.log(f"train {name}: {_train_line(record)}")
    return results


def _train_line(record: dict[str, Any]) -> str:
    metrics = record.get("metrics", {})
    peak = record.get("memory_stats", {}).get("peak_bytes_in_use")
    parts = [f"rc {record.get('returncode')}", f"{record.get('wall_seconds', 0):.0f} s"]
    if "tokens_per_sec" in metrics:
        parts.append(
            f"{metrics['tokens_per_sec']:,.0f} tok/s, step {metrics['step_time'] * 1e3:.1f} ms "
            f"(median {metrics.get('median_step_time', 0) * 1e3:.1f} ms), MFU {100 * (metrics.get('mfu') or 0):.1f}%"
        )
    if peak is not None:
        parts.append(f"peak {peak / 1e9:.2f} GB")
    losses = metrics.get("losses", [])
    if losses:
        parts.append(f"loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    if "error" in record:
        parts.append("error: " + str(record["error"]).strip().splitlines()[-1][:300])
    return ", ".join(parts)


# -- plan ----------------------------------------------------------------------------------------


def plan_part(rec: Recorder, configs: dict[str, list[str]], root: Path) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, overrides in configs.items():
        for target in PLAN_TARGETS:
            command = [sys.executable, "-c", "from theseus.cli.main import main; main()", "plan", "train/pretrain"]
            command += ["--target", target]
            command += [*overrides, "--json"]
            env = dict(os.environ, THESEUS_ROOT=str(root))
            try:
                child = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
                plan = json.loads(child.stdout[child.stdout.index("{") :])
                results[f"{name}@{target}"] = {
                    "memory": plan["memory"],
                    "estimate": plan["estimate"],
                    "flops": plan["flops"],
                    "custom_calls": plan.get("custom_calls"),
                    "parameters": plan["parameters"],
                }
                est, mem = plan["estimate"], plan["memory"]
                rec.log(
                    f"plan {name} on {target}: {mem['total'] / 1e9:.2f} GB per device, step "
                    f"{est['step_seconds'] * 1e3:.1f} ms, {est['tokens_per_second']:,.0f} tok/s, "
                    f"MFU {100 * est['mfu']:.1f}%"
                )
            except Exception as error:
                results[f"{name}@{target}"] = {"error": repr(error)}
                rec.log(f"plan {name} on {target}: {error!r}")
    return results


def compare(measured: dict[str, Any], planned: dict[str, Any]) -> str:
    """Markdown: each trained configuration, measured on the GPU against its plans."""
    rows = [
        "| Configuration | Source | Memory / device | Step | Tokens/s | MFU |",
        "|---|---|---|---|---|---|",
    ]
    device = ", ".join(measured.get("env", {}).get("devices", [])) or "GPU"
    for record in measured.get("train", []):
        name = record.get("name")
        metrics = record.get("metrics", {})
        peak = record.get("memory_stats", {}).get("peak_bytes_in_use")
        if "tokens_per_sec" in metrics:
            memory = f"{peak / 1e9:.2f} GB (peak in use)" if peak else "-"
            median = metrics.get("median_step_time")
            step = f"{metrics['step_time'] * 1e3:.1f} ms" + (f" (median {median * 1e3:.1f})" if median else "")
            rows.append(
                f"| {name} | measured, {device} | {memory} | {step} | {metrics['tokens_per_sec']:,.0f} | "
                f"{100 * (metrics.get('mfu') or 0):.1f}% |"
            )
        for target in PLAN_TARGETS:
            plan = planned.get(f"{name}@{target}")
            if plan and "estimate" in plan:
                est, mem = plan["estimate"], plan["memory"]
                rows.append(
                    f"| {name} | plan, {target} | {mem['total'] / 1e9:.2f} GB | {est['step_seconds'] * 1e3:.1f} ms | "
                    f"{est['tokens_per_second']:,.0f} | {100 * est['mfu']:.1f}% |"
                )
    return "\n".join(rows)


# -- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu-check"))
    parser.add_argument("--parts", default="env,attention,train")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on CPU (a test of the script)")
    parser.add_argument(
        "--configs",
        default="",
        help="comma-separated TRAIN_CONFIGS or FAMILY_CONFIGS names, 'families', 'families-2026' or 'families-hybrid' "
        "(default: TRAIN_CONFIGS)",
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps per configuration")
    parser.add_argument("--root", type=Path, default=Path("/tmp/gpucheck-root"), help="theseus root of the runs")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds after which no training starts")
    parser.add_argument("--measured", type=Path, help="compare: the GPU run's results.json")
    parser.add_argument("--planned", type=Path, help="compare: the plan run's results.json")
    parser.add_argument("--train-child", help=argparse.SUPPRESS)
    parser.add_argument("--child-result", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--child-dump", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.train_child:
        train_child(args.train_child, args.overrides, args.root, args.child_result, args.child_dump)
        return 0
    parts = [part for part in args.parts.split(",") if part]
    if "compare" in parts:
        measured = json.loads(args.measured.read_text()) if args.measured else {}
        planned = json.loads(args.planned.read_text()).get("plan", {}) if args.planned else {}
        print(compare(measured, planned))
        return 0
    # this process's attention checks take only what they use: the training runs are child processes
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    rec = Recorder(args.out)
    configs = SMOKE_CONFIGS if args.cpu_smoke else TRAIN_CONFIGS
    if args.configs == "families":
        configs = FAMILY_CONFIGS
    elif args.configs in ("families-2026", "families-hybrid"):
        chosen = FAMILIES_2026 if args.configs == "families-2026" else FAMILIES_HYBRID
        configs = {f"{family}-tiny": FAMILY_CONFIGS[f"{family}-tiny"] for family in chosen}
    elif args.configs:
        configs = {name: {**TRAIN_CONFIGS, **FAMILY_CONFIGS}[name] for name in args.configs.split(",")}
    rec.results["argv"] = sys.argv
    for part in parts:
        rec.log(f"== {part}")
        try:
            if part == "env":
                rec.results["env"] = environment(rec)
            elif part == "attention":
                rec.results["attention"] = attention_part(rec, args.cpu_smoke)
            elif part == "train":
                rec.results["train"] = train_part(rec, configs, args.steps, args.root, args.deadline)
            elif part == "plan":
                rec.results["plan"] = plan_part(rec, configs, args.root)
            else:
                raise ValueError(f"unknown part {part!r}")
        except Exception:
            rec.results[f"{part}_error"] = traceback.format_exc()[-3000:]
            rec.log(rec.results[f"{part}_error"])
        rec.save()
    rec.log(f"done in {rec.elapsed():.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
