"""What checking a checkpoint's checksums costs on restore (``theseus.checkpoint.integrity``).

A GPT preset's train state (float32 parameters and AdamW's two moments, as ``theseus run`` saves it)
is saved once with ``CheckpointStore``; then, in rounds rotated side by side, the restore with its
verification, the same restore with verification switched off, and the verification alone (reading
every file of the state and its CRC-32) are timed. Files are in the page cache after the first round,
so this is the CPU cost of the check; a cold read adds one pass over the files at the disk's speed.

Run ``python benchmarks/checkpoint_verify.py`` (gpt2-124m, about 1.5 GB saved; ``--preset tiny`` for a
smoke check).

``--processes 2`` compares one process verifying a checkpoint alone with two processes splitting it
(:mod:`theseus.checkpoint.agreement`): the script starts two processes of itself joined by
``jax.distributed`` on localhost (one CPU device each), which save a state of ``--megabytes`` MB of
random float32 arrays sharded by rows between them (each process writes its half), then, in rotated
rounds after a warm-up, time process 0 verifying every file alone (the other waits), both verifying
their shares together with the exchange of verdicts (what a restore does), and the shares alone, and
count the bytes each reads. Wall and CPU seconds are both reported: on a machine whose cores are busy
with other work, the processes do not run side by side and only the CPU seconds show the split.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, load_average, machine_line, today
from benchmarks.workload import Workload


def train_state(preset: str) -> tuple[dict[str, Any], int]:
    """The preset's float32 train state ``{params, opt_state, step}`` after one AdamW update (so that the
    moments are not zeros, which compress), on the host device, and its bytes."""
    import jax
    import jax.numpy as jnp
    import optax

    work = Workload.create(preset, batch=1, seq=64)
    params = jax.jit(work.model.init)(jax.random.key(0), jnp.zeros((1, 8), jnp.int32))["params"]
    optimizer = optax.adamw(1e-3)
    # moments of a real update, not zeros (compiled whole: eagerly, each operation is a program of its own)
    opt_state = jax.jit(lambda p: optimizer.update(p, optimizer.init(p), p)[1])(params)
    state = {"params": params, "opt_state": opt_state, "step": jnp.asarray(1, jnp.int32)}
    size = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    return state, size


def measure(preset: str, rounds: int, directory: Path) -> dict[str, Any]:
    """Seconds per round of each way to read the saved state, and the state's size."""
    import jax

    from theseus.checkpoint import CheckpointStore
    from theseus.checkpoint.integrity import damage

    state, size = train_state(preset)
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    store = CheckpointStore(directory, async_save=False)
    try:
        started = time.perf_counter()
        store.save(1, state, {"step": 1})
        store.wait()
        save_seconds = time.perf_counter() - started
        del state
        state_dir = directory / "1" / "state"
        verify = store.verify

        def unchecked() -> None:
            store.verify = lambda step: None  # type: ignore[method-assign]
            try:
                jax.block_until_ready(store.restore(1, abstract)[0])
            finally:
                store.verify = verify  # type: ignore[method-assign]

        ways: dict[str, Callable[[], Any]] = {
            "restore (verified)": lambda: jax.block_until_ready(store.restore(1, abstract)[0]),
            "restore (unverified)": unchecked,
            "verification alone": lambda: damage(state_dir),
        }
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for index in range(rounds + 1):  # the first round warms the page cache and is not kept
            for name in names[index % len(names) :] + names[: index % len(names)]:
                begun = time.perf_counter()
                ways[name]()
                if index:
                    seconds[name].append(time.perf_counter() - begun)
    finally:
        store.close()
    saved = sum(p.stat().st_size for p in state_dir.rglob("*") if p.is_file())
    return {"bytes": size, "saved_bytes": saved, "save_seconds": save_seconds, "seconds": seconds}


def report(preset: str, result: dict[str, Any]) -> str:
    median = {name: statistics.median(times) for name, times in result["seconds"].items()}
    unverified = median["restore (unverified)"]
    lines = [
        f"checkpoint verification, {preset}: {result['saved_bytes'] / 1e9:.2f} GB saved "
        f"(state {result['bytes'] / 1e9:.2f} GB, save {result['save_seconds']:.1f} s); {machine_line()}; {today()}",
        "| Read | Median s | ÷ unverified restore |",
        "|---|---|---|",
    ]
    for name, value in median.items():
        lines.append(f"| {name} | {value:.2f} | {value / unverified:.2f} |")
    verify = median["verification alone"]
    lines.append(f"verification reads {result['saved_bytes'] / verify / 1e9:.2f} GB/s (warm page cache)")
    return "\n".join(lines)


