"""Start-up breakdown: where the seconds before (and just after) the first training update go.

A fresh interpreter builds a trainer for the workload and times each phase on its own:

* **imports**   — process spawn until jax, flax, optax and the trainer's modules are imported;
* **setup**     — ``trainer.setup()``: configuration, mesh, optimizer, abstract state (one shape-only trace);
* **state init**— ``trainer.init_state()`` until the parameters exist (compiling the initialiser);
* **trace**     — tracing and lowering the training step to XLA;
* **compile**   — XLA compilation of the training step (or a persistent-cache hit);
* **first step**— running the compiled update once;
* **checkpoint**— writing one checkpoint of the state and waiting for it.

The child runs twice against one fresh compilation-cache folder: ``cold`` (empty cache) and
``warm`` (what a restart, or a second run of the same shape, pays). Run ``python benchmarks/startup.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO

SPAWN_ENV = "THESEUS_BENCHMARK_SPAWNED_AT"
PHASES = ("imports", "setup", "state init", "trace", "compile", "first step", "checkpoint")


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("THESEUS_") and not k.startswith("JAX_COMPILATION_CACHE")
    }
    env.setdefault("JAX_PLATFORMS", "cpu")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def startup_breakdown(
    preset: str = "tiny", batch: int = 8, seq: int = 256, *, overrides: dict | None = None, timeout: float = 600
) -> dict[str, dict[str, float]]:
    """``{"cold": {phase: seconds, ..., "total": s}, "warm": {...}}`` from two fresh processes sharing a cache."""
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="theseus-startup-") as root:
        for label in ("cold", "warm"):
            env = _env()
            env[SPAWN_ENV] = repr(time.time())
            command = [
                sys.executable,
                "-m",
                "benchmarks.startup",
                "--child",
                root,
                preset,
                str(batch),
                str(seq),
                json.dumps(overrides or {}),
            ]
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                raise RuntimeError(f"start-up process failed ({done.returncode}): {done.stderr.strip()[-800:]}")
            results[label] = json.loads(lines[-1])
    return results


def _child(root: str, preset: str, batch: int, seq: int, overrides: dict[str, Any]) -> None:
    spawned = float(os.environ[SPAWN_ENV])
    times: dict[str, float] = {}

    import jax
    import numpy as np

    from benchmarks.bare_loop import trainer_class, trainer_overrides
    from benchmarks.workload import Workload
    from theseus.checkpoint import CheckpointStore

    work = Workload.create(preset, batch=batch, seq=seq, overrides=overrides)
    trainer_cls = trainer_class(work)
    mark = time.time()
    times["imports"] = mark - spawned

    def lap(name: str) -> None:
        nonlocal mark
        now = time.time()
        times[name] = now - mark
        mark = now

    trainer = trainer_cls.create(root, trainer_overrides(work))
    trainer.setup()  # turns on the persistent compilation cache under <root>/cache/jax
    lap("setup")
    state = jax.block_until_ready(trainer.init_state())
    lap("state init")
    step_fn = trainer.train_step_fn()
    device_batch = trainer.device_train_batch(trainer.host_batch("train", position=0))
    key = trainer.step_key(0)
    lowered = step_fn.lower(state, device_batch, key)
    lap("trace")
    compiled = lowered.compile()
    lap("compile")
    state, loss, *_ = compiled(state, device_batch, key)
    float(np.asarray(jax.device_get(loss)))
    lap("first step")
    store = CheckpointStore(tempfile.mkdtemp(dir=root, prefix="checkpoints-"), keep=1, async_save=True)
    store.save(1, trainer.checkpoint_tree(state), {"step": 1, "data_position": 1}, val_loss=None)
    store.wait()
    store.close()
    lap("checkpoint")
    times["total"] = sum(times[name] for name in PHASES)
    print(json.dumps(times))


def format_breakdown(results: dict[str, dict[str, float]]) -> str:
    """One line per run: ``cold 9.1 s = imports 2.0 + setup 0.9 + ...``."""
    lines = []
    for label, times in results.items():
        parts = " + ".join(f"{name} {times[name]:.2f}" for name in PHASES)
        lines.append(f"{label}: {times['total']:.2f} s = {parts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2], int(argv[3]), int(argv[4]), json.loads(argv[5]) if len(argv) > 5 else {})
        return
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--set", nargs="*", default=[], help="model keys, e.g. architecture/n_layers=24")
    args = parser.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    print(f"start-up breakdown ({args.preset}, {args.batch}x{args.seq}), seconds")
    print(format_breakdown(startup_breakdown(args.preset, args.batch, args.seq, overrides=overrides)))


if __name__ == "__main__":
    main()
