"""One process of the two-process checkpoint verification test (``python verify_processes.py PORT INDEX DIR``).

The two processes (one CPU device each, joined by ``jax.distributed``) save a small sharded state as
steps 1, 2 and 3; process 0 then damages step 3 in a file of process 0's share and step 2 in a file of
process 1's share (bytes flipped, sizes kept). Both restore the newest intact checkpoint with
``CheckpointStore.restore_latest`` while every file a process checksums is recorded, and print one
JSON line: the step restored, the warnings, and the files each step's verification read.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def main() -> None:
    port, index, directory = sys.argv[1], int(sys.argv[2]), Path(sys.argv[3])
    from theseus.base.distributed import initialize

    initialize(f"127.0.0.1:{port}", 2, index, timeout=120)
    import jax
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from theseus.checkpoint import CheckpointStore, integrity
    from theseus.checkpoint.store import STATE

    mesh = Mesh(np.array(jax.devices()), ("d",))
    rows, replicated = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())

    def array(shape: tuple[int, ...], sharding: NamedSharding, seed: int) -> jax.Array:
        values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
        return jax.make_array_from_callback(shape, sharding, lambda where: values[where])

    state = {"params": {"w": array((64, 512), rows, 0), "b": array((64,), rows, 1)}, "step": array((), replicated, 2)}
    store = CheckpointStore(directory, keep=0, async_save=False)
    for step in (1, 2, 3):
        store.save(step, state, {"step": step})
    store.wait()
    multihost_utils.sync_global_devices("saved")
    if index == 0:
        for step, owner in ((3, 0), (2, 1)):
            folder = directory / str(step) / STATE
            files = integrity.read_manifest(folder)
            assert files is not None
            share = integrity.shares(files, 2)[owner]
            flip(folder / max(share, key=lambda name: files[name][0]))
    multihost_utils.sync_global_devices("damaged")

    read: dict[str, list[str]] = {}
    checksum = integrity.file_checksum

    def recording(path: Path) -> str:
        step_dir = path.relative_to(directory).parts[0]
        read.setdefault(step_dir, []).append(path.relative_to(directory / step_dir / STATE).as_posix())
        return checksum(path)

    integrity.file_checksum = recording  # type: ignore[assignment]
    warnings: list[str] = []
    abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding), state)
    restored = store.restore_latest(abstract, warn=warnings.append)
    store.close()
    assert restored is not None
    step, tree, _meta = restored
    result: dict[str, Any] = {
        "process": index,
        "step": step,
        "warnings": warnings,
        "read": read,
        "equal": bool(
            np.array_equal(
                np.asarray(tree["params"]["w"].addressable_data(0)), state["params"]["w"].addressable_data(0)
            )
        ),
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
