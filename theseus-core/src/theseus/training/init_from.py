"""``training/init_from``: start any trainer from another run's checkpoint or a Hugging Face checkpoint.

``run:<name>[@step]`` reads ``<root>/runs/<name>`` (its latest checkpoint, or ``step``);
``hf:<folder or hub id>`` reads safetensors through the ``init_source/hf`` component (theseus-models).
The source decides the architecture: its ``architecture/*`` keys replace the job's defaults, and a
value the user set that contradicts one of them is an error naming both. Parameters are placed
directly onto the trainer's shardings; the optimizer state starts fresh at step 0. The training
data must be tokenized with the source's tokenizer.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp

from theseus.config import Configuration, configuration, read_yaml
from theseus.errors import ConfigError, DataError, TheseusError
from theseus.runs.layout import CONFIG_FILE
from theseus.runs.params import restore_params
from theseus.runs.records import read_provenance
from theseus.runs.ref import RunRef
from theseus.training import adapters
from theseus.training.protocol import Trainer
from theseus.training.sources import HF, INIT_FROM, parse_source, source_reader
from theseus.training.state import TrainState, create_state

ParamPath = tuple[str, ...]
#: ``load(model, abstract_params, param_shardings) -> params`` (trees shaped like the model's params).
Loader = Callable[[Any, Any, Any], Any]


@dataclass
class InitSource:
    """Where initial parameters come from: its architecture keys, model class, tokenizer and reader
    (``read``: the parameters as the source stores them, see :meth:`load`)."""

    spec: str
    keys: dict[str, Any]
    model_class: str | None
    tokenizer: dict[str, Any] | None
    read: Loader

    def load(self, model: Any, abstract: Any, shardings: Any) -> Any:
        """The parameters ``abstract`` names, placed on ``shardings``, in ``model``'s layout: a model whose
        parameters differ from what a checkpoint stores (a quantized base: float kernels read and
        quantized one by one) converts them as they are read (``Module.read_params``)."""
        convert = getattr(model, "read_params", None)
        if convert is None:
            return self.read(model, abstract, shardings)
        return convert(self.read, abstract, shardings)


def open_source(spec: str, root: Path) -> InitSource:
    """Parse ``training/init_from`` and read the source's description (no weights yet)."""
    source = parse_source(spec, root)
    if isinstance(source, RunRef):
        return run_source(source, spec)
    found: InitSource = source_reader(HF, spec).open(source, spec)
    return found


# -- a theseus run -----------------------------------------------------------------------------------
def run_source(ref: RunRef, spec: str) -> InitSource:
    """The run ``ref`` names (its checkpoint chosen and checked; no weights read yet)."""
    try:
        ref = ref.resolve()
    except TheseusError as exc:
        raise type(exc)(f"{INIT_FROM}={spec!r}: {exc}") from exc
    values = read_yaml(ref.path / CONFIG_FILE)
    keys = {k: v for k, v in values.items() if k.startswith("architecture/")}
    record = read_provenance(ref.path)
    path = ref.state

    def read(model: Any, abstract: Any, shardings: Any) -> Any:
        what = f"{INIT_FROM}={spec!r} (checkpoint {ref.step} of run {ref.name!r})"
        return restore_params(path, abstract, shardings, what=what, fix="start from a run of the same architecture")

    return InitSource(spec, keys, record.get("model"), record.get("tokenizer"), read)


# -- the trainer side ----------------------------------------------------------------------------
def apply_architecture(config: Configuration, schema: Any, source: InitSource) -> Configuration:
    """``config`` with the source's architecture keys; ConfigError when the user set a different value."""
    updates: dict[str, Any] = {}
    for key, value in source.keys.items():
        if key not in schema:
            continue
        current, default = config.get(key), schema[key].default
        if current != default and current != value:
            raise ConfigError(
                f"{key}={current!r} contradicts {value!r} of {INIT_FROM}={source.spec!r}; "
                f"drop the override (the source decides the architecture)"
            )
        updates[key] = value
    return Configuration({**dict(config), **updates}, getattr(config, "schema", None))


def check_model_class(model_cls: type, source: InitSource) -> None:
    if not source.model_class:
        return
    module, _, name = source.model_class.partition(":")
    if not (module == "theseus" or module.startswith("theseus.")):
        return  # a third-party class is never imported from a record; the shapes are checked instead
    try:
        source_cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return
    if not (isinstance(model_cls, type) and issubclass(model_cls, source_cls)):
        raise ConfigError(
            f"{INIT_FROM}={source.spec!r} holds a {source_cls.__name__} model but this trainer trains "
            f"{getattr(model_cls, '__name__', model_cls)}; leave model= unset (and select/model out of a config "
            f"file) to train the model the source holds, or use a trainer whose MODEL is {source_cls.__name__}"
        )


def _identity(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("path", "eot")}


def check_tokenizer(data_spec: Mapping[str, Any] | None, source: InitSource) -> None:
    """DataError (one line with the fixing command) when the data was tokenized differently."""
    if data_spec is None or source.tokenizer is None:
        return
    if _identity(data_spec) == _identity(source.tokenizer):
        return
    wanted = source.tokenizer
    argument = f"hf:{wanted['path']}" if wanted.get("kind") == "hf" else str(wanted.get("kind"))
    raise DataError(
        f"the training data was tokenized with {data_spec.get('kind')} "
        f"({data_spec.get('path', '') or 'built in'}), but {INIT_FROM}={source.spec!r} uses "
        f"{argument}; tokenize the data with the model's tokenizer: "
        f"theseus run data/tokenize data/dataset=<dataset> data/tokenizer={argument} data/name=<new name>"
    )


def prepare(
    spec: str, root: Path, model_cls: type, config: Configuration, schema: Any
) -> tuple[InitSource, Configuration]:
    """Open the source ``spec`` names (no weights yet), check it holds a ``model_cls``, and return it
    with ``config`` given the source's architecture keys."""
    source = open_source(spec, root)
    check_model_class(model_cls, source)
    return source, apply_architecture(config, schema, source)


def check_data(flywheel: Any, source: InitSource) -> None:
    """DataError when the data ``flywheel`` reads was tokenized otherwise than the source's model."""
    if flywheel is not None:
        check_tokenizer(flywheel.tokenizer_spec, source)


def initial_state(trainer: Trainer, source: InitSource) -> TrainState:
    """The source's parameters on the trainer's shardings, a fresh optimizer state, step 0. Adapters
    (LoRA), which no source holds, start fresh over the base the source gives, whatever the source."""
    abstract, shardings = trainer.abstract_state, trainer.state_shardings
    with configuration(trainer.context.config):
        if adapters.has_adapters(abstract.params):
            fresh = create_state(
                trainer.model, trainer.tx, trainer.sharding, trainer.init_key, trainer.sequence_length, shardings
            )
            base = trainer.load_base(source, adapters.base_only(abstract.params), adapters.base_only(shardings.params))
            return fresh.replace(params=adapters.overlay(fresh.params, base))
        params = trainer.load_base(source, abstract.params, shardings.params)
    assert trainer.tx is not None
    opt_state = jax.jit(trainer.tx.init, out_shardings=shardings.opt_state)(params)
    step = jax.device_put(jnp.zeros((), jnp.int32), shardings.step)
    state: TrainState = abstract.replace(step=step, params=params, opt_state=opt_state)
    return state
