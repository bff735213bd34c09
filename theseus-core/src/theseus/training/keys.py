"""The trainer's random keys, computed on the host without compiling anything.

``jax.random.PRNGKey``, ``split`` and ``fold_in`` each compile a small XLA program the first time
they run eagerly (0.2-0.7 s apiece on 2 CPU cores), and the first two run before the persistent
compilation cache is on. For JAX's default generator (raw ``threefry2x32`` keys) the same numbers
come from the Threefry-2x32 hash written in numpy; any other generator goes through ``jax.random``.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _flag(name: str) -> Any:
    return getattr(jax.config, name)


def host_keys_supported() -> bool:
    """Whether keys here equal ``jax.random``'s: the default raw threefry keys."""
    return str(_flag("jax_default_prng_impl")) == "threefry2x32" and not _flag("jax_enable_custom_prng")


def threefry2x32(key: np.ndarray, x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The Threefry-2x32 hash (20 rounds) of the counter pairs ``(x0, x1)`` under ``key``, as in JAX."""
    k0, k1 = (np.uint32(v) for v in key)
    ks = [k0, k1, k0 ^ k1 ^ _PARITY]
    x0, x1 = x0.astype(np.uint32) + ks[0], x1.astype(np.uint32) + ks[1]
    with np.errstate(over="ignore"):
        for block in range(5):
            for r in _ROTATIONS[block % 2]:
                x0 = x0 + x1
                x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
                x1 = x0 ^ x1
            x0 = x0 + ks[(block + 1) % 3]
            x1 = x1 + ks[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def seed_key(seed: int) -> np.ndarray:
    """``jax.random.PRNGKey(seed)`` of a seed in ``[0, 2**31)`` as a host array: ``[0, seed]``."""
    if not 0 <= int(seed) < 2**31:
        raise ValueError(f"seed {seed} is outside [0, 2**31)")
    return np.array([0, int(seed)], np.uint32)


def split(key: np.ndarray, num: int = 2) -> np.ndarray:
    """``jax.random.split(key, num)`` of a raw threefry key, as a ``[num, 2]`` host array."""
    if _flag("jax_threefry_partitionable"):
        bits = threefry2x32(key, np.zeros(num, np.uint32), np.arange(num, dtype=np.uint32))
        return np.stack(bits, axis=-1)
    counts = np.arange(2 * num, dtype=np.uint32)
    bits = threefry2x32(key, counts[:num], counts[num:])
    return np.concatenate(bits).reshape(num, 2)


def fold_in(key: np.ndarray, data: int) -> np.ndarray:
    """``jax.random.fold_in(key, data)`` of a raw threefry key, as a host array."""
    bits = threefry2x32(key, np.zeros(1, np.uint32), np.array([int(data)], np.uint32))
    return np.concatenate(bits)


def step_key(key: Any, step: int) -> Any:
    """``jax.random.fold_in(key, step)``; on the host for a raw threefry key."""
    if not host_keys_supported() or jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.fold_in(key, step)
    return jax.device_put(fold_in(np.asarray(key), step))


def root_keys(seed: int) -> tuple[Any, Any]:
    """``(init_key, dropout_key)`` = ``jax.random.split(jax.random.PRNGKey(seed))``."""
    if not (host_keys_supported() and 0 <= int(seed) < 2**31):
        init_key, dropout_key = jax.random.split(jax.random.PRNGKey(seed))
        return init_key, dropout_key
    init_key, dropout_key = split(seed_key(seed))
    return jax.device_put(init_key), jax.device_put(dropout_key)
