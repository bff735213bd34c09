"""``NAME[@STEP]``: a run under ``<root>/runs`` and one of its checkpoints.

Every key that names a run's checkpoint reads it here: ``generate/run``, ``eval/run``, ``hf/run``,
and the ``run:`` sources of ``training/init_from`` and ``distill/teacher``. :meth:`RunRef.parse` reads
the text; :meth:`RunRef.resolve` chooses the run (the only one when unnamed) and the checkpoint (the
latest when no step is given), each checked to exist, with one-line errors naming what is there.
Only the run folders are read (nothing imports jax), so a mistake is reported at once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from theseus.errors import CheckpointError, ConfigError
from theseus.runs.layout import CHECKPOINTS, checkpoint_steps, run_names, run_path, runs_dir, state_path

#: How a reference is written (for messages).
FORM = "NAME[@STEP]"


@dataclass(frozen=True)
class RunRef:
    """A run (``name``; empty: the only run under ``root``) and its checkpoint (``step``; None: the
    latest); ``key`` is the setting it was written in, named in errors."""

    name: str
    step: int | None
    root: Path
    key: str = dataclasses.field(default="", compare=False)

    @classmethod
    def parse(cls, text: str, root: str | Path, *, key: str = "", prefix: str = "", need_name: bool = False) -> RunRef:
        """``NAME``, ``NAME@STEP`` or (unless ``need_name``) empty; ConfigError naming ``key`` otherwise.

        ``prefix`` is what came before the reference in the setting (``run:``), shown in errors."""
        name, at, step = text.strip().partition("@")
        written = f"{key}={prefix}{text}" if key else f"{prefix}{text}"
        if at and not step.isdigit():
            raise ConfigError(
                f"{written}: after '@' comes a checkpoint step, e.g. {prefix}{name.strip() or 'NAME'}@1000"
            )
        if need_name and not name.strip():
            raise ConfigError(f"{written}: name the run, as in {prefix}{FORM}")
        return cls(name.strip(), int(step) if at else None, Path(root), key)

    @classmethod
    def of(cls, run: str | RunRef, root: str | Path, *, key: str, step: int | None = None) -> RunRef:
        """``run`` as a reference (a text is parsed as ``key``'s value) at checkpoint ``step`` when given:
        what functions that take either a run's name or a reference call."""
        ref = run if isinstance(run, RunRef) else cls.parse(run, root, key=key)
        return ref.at(step, step_key="step")

    def at(self, step: int | None, *, step_key: str) -> RunRef:
        """This reference at the checkpoint a separate setting gives (``generate/step``; None or negative:
        none); ConfigError when the reference names another one."""
        if step is None or step < 0 or step == self.step:
            return self
        if self.step is not None:
            raise ConfigError(
                f"{self.key or 'the run'}={self} and {step_key}={step} name different checkpoints; "
                f"give the step once: {self.key or 'the run'}={self.name or 'NAME'}@STEP"
            )
        return dataclasses.replace(self, step=step)

    @property
    def runs(self) -> Path:
        """``<root>/runs``."""
        return runs_dir(self.root)

    @property
    def path(self) -> Path:
        """``<root>/runs/<name>`` (the name checked to be one folder name)."""
        return run_path(self.root, self.name)

    @property
    def checkpoint(self) -> int:
        """The checkpoint step (of a resolved reference)."""
        if self.step is None:
            raise ValueError(f"run reference {self} names no checkpoint; resolve() it first")
        return self.step

    @property
    def state(self) -> Path:
        """The saved state of the checkpoint (of a resolved reference)."""
        return state_path(self.path, self.checkpoint)

    @property
    def resolved(self) -> bool:
        """Whether both the run and the checkpoint are named."""
        return bool(self.name) and self.step is not None

    def resolve(self) -> RunRef:
        """This reference with the run (the only one when unnamed) and the checkpoint (the latest when no
        step) chosen, both checked to exist, and the root made absolute; one-line errors otherwise."""
        ref = dataclasses.replace(self, root=Path(self.root).expanduser().absolute())
        ref = dataclasses.replace(ref, name=ref._run())
        return dataclasses.replace(ref, step=ref._checkpoint())

    def resolve_run(self) -> RunRef:
        """This reference with only the run chosen and checked (its checkpoint left as written)."""
        ref = dataclasses.replace(self, root=Path(self.root).expanduser().absolute())
        return dataclasses.replace(ref, name=ref._run())

    def _run(self) -> str:
        names = run_names(self.root)
        if not self.name:
            if len(names) == 1:
                return names[0]
            if not names:
                raise ConfigError(
                    f"no training runs under {self.runs}; train one first (e.g. 'theseus run train/pretrain')"
                )
            choose = f"{self.key}=<name>" if self.key else "its name"
            raise ConfigError(f"several runs under {self.runs}; choose one with {choose} ({', '.join(names)})")
        if self.name not in names:
            listed = f"available: {', '.join(names)}" if names else "there are no runs yet; train one first"
            raise ConfigError(f"no run {self.name!r} under {self.runs} ({listed})")
        return self.name

    def _checkpoint(self) -> int:
        steps = checkpoint_steps(self.path)
        if not steps:
            raise CheckpointError(
                f"run {self.name!r} has no checkpoint yet in {self.path / CHECKPOINTS}; "
                "let its training reach a checkpoint first"
            )
        if self.step is None:
            return steps[-1]
        if self.step not in steps:
            raise CheckpointError(
                f"run {self.name!r} has no checkpoint at step {self.step}; "
                f"available steps: {', '.join(map(str, steps))}"
            )
        return self.step

    def __str__(self) -> str:
        return self.name if self.step is None else f"{self.name}@{self.step}"


__all__ = ["FORM", "RunRef"]
