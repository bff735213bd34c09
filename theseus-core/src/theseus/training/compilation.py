"""The persistent XLA compilation cache a run uses (a process-wide JAX setting)."""

from __future__ import annotations

import os
from pathlib import Path

import jax

#: Programs that compile faster than this are not written to the persistent cache. JAX's default
#: (1 s) leaves a small model's start-up uncached: its state initialisation, validation and
#: sampling programs each compile in well under a second, yet together they cost seconds.
CACHE_MIN_COMPILE_SECONDS = 0.0


def enable_compilation_cache(directory: Path) -> None:
    """Persist compiled XLA programs in ``directory`` unless a cache is already configured
    (``JAX_COMPILATION_CACHE_DIR`` or an earlier call); small programs are cached too."""
    configured = getattr(jax.config, "jax_compilation_cache_dir", None) or os.environ.get("JAX_COMPILATION_CACHE_DIR")
    if not configured:
        directory.mkdir(parents=True, exist_ok=True)
        jax.config.update("jax_compilation_cache_dir", str(directory))
    if getattr(jax.config, "jax_persistent_cache_min_compile_time_secs", 0.0) > CACHE_MIN_COMPILE_SECONDS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)
