"""``model/remat=auto``: the fastest remat policy and micro batch whose compiled training step fits the device.

Before the first update the trainer compiles its step for candidates in order of speed, each applied by
configuring the trainer with the candidate's values (the model reads ``model/remat`` like any other key):
remat ``none`` and ``dots`` at the configured micro batch, ``dots`` at half of it (two micro batches cost less
than recomputing every layer: the 350M Llama shape at 8 x 2048 on a v5e), then ``full`` at the configured
micro batch and halved while it still splits over the data-parallel devices. A candidate fits when its compiled peak per
device (the compiler's own peak: the plan's :attr:`~theseus.training.compiled.CompiledStep.total_bytes`)
and the next batch fit the device's memory: ``training/memory_limit_gb``, or else the ``bytes_limit`` the
device reports. That is what the chip runs: on a v5e the
scanned gpt2-124m step at a compiler peak of 16.82 GB ran under the 16.91 GB limit (``benchmarks/tpu_fit.py``).
A device that reports no limit (a CPU) keeps ``none`` without compiling. The first candidate that fits is
kept and its compiled step is the one the run calls; when none fits, one
:class:`~theseus.errors.ResourceError` names what to lower. With the optimizer state in host memory
(``optimizer/offload``), the room the chosen step leaves is then given to the state: its first leaves stay on
the device (``optimizer/offload_keep_gb``) and no longer cross the host link each step
(:func:`keep_state_on_device`).
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
KEEP_KEY = "optimizer/offload_keep_gb"
#: The share of the room a fitting step leaves that an offloaded optimizer state may take on the device (the
#: rest is margin for what the compiler lays out differently once the state's leaves move).
KEEP_SHARE = 0.9
#: Room for less than this share of the offloaded state is not worth a second compile.
KEEP_MIN_SHARE = 0.05
#: Remat policies tried at the configured micro batch, fastest first; the last is then tried with fewer rows.
REMAT_LADDER = ("none", "dots", "full")
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
    fits: bool = False


@dataclass(frozen=True)
class Budget:
    """The bytes per device a step may take (None: no limit is known) and where they come from."""

    bytes: int | None
    source: str

    def __str__(self) -> str:
        if self.bytes is None:
            return self.source
        return f"{size(self.bytes)} ({self.source})"


@dataclass(frozen=True)
class Choice:
    """What ``auto`` chose, from which trials, within which budget (and, with an offloaded optimizer state,
    how many of its bytes per device it kept on the device)."""

    candidate: Candidate
    trials: tuple[Trial, ...]
    budget: Budget
    kept_state_bytes: int = 0

    def line(self) -> str:
        """The one line a run prints about it."""
        head = f"{REMAT_KEY}={AUTO}: chose {self.candidate}"
        if not self.trials:
            return f"{head}: {self.budget}"
        chosen, tried = self.trials[-1], self.trials[:-1]
        kept = [f"{size(self.kept_state_bytes)} of the offloaded optimizer state kept on the device"]
        return "; ".join(
            [
                f"{head}: peak {size(chosen.peak_bytes or 0)} of {self.budget}",
                *(kept if self.kept_state_bytes else []),
                *map(needs, tried),
            ]
        )


def requested(config: Mapping[str, Any]) -> bool:
    """Whether the configuration asks for ``model/remat=auto``."""
    return config.get(REMAT_KEY) == AUTO


def size(value: float) -> str:
    """Bytes to three digits in the largest decimal unit they reach (``11.2 GB``, ``1.55 MB``, ``630 kB``)."""
    for unit, scale in (("GB", GB), ("MB", 1e6), ("kB", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} B"


def needs(trial: Trial) -> str:
    """``dots at 8 rows needs 18.2 GB``: what a candidate that did not fit needed."""
    amount = "more than the compiler had" if trial.peak_bytes is None else size(trial.peak_bytes)
    return f"{trial.candidate.remat} at {trial.candidate.micro_batch_size} rows needs {amount}"


def first_pass(rows: int, splits: Callable[[int], bool]) -> list[Candidate]:
    """The settings tried at ``rows`` a micro batch, fastest first: every policy of :data:`REMAT_LADDER`, the
    one before the last also at half the rows where ``splits`` allows it (two micro batches cost less than
    recomputing every layer: the 350M Llama shape at 8 x 2048 on a v5e ran ``dots`` at 4 rows 1.28x faster
    than ``full`` at 8)."""
    found = [Candidate(policy, rows) for policy in REMAT_LADDER]
    if rows % 2 == 0 and splits(rows // 2):
        found.insert(-1, Candidate(REMAT_LADDER[-2], rows // 2))
    return found


def candidates(batch_size: int, micro_batch_size: int, splits: Callable[[int], bool]) -> list[Candidate]:
    """The settings to try, fastest first: :func:`first_pass` at the configured micro batch (0: the whole
    batch), then the last policy with the micro batch halved while ``splits(rows)`` allows it."""
    rows = micro_batch_size or batch_size
    found = first_pass(rows, splits)
    while rows % 2 == 0 and splits(rows // 2):
        rows //= 2
        found.append(Candidate(REMAT_LADDER[-1], rows))
    return found


def splitter(trainer: Trainer) -> Callable[[int], bool]:
    """Whether a micro batch of so many rows splits the trainer's batch over its data-parallel devices."""
    from theseus.training.assembly import batch_geometry

    batch = int(trainer.args.batch_size)

    def splits(rows: int) -> bool:
        try:
            batch_geometry(batch, rows, trainer.sharding)
        except ConfigError:
            return False
        return True

    return splits


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
    """``limit_gb`` (``training/memory_limit_gb``), else the device's own limit."""
    if limit_gb > 0:
        return Budget(int(limit_gb * GB), f"{LIMIT_KEY}={limit_gb:g}")
    limit = device_limit(device)
    if limit is None:
        platform = getattr(device, "platform", "this")
        return Budget(None, f"the {platform} device reports no memory limit; set {LIMIT_KEY} to fit one")
    return Budget(limit, "the device's memory")


