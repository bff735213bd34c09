"""The teacher of distillation (``distill/teacher``): a theseus run or a Hugging Face checkpoint,
opened for its model and vocabulary first and its parameters read once training needs them.

``run:<name>[@step]`` rebuilds the run's own model from its ``config.yaml`` and reads its latest
checkpoint (or ``step``), as ``generate`` does; ``hf:<folder>`` reads a local Hugging Face checkpoint
through the importer that ``hf/import`` and ``training/init_from=hf:`` use. The parameters are placed
on the student's mesh with the teacher's own layout rules.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from theseus.errors import ConfigError, TheseusError
from theseus.model.loading.run import abstract_params, param_shardings, run_model, run_params
from theseus.model.stack.transformer import TransformerLM
from theseus.runs.ref import RunRef
from theseus.training.sharding import TrainerSharding
from theseus.training.sources import parse_source

#: The key that names the teacher.
TEACHER_KEY = "distill/teacher"
FORMS = "run:<name>[@step] (a theseus run) or hf:<folder> (a Hugging Face checkpoint)"


@dataclass
class Teacher:
    """A teacher's model and tokenizer record; ``load`` reads its parameters onto a mesh."""

    spec: str
    model: TransformerLM
    #: The tokenizer spec recorded with the teacher (None when it records none).
    tokenizer: Mapping[str, Any] | None
    read: Callable[[Any], Any]  # param shardings -> parameters

    @property
    def vocab_size(self) -> int:
        return int(self.model.architecture.vocab_size)

    def shardings(self, sharding: TrainerSharding) -> Any:
        return param_shardings(self.model, sharding)

    def load(self, sharding: TrainerSharding) -> Any:
        """The parameters, placed on ``sharding``'s mesh."""
        return self.read(self.shardings(sharding))

    def abstract(self, sharding: TrainerSharding) -> Any:
        """The parameters' shapes, dtypes and shardings (nothing is read)."""
        from theseus.training.state import with_shardings

        return with_shardings(abstract_params(self.model), self.shardings(sharding))


def open_teacher(spec: str, root: Path, student_run: str = "") -> Teacher:
    """The teacher ``spec`` names (no parameters read yet); ConfigError (one line naming the fix) for an
    empty, malformed or missing teacher, or for the student's own run."""
    if not spec:
        raise ConfigError(f"{TEACHER_KEY} is empty; name the teacher: {TEACHER_KEY}={FORMS}")
    source = parse_source(spec, root, key=TEACHER_KEY, what="a teacher", forms=FORMS)
    try:
        if not isinstance(source, RunRef):
            return _hf_teacher(spec, source)
        if source.name == student_run:
            raise ConfigError("that is the student's own run; name another run (the teacher) or set run/name")
        return _run_teacher(spec, source)
    except TheseusError as exc:
        raise type(exc)(f"{TEACHER_KEY}={spec}: {exc}") from exc


def _run_teacher(spec: str, ref: RunRef) -> Teacher:
    ref = ref.resolve()
    config, provenance, model = run_model(ref.path)

    def read(shardings: Any) -> Any:
        return run_params(ref.root, ref.path, config, model, ref.checkpoint, shardings)

    return Teacher(spec, model, provenance.get("tokenizer"), read)


def _hf_teacher(spec: str, target: str) -> Teacher:
    from theseus.model.huggingface.importer import flat_paths, prepare, read_params

    folder = Path(target).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"there is no folder {folder}; pass hf:<the folder a Hugging Face model was saved to>")
    prepared = prepare(folder.absolute())
    tokenizer = prepared.tokenizer
    if tokenizer is not None:  # with the file's hash, as training/init_from=hf: records it
        digest = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()
        tokenizer = {**tokenizer, "sha256": digest}

    def read(shardings: Any) -> Any:
        return read_params(prepared, flat_paths(shardings), wanted=flat_paths(abstract_params(prepared.model)))

    return Teacher(spec, prepared.model, tokenizer, read)


def _identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What decides a tokenizer's ids (file locations and the end-of-text spelling left out)."""
    return {k: v for k, v in spec.items() if k not in ("path", "eot")}


def _named(spec: Mapping[str, Any]) -> str:
    """A tokenizer spec as a user writes it: ``byte``, ``hf:<tokenizer.json>``, ``tiktoken:gpt2``."""
    target = spec.get("path") or spec.get("encoding") or ""
    return f"{spec.get('kind')}:{target}" if target else str(spec.get("kind"))


def check_student(teacher: Teacher, vocab_size: int, tokenizer: Mapping[str, Any] | None, length: int) -> None:
    """ConfigError when the student's vocabulary (its size, and its tokenizer where both record one)
    is not the teacher's, whose distributions would be over other ids, or when the student's rows of
    ``length`` tokens are longer than the teacher reads."""
    if vocab_size != teacher.vocab_size:
        raise ConfigError(
            f"{TEACHER_KEY}={teacher.spec} predicts {teacher.vocab_size} ids but the student "
            f"architecture/vocab_size={vocab_size}; distillation needs one vocabulary: set "
            f"architecture/vocab_size={teacher.vocab_size} (and the teacher's tokenizer)"
        )
    if tokenizer is not None and teacher.tokenizer is not None and _identity(tokenizer) != _identity(teacher.tokenizer):
        raise ConfigError(
            f"{TEACHER_KEY}={teacher.spec} reads text with the tokenizer {_named(teacher.tokenizer)}, the student "
            f"with {_named(tokenizer)}; distillation needs one vocabulary: give the student text tokenized with "
            "the teacher's tokenizer"
        )
    block = int(teacher.model.architecture.block_size)
    if length > block:
        raise ConfigError(
            f"{TEACHER_KEY}={teacher.spec} reads at most {block} tokens (its architecture/block_size) but the "
            f"student's rows hold {length}; set training/sequence_length={block} or less"
        )


__all__ = ["TEACHER_KEY", "Teacher", "check_student", "open_teacher"]
