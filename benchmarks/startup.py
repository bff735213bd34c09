"""Start-up breakdown: where the seconds before (and just after) the first training update go.

A fresh interpreter builds a trainer for the workload and times each phase on its own:

* **imports**   — process spawn until jax, flax, optax and the trainer's modules are imported;
* **setup**     — ``trainer.setup()``: configuration, mesh, optimizer, abstract state (one shape-only trace);
* **state init**— ``trainer.init_state()`` until the parameters exist (compiling the initialiser);
* **trace**     — tracing and lowering the training step to XLA;
* **compile**   — XLA compilation of the training step (or a persistent-cache hit);
* **first step**— running the compiled update once;
* **checkpoint**— importing orbax, writing one checkpoint of the state and waiting for it.

The child runs twice against one fresh compilation-cache folder: ``cold`` (empty cache) and
``warm`` (what a restart, or a second run of the same shape, pays).

``run_breakdown()`` times the real thing: ``theseus run train/pretrain training/steps=1`` in a
fresh process (cold, then warm), split at the trainer's own phases:

* **imports**      — process spawn until ``setup()`` starts (imports, CLI, configuration, job lookup);
* **setup**, **state init** — as above;
* **first update** — ``init_state()`` done until the first update's loss is on the host (run directory,
  trace, compile, first batch, the update itself);
* **validation**, **evaluation**, **checkpoint** — the work at the last step;
* **rest**         — everything else until the process has exited (summary, plot, shutdown).

Next to the wall time until the first update it reports the process's CPU seconds until then,
which another process's load disturbs less.

It also lists the heavy modules (orbax, matplotlib, ...) already imported when the first update is done.
Run ``python benchmarks/startup.py`` (phases) or ``python benchmarks/startup.py --run`` (the real run).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import REPO, add_workload_arguments

SPAWN_ENV = "THESEUS_BENCHMARK_SPAWNED_AT"
PHASES = ("imports", "setup", "state init", "trace", "compile", "first step", "checkpoint")
RUN_PHASES = ("imports", "setup", "state init", "first update", "validation", "evaluation", "checkpoint", "rest")
#: Modules that a run should import only once it needs them (never before the first update).
LATE_MODULES = ("orbax", "matplotlib", "pandas", "datasets", "tensorboard", "tensorboardX", "wandb", "mlflow", "torch")


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

    work = Workload.create(preset, batch=batch, seq=seq, overrides=overrides)
    trainer_cls = trainer_class(work)
    mark = time.time()
    times["imports"] = mark - spawned

    def lap(name: str) -> None:
        nonlocal mark
        now = time.time()
        times[name] = now - mark
        mark = now

    trainer = trainer_cls.create(root, trainer_overrides(work, **{"training/compilation_cache": True}))
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
    from theseus.checkpoint import CheckpointStore  # as in a run: orbax is imported at the first save

    store = CheckpointStore(tempfile.mkdtemp(dir=root, prefix="checkpoints-"), keep=1, async_save=True)
    store.save(1, trainer.checkpoint_tree(state), {"step": 1, "data_position": 1}, val_loss=None)
    store.wait()
    store.close()
    lap("checkpoint")
    times["total"] = sum(times[name] for name in PHASES)
    print(json.dumps(times))


def run_breakdown(
    job: str = "train/pretrain", overrides: list[str] | None = None, *, timeout: float = 600
) -> dict[str, dict[str, Any]]:
    """``{"cold": {phase: seconds, "to first update": s, "total": s, "early modules": [...]}, "warm": {...}}``:
    a 1-step ``theseus run JOB`` in two fresh processes sharing one root (data prepared first, not timed)."""
    given = ["training/steps=1", *(overrides or [])]
    results: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="theseus-startup-run-") as root:
        for label in ("prepare", "cold", "warm"):
            env = _env()
            env[SPAWN_ENV] = repr(time.time())
            out = Path(root) / f"{label}.json"
            args = [*given, f"run/name=startup-{label}"]
            command = [sys.executable, "-m", "benchmarks.startup", "--run-child", root, str(out), job, *args]
            start = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)
            wall = time.perf_counter() - start
            if done.returncode != 0 or not out.is_file():
                raise RuntimeError(f"1-step run failed ({done.returncode}): {done.stderr.strip()[-800:]}")
            if label == "prepare":  # the corpus is prepared and the cache filled by this one; start cold again
                shutil.rmtree(Path(root) / "cache", ignore_errors=True)
                continue
            times = json.loads(out.read_text())
            times["total"] = wall
            times["rest"] = max(0.0, wall - sum(times[name] for name in RUN_PHASES if name != "rest"))
            results[label] = times
    return results


def _run_child(root: str, out: str, job: str, overrides: list[str]) -> None:
    """Run ``theseus run JOB`` in this process with the trainer's phases timed; write them to ``out``."""
    spawned = float(os.environ[SPAWN_ENV])
    events: dict[str, float] = {name: 0.0 for name in RUN_PHASES}
    marks: dict[str, float] = {}
    early: list[str] = []

    from theseus.cli.main import main as cli_main
    from theseus.training.base import BaseTrainer
    from theseus.training.callbacks import Checkpoints, Evaluations, Validation
    from theseus.training.loop import TrainingLoop

    def timed(owner: Any, attribute: str, phase: str, after: Any = None) -> None:
        original = getattr(owner, attribute)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.time()
            marks.setdefault(f"{phase} start", start)
            try:
                return original(*args, **kwargs)
            finally:
                end = time.time()
                events[phase] += end - start
                marks.setdefault(f"{phase} end", end)
                if after is not None:
                    after()

        setattr(owner, attribute, wrapper)

    def first_update() -> None:
        if "first update" not in marks:
            marks["first update"] = time.time()
            usage = resource.getrusage(resource.RUSAGE_SELF)
            marks["cpu"] = usage.ru_utime + usage.ru_stime
            early.extend(sorted({name.split(".")[0] for name in sys.modules} & set(LATE_MODULES)))

    timed(BaseTrainer, "setup", "setup")
    timed(BaseTrainer, "init_state", "state init")
    timed(TrainingLoop, "_finish", "finish", first_update)
    timed(Validation, "work", "validation")
    timed(Evaluations, "work", "evaluation")
    timed(Checkpoints, "save", "checkpoint")
    events["finish"] = 0.0
    try:
        cli_main(["run", job, "--root", root, *overrides])
    except SystemExit as exc:
        if exc.code:
            raise
    events["imports"] = marks["setup start"] - spawned
    events["setup"] = marks["setup end"] - marks["setup start"]
    events["first update"] = marks["first update"] - marks["state init end"]
    events["to first update"] = marks["first update"] - spawned
    #: CPU seconds of all threads until then: less sensitive than wall time to other processes' load.
    events["cpu to first update"] = marks["cpu"]
    events.pop("finish")
    Path(out).write_text(json.dumps({**events, "early modules": early}))


