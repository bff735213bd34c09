"""``model/remat=auto``: the fastest remat policy and micro batch whose compiled training step fits the device.

Before the first update the trainer compiles its step for candidates in order of speed, each applied by
configuring the trainer with the candidate's values (the model reads ``model/remat`` like any other key):
remat ``none``, ``dots`` and ``full`` at the configured micro batch, then ``full`` with the micro batch
halved while it still splits over the data-parallel devices. A candidate fits when its compiled peak per
device (arguments, outputs not aliased to them, and temporaries: the plan's
:attr:`~theseus.training.compiled.CompiledStep.total_bytes`) is at most :data:`USABLE` of the device's memory,
``training/memory_limit_gb`` or else the ``bytes_limit`` the device reports. A device that reports none
(a CPU) keeps ``none``. The first candidate that fits is kept and its compiled step is the one the run
calls; when none fits, one :class:`~theseus.errors.ResourceError` names what to lower.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from theseus.base.failures import MICRO_KEY, REMAT_KEY
from theseus.errors import ConfigError, ResourceError
from theseus.training.protocol import Trainer

AUTO = "auto"
LIMIT_KEY = "training/memory_limit_gb"
#: Remat policies tried at the configured micro batch, fastest first; the last is then tried with fewer rows.
REMAT_LADDER = ("none", "dots", "full")
#: The share of the device's memory a chosen step may take; the rest is left for what lives beside the
#: step (the next batch, validation, the runtime's own buffers) and for fragmentation.
USABLE = 0.9
GB = 1e9


@dataclass(frozen=True)
class Candidate:
    """One setting tried: a remat policy and the global rows of a micro batch."""

    remat: str
    micro_batch_size: int

    def values(self) -> dict[str, Any]:
        """The configuration values that apply it."""
        return {REMAT_KEY: self.remat, MICRO_KEY: self.micro_batch_size}

    def __str__(self) -> str:
        return f"remat={self.remat}, micro_batch_size={self.micro_batch_size}"


@dataclass(frozen=True)
class Trial:
    """A compiled candidate: its peak bytes per device, and whether the compiler itself ran out of memory
    (then the peak is what it said it needed, None when it said no amount)."""

    candidate: Candidate
    peak_bytes: int | None
    refused: bool = False


@dataclass(frozen=True)
class Budget:
    """The bytes per device a step may take (None: no limit is known) and where they come from."""

    bytes: int | None
    source: str

    def __str__(self) -> str:
        if self.bytes is None:
            return self.source
        return f"{size(self.bytes)} usable ({USABLE:.0%} of {self.source})"


@dataclass(frozen=True)
class Choice:
    """What ``auto`` chose, from which trials, within which budget."""

    candidate: Candidate
    trials: tuple[Trial, ...]
    budget: Budget

    def line(self) -> str:
        """The one line a run prints about it."""
        head = f"{REMAT_KEY}={AUTO}: chose {self.candidate}"
        if not self.trials:
            return f"{head}: {self.budget}"
        chosen, tried = self.trials[-1], self.trials[:-1]
        return "; ".join([f"{head}: peak {size(chosen.peak_bytes or 0)} of {self.budget}", *map(_needs, tried)])


def requested(config: Mapping[str, Any]) -> bool:
    """Whether the configuration asks for ``model/remat=auto``."""
    return config.get(REMAT_KEY) == AUTO


def size(value: float) -> str:
    """Bytes to three digits in the largest decimal unit they reach (``11.2 GB``, ``1.55 MB``, ``630 kB``)."""
    for unit, scale in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def _needs(trial: Trial) -> str:
    amount = "more than the compiler had" if trial.peak_bytes is None else size(trial.peak_bytes)
    return f"{trial.candidate.remat} at {trial.candidate.micro_batch_size} rows needs {amount}"


def candidates(batch_size: int, micro_batch_size: int, splits: Callable[[int], bool]) -> list[Candidate]:
    """The settings to try, fastest first: every policy of :data:`REMAT_LADDER` at the configured micro batch
    (0: the whole batch), then the last with the micro batch halved while ``splits(rows)`` allows it."""
    rows = micro_batch_size or batch_size
    found = [Candidate(policy, rows) for policy in REMAT_LADDER]
    while rows % 2 == 0 and splits(rows // 2):
        rows //= 2
        found.append(Candidate(REMAT_LADDER[-1], rows))
    return found


def device_limit(device: Any) -> int | None:
    """The bytes the device's allocator may use (``memory_stats()["bytes_limit"]``), or None where it
    reports none (CPU, a compile-only topology)."""
    try:
        stats = device.memory_stats()
    except (AttributeError, NotImplementedError, RuntimeError):
        return None
    limit = (stats or {}).get("bytes_limit")
    return int(limit) if limit else None


def budget(limit_gb: float, device: Any) -> Budget:
    """:data:`USABLE` of ``limit_gb`` (``training/memory_limit_gb``), else of the device's own limit."""
    if limit_gb > 0:
        return Budget(int(limit_gb * GB * USABLE), f"{LIMIT_KEY}={limit_gb:g}")
    limit = device_limit(device)
    if limit is None:
        platform = getattr(device, "platform", "this")
        return Budget(None, f"the {platform} device reports no memory limit; set {LIMIT_KEY} to fit one")
    return Budget(int(limit * USABLE), f"the device's {size(limit)}")