def sharded_state(megabytes: int, arrays: int = 16) -> dict[str, Any]:
    """``arrays`` random float32 arrays of ``megabytes`` MB in all, sharded by rows over every process's
    devices (each process makes only its rows), and a replicated step."""
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()), ("rows",))
    rows = 256 * jax.device_count()
    cols = max(1, megabytes * 10**6 // (4 * rows * arrays))

    def array(seed: int) -> jax.Array:
        def fill(where: Any) -> np.ndarray:
            start = where[0].start or 0
            rng = np.random.default_rng([seed, start])
            return rng.standard_normal((len(range(rows)[where[0]]), cols), dtype=np.float32)

        return jax.make_array_from_callback((rows, cols), NamedSharding(mesh, P("rows")), fill)

    step = jax.make_array_from_callback((), NamedSharding(mesh, P()), lambda _: np.asarray(1, np.int32))
    return {"params": {f"w{index:02d}": array(index) for index in range(arrays)}, "step": step}


def measure_processes(directory: Path, megabytes: int, rounds: int) -> dict[str, Any]:
    """One process of ``--processes``: save the sharded state, then time verification by this process
    alone (process 0; the others wait) and by every process on its share."""
    import jax
    from jax.experimental import multihost_utils

    from theseus.checkpoint import CheckpointStore
    from theseus.checkpoint.agreement import agreed_verification
    from theseus.checkpoint.integrity import verify_share

    state = sharded_state(megabytes)
    store = CheckpointStore(directory, async_save=False)
    started = time.perf_counter()
    store.save(1, state, {"step": 1})
    store.close()
    save_seconds = time.perf_counter() - started
    del state
    folder = directory / "1" / "state"
    index, count = jax.process_index(), jax.process_count()

    def alone() -> Any:
        return verify_share(folder) if index == 0 else None

    ways: dict[str, Callable[[], Any]] = {
        "alone": alone,
        "split": lambda: agreed_verification(folder),  # its share, then the exchange of verdicts
        "share": lambda: verify_share(folder, index, count),  # its share, no exchange
    }
    seconds: dict[str, list[float]] = {name: [] for name in ways}
    cpu: dict[str, list[float]] = {name: [] for name in ways}
    read: dict[str, int] = {}
    names = list(ways)
    for round_ in range(rounds + 1):  # the first round warms the page cache and is not kept
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            multihost_utils.sync_global_devices(f"verify {name} {round_}")
            begun, begun_cpu = time.perf_counter(), time.process_time()
            verdict = ways[name]()
            elapsed, elapsed_cpu = time.perf_counter() - begun, time.process_time() - begun_cpu
            if verdict is not None:
                assert verdict.problem is None, verdict.problem
                read[name] = verdict.bytes_read
                if round_:
                    seconds[name].append(elapsed)
                    cpu[name].append(elapsed_cpu)
    saved = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    return {
        "process": index,
        "processes": count,
        "saved_bytes": saved,
        "save_seconds": save_seconds,
        "seconds": seconds,
        "cpu_seconds": cpu,
        "bytes_read": read,
        "load": load_average(),
    }


def launch(processes: int, megabytes: int, rounds: int) -> list[dict[str, Any]]:
    """Run ``measure_processes`` as ``processes`` processes of this script joined on localhost."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # one host device each, added to the caller's XLA flags (its compiler settings kept; the last count wins)
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=1".strip()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags}
    with tempfile.TemporaryDirectory(prefix="theseus-verify-") as scratch:
        common = ["--megabytes", str(megabytes), "--rounds", str(rounds), "--directory", scratch]
        common += ["--coordinator", f"127.0.0.1:{port}", "--processes", str(processes)]
        children = [
            subprocess.Popen(
                [sys.executable, "-m", "benchmarks.checkpoint_verify", *common, "--process-id", str(index)],
                stdout=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
            )
            for index in range(processes)
        ]
        outputs = [child.communicate()[0] for child in children]
    if any(child.returncode for child in children):
        raise SystemExit(f"a benchmark process failed (exit codes {[child.returncode for child in children]})")
    return [json.loads(out.strip().splitlines()[-1]) for out in outputs]


def report_processes(results: list[dict[str, Any]]) -> str:
    """The table: wall and CPU seconds (medians) and MB read, per process, against one process alone."""
    first = results[0]
    alone = statistics.median(first["seconds"]["alone"])
    alone_cpu = statistics.median(first["cpu_seconds"]["alone"])
    lines = [
        f"checkpoint verification, {len(results)} processes: {first['saved_bytes'] / 1e6:.0f} MB saved "
        f"(save {first['save_seconds']:.1f} s); {machine_line()}, load average {first['load'] or 0:.1f}; {today()}",
        "| Verification | Median s | ÷ alone | Median CPU s | ÷ alone | MB read |",
        "|---|---|---|---|---|---|",
        f"| one process, every file | {alone:.3f} | 1.00 | {alone_cpu:.3f} | 1.00 | "
        f"{first['bytes_read']['alone'] / 1e6:.0f} |",
    ]
    for way, what in (("split", "its share, verdicts exchanged"), ("share", "its share alone")):
        for result in results:
            split = statistics.median(result["seconds"][way])
            split_cpu = statistics.median(result["cpu_seconds"][way])
            lines.append(
                f"| process {result['process']} of {len(results)}, {what} | {split:.3f} | {split / alone:.2f} | "
                f"{split_cpu:.3f} | {split_cpu / alone_cpu:.2f} | {result['bytes_read'][way] / 1e6:.0f} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-124m")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--processes", type=int, default=1, help="compare this many processes with one")
    parser.add_argument("--megabytes", type=int, default=400, help="the state's size with --processes")
    parser.add_argument("--process-id", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)
    parser.add_argument("--directory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.process_id is not None:  # one of the processes ``--processes`` starts
        from theseus.base.distributed import initialize

        initialize(args.coordinator, args.processes, args.process_id)
        result = measure_processes(Path(args.directory) / "checkpoints", args.megabytes, args.rounds)
        print(json.dumps(result), flush=True)
    elif args.processes > 1:
        print(report_processes(launch(args.processes, args.megabytes, args.rounds)))
    else:
        with tempfile.TemporaryDirectory(prefix="theseus-verify-") as scratch:
            print(report(args.preset, measure(args.preset, args.rounds, Path(scratch) / "checkpoints")))


if __name__ == "__main__":
    main()
