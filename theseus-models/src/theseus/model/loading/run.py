"""Opening a training run: its model (rebuilt from the run's saved configuration),
the parameters of one checkpoint, and the tokenizer of its training data.

A run directory ``<root>/runs/<name>/`` holds ``config.yaml`` (the resolved configuration),
``provenance.json`` (with the model class and the tokenizer spec) and ``checkpoints/<step>/state``
(orbax; only the parameters are read, not the optimizer state).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp

from theseus.config import Configuration, configuration, configure, read_yaml
from theseus.data.tokenizers.base import Tokenizer
from theseus.data.tokenizers.byte import ByteTokenizer
from theseus.data.tokenizers.spec import load_tokenizer
from theseus.errors import ConfigError
from theseus.model.loading.adapters import refers_to_base, restore_adapted
from theseus.model.stack.transformer import TransformerLM
from theseus.runs.layout import CONFIG_FILE, PROVENANCE_FILE, run_names, state_path
from theseus.runs.params import restore_params
from theseus.runs.records import read_provenance
from theseus.runs.ref import RunRef

if TYPE_CHECKING:
    from theseus.training.sharding import TrainerSharding


@dataclass
class LoadedRun:
    """A run's model, the parameters of checkpoint ``step``, and its tokenizer."""

    name: str
    path: Path
    config: Configuration
    model: TransformerLM
    params: Any
    tokenizer: Tokenizer
    step: int
    #: The id that starts a text, for checkpoints imported with a tokenizer that adds one (Llama's
    #: ``<s>``); None: documents start after end-of-text, as in packed training data.
    bos_id: int | None = None
    #: The mesh the parameters are on (None: the default device).
    sharding: TrainerSharding | None = None

    @property
    def eot_id(self) -> int | None:
        """The end-of-text id, when the model's vocabulary can produce it."""
        eot = int(self.tokenizer.eot_id)
        return eot if 0 <= eot < self.model.architecture.vocab_size else None

    @property
    def context_length(self) -> int:
        """Tokens the model saw per row in training (``training/sequence_length``, else its block size)."""
        block = self.model.architecture.block_size
        trained = self.config.get("training/sequence_length") or block
        return min(int(trained), block)

    @property
    def parameters(self) -> int:
        return sum(int(leaf.size) for leaf in jax.tree.leaves(self.params))


#: The setting that names the run ``generate`` samples from (named in errors).
RUN_KEY = "generate/run"


def available_runs(root: str | Path) -> list[str]:
    """Names of the runs under ``<root>/runs`` (folders holding a ``config.yaml``), sorted."""
    return run_names(root)


def _known_code(target: str) -> bool:
    """Whether a class named by a run's record may be imported: its module is already loaded, part of
    the ``theseus`` namespace, or the target of a registered model or job (a run directory is data
    and never chooses other code to import)."""
    module_name = target.partition(":")[0]
    if module_name in sys.modules or module_name == "theseus" or module_name.startswith("theseus."):
        return True
    from theseus.registry import get_registry

    registry = get_registry()
    registered = {entry.target for entry in registry.components_of("model")}
    registered |= {entry.target for entry in registry.jobs.values()}
    return target in registered


def _import(target: str, what: str) -> Any:
    module_name, _, attribute = target.partition(":")
    if not _known_code(target):
        raise ConfigError(
            f"the run names {what} {target!r}, which is neither loaded nor a registered model or job; "
            "load the code that defines it with 'theseus --load FILE_OR_MODULE' (or install its plugin)"
        )
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot import {what} {target!r} ({exc}); install or load the code that defines it") from exc
    return obj


def model_class(provenance: dict[str, Any], run: str) -> type[TransformerLM]:
    """The model class a run trained, from its provenance record (model, else the job's MODEL)."""
    cls: Any = None
    if provenance.get("model"):
        cls = _import(str(provenance["model"]), "the model class")
    elif provenance.get("job_class"):
        from theseus.training.declarations import resolve

        job_class = _import(str(provenance["job_class"]), "the training job")
        declared = getattr(job_class, "MODEL", None)
        cls = resolve("model", declared) if declared is not None else None
    if cls is None:
        raise ConfigError(f"run {run!r} does not record its model class in {PROVENANCE_FILE}; train it again")
    if not (isinstance(cls, type) and issubclass(cls, TransformerLM)):
        name = getattr(cls, "__qualname__", repr(cls))
        raise ConfigError(
            f"run {run!r} trained a {name}, which has no KV-cache decoding; "
            "generation works for GPT, Llama and other TransformerLM models"
        )
    return cls