def measure(trainer: Trainer, candidate: Candidate) -> Trial:
    """Compile the trainer's step as it is configured now (the compiled program stays cached for the run);
    a step the compiler refuses for memory is a trial that did not fit, with the bytes it said it needed."""
    from theseus.training.compiled import StepTooLarge, compile_train_step

    try:
        step = compile_train_step(trainer)
    except StepTooLarge as refused:
        return Trial(candidate, refused.needed_bytes, refused=True)
    return Trial(candidate, step.total_bytes)


def state_bytes(trainer: Trainer) -> int:
    """Bytes per device of the parameters and optimizer state, from shapes and shardings alone."""
    from theseus.training.compiled import held_bytes

    abstract, shardings = trainer.abstract_state, trainer.state_shardings
    return held_bytes(abstract.params, shardings.params) + held_bytes(abstract.opt_state, shardings.opt_state)


def _local_device(trainer: Trainer) -> Any:
    """A device of the mesh that this process drives (another host's reports no memory here)."""
    import jax

    devices = list(trainer.sharding.mesh.devices.flat)
    here = jax.process_index()
    return next((device for device in devices if device.process_index == here), devices[0])


def fit(trainer: Trainer) -> Choice:
    """Configure ``trainer`` with the first candidate whose step fits, compiling each in turn."""
    from theseus.training.assembly import batch_geometry

    batch = int(trainer.args.batch_size)

    def splits(rows: int) -> bool:
        try:
            batch_geometry(batch, rows, trainer.sharding)
        except ConfigError:
            return False
        return True

    limit_gb = float(trainer.context.config.get(LIMIT_KEY, 0.0) or 0.0)
    room = budget(limit_gb, _local_device(trainer))
    ladder = candidates(batch, int(trainer.args.micro_batch_size or 0), splits)
    if room.bytes is None:
        trainer.reconfigure(ladder[0].values())
        return Choice(ladder[0], (), room)
    state = state_bytes(trainer)
    if state > room.bytes:  # no remat or micro batch shrinks the state: fail before compiling anything
        raise ResourceError(
            f"{REMAT_KEY}={AUTO}: no setting fits in {room}: the parameters and optimizer state alone take "
            f"{size(state)}; train a smaller model, or split it over more devices (mesh/layout=fsdp)"
        )
    trials: list[Trial] = []
    for candidate in ladder:
        trainer.reconfigure(candidate.values())
        trial = measure(trainer, candidate)
        trials.append(trial)
        if not trial.refused and trial.peak_bytes is not None and trial.peak_bytes <= room.bytes:
            return Choice(candidate, tuple(trials), room)
    raise ResourceError(nothing_fits(trials[-1], room, trainer))


def nothing_fits(smallest: Trial, room: Budget, trainer: Trainer) -> str:
    """The one line for a run whose smallest candidate does not fit either: the row length is left to lower,
    and the batch when its micro batches could not be halved down to one row per device."""
    needs = "more than the compiler had" if smallest.peak_bytes is None else size(smallest.peak_bytes)
    rows = smallest.candidate.micro_batch_size
    if rows > trainer.sharding.data_size:
        lower = (
            f"training/sequence_length={trainer.sequence_length} or training/batch_size={trainer.args.batch_size} "
            f"(its micro batches of {rows} rows do not halve)"
        )
    else:
        lower = f"training/sequence_length={trainer.sequence_length} (the micro batch is one row per device)"
    return (
        f"{REMAT_KEY}={AUTO}: no setting fits in {room}: the smallest ({smallest.candidate}) needs {needs}; "
        f"lower {lower}, or train a smaller model"
    )


__all__ = ["Budget", "Candidate", "Choice", "Trial", "budget", "candidates", "fit", "requested"]