def measure(trainer: Trainer, candidate: Candidate, room: Budget) -> tuple[Trial, Any]:
    """Compile the trainer's step as it is configured now (the compiled program stays cached for the run):
    the trial and the :class:`~theseus.training.compiled.CompiledStep`, or, for a step the compiler refuses
    for memory, a trial that did not fit (with the bytes it said it needed) and the refusal
    (:class:`~theseus.training.compiled.StepTooLarge`)."""
    from theseus.training.compiled import StepTooLarge, compile_train_step

    try:
        step = compile_train_step(trainer)
    except StepTooLarge as refused:
        return Trial(candidate, refused.needed_bytes, refused=True), refused
    fits = room.bytes is None or step.fits_in(room.bytes)
    return Trial(candidate, step.total_bytes, fits=fits), step


def climb(trainer: Trainer, ladder: list[Candidate], room: Budget) -> tuple[list[Trial], Any]:
    """Configure and compile ``ladder``'s candidates in order until one fits ``room``: the trials, and the
    last compiled step (or the compiler's refusal of the last); the trainer stays configured with the last."""
    trials: list[Trial] = []
    outcome: Any = None
    for candidate in ladder:
        trainer.reconfigure(candidate.values())
        trial, outcome = measure(trainer, candidate, room)
        trials.append(trial)
        if trial.fits:
            break
    return trials, outcome