def run_tokenizer(provenance: dict[str, Any], model: TransformerLM, spec: str | None, run: str) -> Tokenizer:
    """``spec`` when given; else the tokenizer recorded with the run; else bytes for a byte-sized vocabulary."""
    if spec:
        return load_tokenizer(spec)
    recorded = provenance.get("tokenizer")
    if recorded:
        return load_tokenizer(recorded)
    if model.architecture.vocab_size in (256, ByteTokenizer.vocab_size):
        return ByteTokenizer()
    raise ConfigError(
        f"run {run!r} does not record its tokenizer; pass generate/tokenizer=<spec> (e.g. byte, hf:PATH.json)"
    )


def abstract_params(model: TransformerLM) -> Any:
    """Shapes and dtypes of the model's parameters (nothing is allocated)."""
    import flax.linen as nn

    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), deterministic=True))
    return nn.unbox(shapes["params"])


def restore_run_params(run_dir: Path, step: int, abstract: Any, run: str, shardings: Any = None) -> Any:
    """Only ``params`` of checkpoint ``step`` of a run, on ``shardings`` (default: the default
    device), from either layer layout."""
    what = f"checkpoint {step} of run {run!r}"
    fix = "restore the run's config.yaml (the model is rebuilt from it) or train the run again"
    return restore_params(state_path(run_dir, step), abstract, shardings, what=what, fix=fix)


def param_shardings(model: TransformerLM, sharding: TrainerSharding) -> Any:
    """Where each parameter of ``model`` lives on ``sharding``'s mesh (its layout's rules)."""
    import flax.linen as nn

    with sharding.context():
        boxed = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), deterministic=True))
    return sharding.logical_shardings(nn.get_partition_spec(boxed))["params"]


def distribute(params: Any, shardings: Any) -> Any:
    """Parameters this process holds in full, placed on ``shardings`` (each process its own shards)."""
    host = jax.device_get(params)
    return jax.tree.map(
        lambda leaf, where: jax.make_array_from_callback(leaf.shape, where, lambda index: leaf[index]), host, shardings
    )


def run_model(path: Path) -> tuple[Configuration, dict[str, Any], TransformerLM]:
    """The saved configuration, the provenance record and the model (rebuilt, no parameters) of the run
    in folder ``path``."""
    config = Configuration(read_yaml(path / CONFIG_FILE))
    provenance = read_provenance(path)
    cls = model_class(provenance, path.name)
    with configuration(config):
        model = configure(cls)
    return config, provenance, model


def run_params(
    root: str | Path, path: Path, config: Configuration, model: TransformerLM, step: int, shardings: Any = None
) -> Any:
    """The parameters of checkpoint ``step`` of the run in folder ``path`` on ``shardings`` (default: the
    default device); a LoRA run's checkpoint holds the adapters, and its ``training/init_from`` the base."""
    if refers_to_base(config):
        params = restore_adapted(root, config, model, path, step, abstract_params(model), path.name)
        return params if shardings is None else distribute(params, shardings)
    return restore_run_params(path, step, abstract_params(model), path.name, shardings)


def load_run(
    root: str | Path,
    name: str | RunRef = "",
    *,
    step: int | None = None,
    tokenizer: str | None = None,
    mesh: Callable[[TransformerLM], TrainerSharding] | None = None,
) -> LoadedRun:
    """Rebuild a run's model from its saved configuration and load one of its checkpoints.

    ``name`` is ``NAME``, ``NAME@STEP`` or a :class:`~theseus.runs.ref.RunRef` (empty: the only run);
    ``step`` names the checkpoint too (default: the latest). ``tokenizer`` (a spec such as ``"byte"``)
    replaces the tokenizer recorded with the run; ``mesh(model)`` gives the mesh and layout to place the
    parameters on (default: the default device; the run's :attr:`LoadedRun.sharding`).
    """
    ref = RunRef.of(name, root, key=RUN_KEY, step=step).resolve()
    path, name, chosen = ref.path, ref.name, ref.checkpoint
    config, provenance, model = run_model(path)
    sharding = None if mesh is None else mesh(model)
    shardings = None if sharding is None else param_shardings(model, sharding)
    params = run_params(root, path, config, model, chosen, shardings)
    tok = run_tokenizer(provenance, model, tokenizer, name)
    if tok.vocab_size > model.architecture.vocab_size:
        raise ConfigError(
            f"the tokenizer has {tok.vocab_size} ids but run {name!r}'s model only {model.architecture.vocab_size}; "
            "use the tokenizer the run was trained with"
        )
    bos = (provenance.get("huggingface") or {}).get("bos_id")
    bos_id = int(bos) if isinstance(bos, int) and 0 <= bos < model.architecture.vocab_size else None
    return LoadedRun(name, path, config, model, params, tok, chosen, bos_id, sharding)
