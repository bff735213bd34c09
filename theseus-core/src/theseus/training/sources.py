"""What ``training/init_from`` (and ``distill/teacher``) name, read without jax: ``run:NAME[@STEP]``, a
theseus run (:class:`~theseus.runs.ref.RunRef`), or ``hf:<folder or hub id>``, a Hugging Face checkpoint;
and the model class a source holds, which decides the model a run trains when it selects none.

Opening a source for its weights is :mod:`theseus.training.init_from`'s. ``hf:`` sources are read by the
installed ``init_source/hf`` component (theseus-models registers it), found through the registry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.errors import ConfigError, TheseusError
from theseus.registry import get_registry
from theseus.runs.records import read_provenance
from theseus.runs.ref import RunRef

INIT_FROM = "training/init_from"
#: How ``training/init_from`` is written (for messages).
FORMS = "run:<name>[@step] or hf:<folder or hub id>"
RUN = "run"
HF = "hf"
#: The component kind of a source's reader: ``init_source/<form>`` has ``open(target, spec)`` (an
#: :class:`~theseus.training.init_from.InitSource`, no weights read yet) and ``model_class(target)``.
READER = "init_source"


def parse_source(
    spec: str, root: str | Path, *, key: str = INIT_FROM, what: str = "a source", forms: str = FORMS
) -> RunRef | str:
    """``run:NAME[@STEP]`` as its (unresolved) :class:`RunRef`, or ``hf:TARGET`` as ``TARGET``;
    ConfigError (one line, naming ``key`` and the ``forms`` it takes) for anything else."""
    kind, sep, target = spec.partition(":")
    if not sep or not target or kind not in (RUN, HF):
        raise ConfigError(f"{key}={spec!r} is not {what}; use {forms}")
    if kind == HF:
        return target
    return RunRef.parse(target, root, key=key, prefix=f"{RUN}:", need_name=True)


def source_model_class(spec: str, root: Path) -> str | None:
    """The model class (``module:Name``) the source holds, read without its weights: the model a run
    trains when it selects none (``model=``). None when the source does not say or cannot be read
    here; opening it later reports why."""
    try:
        source = parse_source(spec, root)
        if isinstance(source, RunRef):
            model = read_provenance(source.path).get("model")
            return model if isinstance(model, str) else None
        found: str | None = source_reader(HF, spec).model_class(source)
        return found
    except (TheseusError, ImportError, OSError):
        return None


def source_reader(form: str, spec: str) -> Any:
    """The installed reader of ``form:`` sources (the ``init_source/<form>`` component); ConfigError when
    none is installed, a PluginError naming the distribution when it is blocked or broken."""
    registry = get_registry()
    if (READER, form) not in registry.components and f"{READER}/{form}" not in registry.blocked_entries:
        raise ConfigError(
            f"{INIT_FROM}={spec!r} reads Hugging Face checkpoints, which needs theseus-models: "
            "pip install theseus-models"
        )
    return registry.load_component(READER, form)


__all__ = ["FORMS", "HF", "INIT_FROM", "READER", "RUN", "parse_source", "source_model_class", "source_reader"]