def format_run(results: dict[str, dict[str, Any]]) -> str:
    """One line per run: ``cold 9.1 s (first update at 3.2 s) = imports 2.0 + ...; imported early: ...``."""
    lines = []
    for label, times in results.items():
        parts = " + ".join(f"{name} {times[name]:.2f}" for name in RUN_PHASES)
        early = ", ".join(times["early modules"]) or "none"
        lines.append(
            f"{label}: {times['total']:.2f} s, first update done at {times['to first update']:.2f} s "
            f"({times['cpu to first update']:.2f} CPU s); {parts}"
            f"; imported before the first update: {early}"
        )
    return "\n".join(lines)


def format_breakdown(results: dict[str, dict[str, float]]) -> str:
    """One line per run: ``cold 9.1 s = imports 2.0 + setup 0.9 + ...``."""
    lines = []
    for label, times in results.items():
        parts = " + ".join(f"{name} {times[name]:.2f}" for name in PHASES)
        lines.append(f"{label}: {times['total']:.2f} s = {parts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--run-child"]:
        _run_child(argv[1], argv[2], argv[3], argv[4:])
        return
    if argv[:1] == ["--child"]:
        _child(argv[1], argv[2], int(argv[3]), int(argv[4]), json.loads(argv[5]) if len(argv) > 5 else {})
        return
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_workload_arguments(parser)
    parser.add_argument("--set", nargs="*", default=[], help="model keys, e.g. architecture/n_layers=24")
    parser.add_argument("--run", action="store_true", help="time a real 1-step `theseus run` instead (gpt by default)")
    parser.add_argument("--job", default="train/pretrain")
    args = parser.parse_args(argv)
    if args.run:
        given = [f"architecture/preset={args.preset}", *args.set]
        print(f"1-step `theseus run {args.job}` ({' '.join(given)}), seconds")
        print(format_run(run_breakdown(args.job, given)))
        return
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        overrides[key] = json.loads(value) if value[:1].isdigit() or value in ("true", "false") else value
    print(f"start-up breakdown ({args.preset}, {args.batch}x{args.seq}), seconds")
    print(format_breakdown(startup_breakdown(args.preset, args.batch, args.seq, overrides=overrides)))


if __name__ == "__main__":
    main()
