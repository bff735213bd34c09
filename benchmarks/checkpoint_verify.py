"""What checking a checkpoint's checksums costs on restore (``theseus.checkpoint.integrity``).

A GPT preset's train state (float32 parameters and AdamW's two moments, as ``theseus run`` saves it)
is saved once with ``CheckpointStore``; then, in rounds rotated side by side, the restore with its
verification, the same restore with verification switched off, and the verification alone (reading
every file of the state and its CRC-32) are timed. Files are in the page cache after the first round,
so this is the CPU cost of the check; a cold read adds one pass over the files at the disk's speed.

Run ``python benchmarks/checkpoint_verify.py`` (gpt2-124m, about 1.5 GB saved; ``--preset tiny`` for a
smoke check).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import machine_line, today
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="gpt2-124m")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="theseus-verify-") as scratch:
        print(report(args.preset, measure(args.preset, args.rounds, Path(scratch) / "checkpoints")))


if __name__ == "__main__":
    main()
