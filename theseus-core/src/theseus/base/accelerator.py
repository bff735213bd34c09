"""Which accelerator a traced program targets: the mesh's devices, not the host's backend.

Model code chooses kernels by accelerator (cuDNN attention on NVIDIA GPUs, the MoE dispatch, the
activation dtype). Asking ``jax.default_backend()`` would answer for the machine that traces, which
is wrong when a CPU machine compiles for an H100 (``theseus plan``). ``TrainerSharding.context()``
declares the mesh's devices here (:func:`targeting`), and model code asks :func:`accelerator`.

:func:`quiet_absent_accelerators` keeps the accelerator plugins' start-up failures off a machine
that has none of their devices. No jax import at module level.
"""

from __future__ import annotations

import contextvars
import glob
import importlib.util
import os
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from theseus.base.scoped import bound


@dataclass(frozen=True)
class Accelerator:
    """The platform (``cpu`` | ``gpu`` | ``tpu``) and device kind a program is compiled for."""

    platform: str
    kind: str = ""

    @property
    def half_precision(self) -> bool:
        """Whether activations default to bfloat16 here (GPUs and TPUs; float32 on CPUs)."""
        return self.platform in ("gpu", "tpu")

    @property
    def compute_capability(self) -> tuple[int, int]:
        """An NVIDIA GPU's compute capability from its kind (``(0, 0)`` when unknown or not NVIDIA)."""
        if self.platform != "gpu":
            return (0, 0)
        kind = self.kind.lower()
        for names, capability in _CAPABILITIES:
            if any(name in kind for name in names):
                return capability
        return (0, 0)


#: Compute capability by device-kind substring (lower case), newest first.
_CAPABILITIES: tuple[tuple[tuple[str, ...], tuple[int, int]], ...] = (
    (("b200", "b100", "gb200"), (10, 0)),
    (("h100", "h200", "gh200", "h800"), (9, 0)),
    (("l40", "l4", "rtx 40", "ada"), (8, 9)),
    (("a10", "rtx 30", "a40"), (8, 6)),
    (("a100", "a800", "a30"), (8, 0)),
    (("v100",), (7, 0)),
)

_TARGET: contextvars.ContextVar[Accelerator | None] = contextvars.ContextVar("theseus_accelerator", default=None)


def of_devices(devices: Sequence[Any]) -> Accelerator:
    """The accelerator of a list of devices (the first one's; a mesh holds one kind)."""
    first = devices[0]
    return Accelerator(str(first.platform), str(getattr(first, "device_kind", "")))


def accelerator() -> Accelerator:
    """The accelerator the program being traced targets: the mesh's (:func:`targeting`), else jax's
    default device."""
    declared = _TARGET.get()
    if declared is not None:
        return declared
    import jax

    return of_devices(jax.devices())


def targeting(target: Accelerator) -> AbstractContextManager[Accelerator | None]:
    """Trace the enclosed code for ``target``."""
    return bound(_TARGET, target)


#: Device files that show an accelerator of each plugin's platform, and the module the plugin installs.
_PLUGINS = {
    "cuda": ("jax_plugins.xla_cuda12", ("/dev/nvidiactl", "/dev/nvidia[0-9]*")),
    "tpu": ("libtpu", ("/dev/accel[0-9]*", "/dev/vfio/[0-9]*")),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def quiet_absent_accelerators() -> None:
    """Set ``JAX_PLATFORMS`` when an accelerator plugin is installed but its devices are absent.

    Without it, jax on such a machine lets the plugin fail at start-up (the CUDA plugin prints a
    ``cuInit`` traceback) before falling back to the CPU. A ``JAX_PLATFORMS`` the user set is kept."""
    if os.environ.get("JAX_PLATFORMS"):
        return
    present: list[str] = []
    absent: list[str] = []
    for platform, (module, device_files) in _PLUGINS.items():
        if not _installed(module):
            continue
        found = any(glob.glob(pattern) for pattern in device_files)
        (present if found else absent).append(platform)
    if absent:
        os.environ["JAX_PLATFORMS"] = ",".join([*present, "cpu"])


__all__ = ["Accelerator", "accelerator", "of_devices", "quiet_absent_accelerators", "targeting"]