def keep_state_on_device(trainer: Trainer, trials: list[Trial], step: Any, room: Budget) -> tuple[Any, int]:
    """With the optimizer state in host memory and ``optimizer/offload_keep_gb`` left to ``auto`` (-1), give
    :data:`KEEP_SHARE` of the room that ``step`` (the compiled step of the last of ``trials``, which fits)
    leaves to the state's first leaves, which then stay on the device, and compile again: the step the trainer
    is left configured with and the bytes it keeps (the last trial becomes that step's). A step that no
    longer fits goes back to the whole state in host memory."""
    config, candidate = trainer.context.config, trials[-1].candidate
    if not config.get("optimizer/offload") or float(config.get(KEEP_KEY, -1.0)) >= 0 or room.bytes is None:
        return step, 0
    spare = int((room.bytes - step.total_bytes - step.batch_bytes) * KEEP_SHARE)
    keep = min(spare, step.offloaded_bytes)
    if keep < KEEP_MIN_SHARE * step.offloaded_bytes or keep <= 0:
        return step, 0
    trainer.reconfigure({KEEP_KEY: keep / GB})
    trial, kept = measure(trainer, candidate, room)
    if trial.fits:
        trials[-1] = trial
        return kept, keep
    trainer.reconfigure({KEEP_KEY: 0.0})
    return measure(trainer, candidate, room)[1], 0


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
    """Configure ``trainer`` with the first candidate whose step fits the device's memory (:func:`budget`),
    compiling each in turn."""
    limit_gb = float(trainer.context.config.get(LIMIT_KEY, 0.0) or 0.0)
    room = budget(limit_gb, _local_device(trainer))
    ladder = candidates(int(trainer.args.batch_size), int(trainer.args.micro_batch_size or 0), splitter(trainer))
    if room.bytes is None:  # nothing to fit: the model reads auto as none, and nothing is set up again
        return Choice(ladder[0], (), room)
    state = state_bytes(trainer)
    if state > room.bytes:  # no remat or micro batch shrinks the state: fail before compiling anything
        raise ResourceError(
            f"{REMAT_KEY}={AUTO}: no setting fits in {room}: the parameters and optimizer state alone take "
            f"{size(state)}; {state_advice(trainer.context.config)}train a smaller model, or split it over more "
            "devices (mesh/layout=fsdp)"
        )
    trials, step = climb(trainer, ladder, room)
    if not trials[-1].fits:
        raise ResourceError(nothing_fits(trials, room, trainer))
    _, kept = keep_state_on_device(trainer, trials, step, room)
    return Choice(trials[-1].candidate, tuple(trials), room, kept)


def nothing_fits(trials: list[Trial], room: Budget, trainer: Trainer) -> str:
    """The one line for a run whose smallest candidate (the last tried) does not fit either, with the one
    that came closest where another did (fewer rows can need more: a micro batch adds a gradient
    accumulator): the row length is left to lower, and the batch when its micro batches could not be
    halved down to one row per device."""
    smallest = trials[-1]
    needed = "more than the compiler had" if smallest.peak_bytes is None else size(smallest.peak_bytes)
    measured = [trial for trial in trials if trial.peak_bytes is not None]
    closest = min(measured, key=lambda trial: trial.peak_bytes or 0, default=smallest)
    if closest is not smallest and closest.peak_bytes is not None:
        needed += f" (the closest, {closest.candidate}, {size(closest.peak_bytes)})"
    rows = smallest.candidate.micro_batch_size
    if rows > trainer.sharding.data_size:
        lower = (
            f"training/sequence_length={trainer.sequence_length} or training/batch_size={trainer.args.batch_size} "
            f"(its micro batches of {rows} rows do not halve)"
        )
    else:
        lower = f"training/sequence_length={trainer.sequence_length} (the micro batch is one row per device)"
    return (
        f"{REMAT_KEY}={AUTO}: no setting fits in {room}: the smallest ({smallest.candidate}) needs {needed}; "
        f"{state_advice(trainer.context.config)}lower {lower}, or train a smaller model"
    )


def state_advice(config: Mapping[str, Any]) -> str:
    """The optimizer-state settings not yet used, as the start of advice (``keep the optimizer state in
    bfloat16 (...) or in host memory (...); ``), or nothing when both are set."""
    from theseus.base.failures import optimizer_state_settings

    settings = optimizer_state_settings(config)
    if not settings:
        return ""
    return f"keep the optimizer state {' or '.join(settings)}; "


__all__ = [
    "Budget",
    "Candidate",
    "Choice",
    "Trial",
    "budget",
    "candidates",
    "climb",
    "first_pass",
    "fit",
    "keep_state_on_device",
    "needs",
    "requested",
    "splitter",
]
