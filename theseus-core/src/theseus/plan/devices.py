"""Devices of a target without the hardware: XLA's deviceless topologies for CUDA and TPU.

jax must run on the CPU (``JAX_PLATFORMS=cpu``): the accelerator plugins are used only as compilers.
Their start-up chatter on a machine without the hardware (the CUDA plugin's ``cuInit`` notice,
libtpu's host-discovery warnings) goes to a log that ``--verbose`` shows, not to the terminal.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import tempfile
from collections.abc import Iterator
from typing import Any

from theseus.errors import ConfigError
from theseus.plan.targets import Target, gpu_target_config

#: The extra that brings each platform's compiler, and the module that shows it is installed.
EXTRAS = {"cuda": ("plan-cuda", "jax_plugins.xla_cuda12"), "tpu": ("plan-tpu", "libtpu")}

#: XLA:GPU asks the CUDA runtime whether CUB's radix sort fits a large sort while compiling it; without
#: a GPU that query fails, so a compile without one sorts with XLA's own kernel (``jnp.argsort`` of a
#: mixture layer's 65,536 token copies needs this).
DEVICELESS_XLA_FLAGS = "--xla_gpu_enable_cub_radix_sort=false"

#: With the persistent compilation cache on (``training/compilation_cache``), XLA:GPU also keeps each
#: compiled kernel (a ``ptxas`` run per kernel, over a hundred per training step) in it, and a later
#: compile of the same fusion takes it from there: most of a model's kernels repeat across layouts and
#: jobs (a tiny Llama's 8 H100 cases: 43 -> 34 CPU-s cold, 16 with the kernels cached). jax leaves it
#: off by default (kernel names shared with its own cache, jax-ml/jax#22899; a reused kernel can keep
#: another launch's dimensions, openxla/xla#33220), which matters to programs that run: these are only
#: measured, and the reports came out the same with it as without.
XLA_CACHES = "all"

#: The chatter of the last topology built (shown by ``theseus --verbose plan``).
startup_log: list[str] = []


def require_compiler(platform: str) -> None:
    """ConfigError naming the ``pip install`` when ``platform``'s compiler is not installed."""
    extra, module = EXTRAS[platform]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        raise ConfigError(
            f"compiling for {platform.upper()} needs its compiler; install it with pip install 'theseus-core[{extra}]'"
        )


def start_cpu_backend() -> None:
    """Start jax on the CPU only: the accelerator plugins then only compile (keeping their kernels in
    the persistent cache, :data:`XLA_CACHES`). Their start-up chatter goes to :data:`startup_log`."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {DEVICELESS_XLA_FLAGS}".strip()
    with captured_stderr() as chatter:
        import jax

        jax.config.update("jax_persistent_cache_enable_xla_caches", XLA_CACHES)
        jax.devices()
    startup_log.extend(chatter)


@contextlib.contextmanager
def captured_stderr() -> Iterator[list[str]]:
    """Collect what native code writes to file descriptor 2 (the plugins log there directly)."""
    lines: list[str] = []
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines.extend(sink.read().decode("utf-8", "replace").splitlines())


def tpu_options(target: Target) -> dict[str, Any]:
    """What libtpu needs besides the topology's name: one chip is a host of one (its default host of
    2x2x1 chips divides no smaller slice)."""
    return {"chips_per_host_bounds": [1, 1, 1]} if target.devices == 1 else {}


@functools.cache
def target_devices(target: Target) -> tuple[Any, ...]:
    """The devices of ``target``, one per chip, ordered as the topology numbers them."""
    require_compiler(target.platform)
    import jax
    from jax.experimental import topologies

    if jax.default_backend() != "cpu":
        raise ConfigError(
            f"theseus plan compiles on the CPU, but jax started on {jax.default_backend()!r}; "
            "run it with JAX_PLATFORMS=cpu"
        )
    # libtpu locks the host's TPUs for one process; compiling needs none, and tests compile in several.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    with captured_stderr() as chatter:
        try:
            if target.platform == "cuda":
                description = topologies.get_topology_desc(
                    platform="cuda", target_config=gpu_target_config(target.chip), topology=target.topology
                )
            else:
                description = topologies.get_topology_desc(
                    topology_name=f"{target.kind}:{target.topology}", platform="tpu", **tpu_options(target)
                )
        except Exception as exc:  # the plugin's refusal, in one line
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"cannot describe --target {target.spec!r} to the {target.platform} compiler: {reason}"
            ) from exc
    startup_log.extend(chatter)
    devices = tuple(description.devices)
    if len(devices) != target.devices:
        raise ConfigError(f"--target {target.spec!r} gave {len(devices)} devices, expected {target.devices}")
    return devices


__all__ = ["EXTRAS", "captured_stderr", "require_compiler", "start_cpu_backend", "target_devices", "tpu_options"]
