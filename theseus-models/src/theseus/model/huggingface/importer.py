"""``hf/import``: turn a Hugging Face checkpoint into an ordinary theseus run (step-0 checkpoint,
``config.yaml``, provenance and the checkpoint's tokenizer)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from theseus.config import Configuration, Schema, configuration, configure, resolve
from theseus.errors import ConfigError
from theseus.model.huggingface.convert import HFCheckpoint, ParamPath, load_params, open_checkpoint, plan_import
from theseus.model.huggingface.names import TensorMap
from theseus.model.huggingface.safetensors_io import INDEX_FILE
from theseus.model.huggingface.source import CONFIG_FILE
from theseus.model.huggingface.tokenizer_files import TOKENIZER_FILES, chat_template_record, tokenizer_spec
from theseus.model.loading.chat import TEMPLATE_FILE

if TYPE_CHECKING:
    from theseus.model.stack.transformer import TransformerLM

TOKENIZER_DIR = "tokenizer"
#: The middle of the hidden staging folder's name, ``.<run name>.importing-<random>``.
IMPORTING = ".importing-"


@dataclass
class PreparedImport:
    """A checked checkpoint: the model it becomes, its configuration and tensor plan (no weights read)."""

    checkpoint: HFCheckpoint
    model: TransformerLM
    config: Configuration
    maps: list[TensorMap]
    tokenizer: dict[str, Any] | None
    bos_id: int | None


def import_class(target: str) -> type[TransformerLM]:
    import importlib

    module, _, name = target.partition(":")
    cls: type[TransformerLM] = getattr(importlib.import_module(module), name)
    return cls


def model_configuration(model_cls: type[TransformerLM], keys: dict[str, Any]) -> Configuration:
    """Every key of the model's schema, with the checkpoint's architecture keys over the defaults."""
    return resolve(Schema.build(model_cls.gather()), overrides=keys)


def prepare(folder: Path, extra: dict[str, Any] | None = None) -> PreparedImport:
    """Read and check ``config.json``, the safetensors headers and the tokenizer; read no weights.

    ``extra`` keys (e.g. ``model/param_dtype``) are set on top of the checkpoint's own."""
    checkpoint = open_checkpoint(folder)
    model_cls = import_class(checkpoint.imported.model_class)
    config = model_configuration(model_cls, {**checkpoint.imported.keys, **(extra or {})})
    with configuration(config):
        model = configure(model_cls)
    arch = model.architecture
    maps = plan_import(checkpoint, arch)
    spec, bos = tokenizer_spec(folder, checkpoint.config, arch.vocab_size)
    return PreparedImport(checkpoint, model, config, maps, spec, bos)


def abstract_params(model: TransformerLM) -> dict[ParamPath, Any]:
    """Shape and dtype of each parameter, by path."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), deterministic=True))
    return flat_paths(nn.unbox(shapes["params"]))


def flat_paths(tree: Any) -> dict[ParamPath, Any]:
    """The leaves of a nested parameter mapping, by path."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {tuple(str(k.key) for k in path): leaf for path, leaf in flat}


def read_params(
    prepared: PreparedImport,
    shardings: dict[ParamPath, Any] | None = None,
    wanted: dict[ParamPath, Any] | None = None,
) -> dict[str, Any]:
    """The parameter tree in the model's layout, each tensor placed with its sharding (default: the
    first device) in the model's parameter dtype.

    ``wanted`` (shapes by path; default: every parameter of the model) names the parameters to read:
    a model with LoRA adapters asks for its base alone, since a checkpoint holds no adapters.
    Hugging Face names every layer's tensors apart; for a model that scans over its layers the
    layers of one parameter (of one run: global layer ``first + j`` is entry ``j`` of its run's stack, or
    of one position of its unit: :func:`~theseus.checkpoint.layers.layer_slots`) are gathered in a host
    buffer and placed once the last one is read, so at most the model's size is held on the host
    besides what is already placed.
    """
    import jax

    from theseus.checkpoint.layers import as_run, layer_slots

    wanted = abstract_params(prepared.model) if wanted is None else wanted
    runs = {run.name: run for run in map(as_run, prepared.model.stacked_layers)}
    # per-layer path (``blocks_<i>/...``) -> (the stacked path holding it, its index there or None: all of it)
    stacked_at: dict[ParamPath, tuple[ParamPath, int | None]] = {}
    per_layer: dict[ParamPath, Any] = {}
    for path, leaf in wanted.items():
        run = runs.get(path[0])
        if run is None:
            per_layer[path] = leaf
            continue
        for entry, below, index in layer_slots(run, path[1:], leaf.shape[0] if leaf.shape else 0):
            stacked_at[(entry, *below)] = (path, index)
            shape = leaf.shape if index is None else leaf.shape[1:]
            per_layer[(entry, *below)] = jax.ShapeDtypeStruct(shape, leaf.dtype)
    mapped = {path for m in prepared.maps for path in m.paths}
    if mapped != set(per_layer):
        missing = sorted(set(per_layer) - mapped) or sorted(mapped - set(per_layer))
        raise ConfigError(f"the import does not cover parameter {'/'.join(missing[0])!r}; this model is not supported")
    device = jax.devices()[0]
    buffers: dict[ParamPath, tuple[np.ndarray, set[int]]] = {}
    placed: dict[ParamPath, Any] = {}

    def put(path: ParamPath, values: np.ndarray) -> Any:
        sharding = shardings[path] if shardings is not None else device
        return jax.device_put(np.asarray(values, dtype=wanted[path].dtype), sharding)

    def place(path: ParamPath, values: np.ndarray) -> Any:
        target = per_layer[path]
        if tuple(values.shape) != tuple(target.shape):
            raise ConfigError(f"parameter {'/'.join(path)!r}: converted shape {values.shape} != {target.shape}")
        if path not in stacked_at:
            return put(path, values)
        key, index = stacked_at[path]
        if index is None:
            placed[key] = put(key, values)
            return None
        buffer, filled = buffers.setdefault(key, (np.empty(wanted[key].shape, wanted[key].dtype), set()))
        buffer[index] = values
        filled.add(index)
        if len(filled) == buffer.shape[0]:
            placed[key] = put(key, buffers.pop(key)[0])
        return None

    tree = load_params(prepared.checkpoint, prepared.maps, place)
    for entry in {path[0] for path in stacked_at} & set(tree):
        del tree[entry]  # the per-layer placeholders of stacked parameters
    for stacked_path, value in placed.items():
        node = tree
        for part in stacked_path[:-1]:
            node = node.setdefault(part, {})
        node[stacked_path[-1]] = value
    return tree


def file_hashes(checkpoint: HFCheckpoint) -> dict[str, str]:
    """sha256 of ``config.json``, the tokenizer files, the index and every safetensors file read."""
    folder = checkpoint.folder
    names = [CONFIG_FILE, *TOKENIZER_FILES, INDEX_FILE]
    weights = sorted({info.file for info in checkpoint.tensors.values()})
    paths = [folder / n for n in names if (folder / n).is_file()] + weights
    hashes = {}
    for path in paths:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                digest.update(block)
        hashes[path.name] = digest.hexdigest()
    return hashes


def write_run(
    root: Path,
    name: str,
    prepared: PreparedImport,
    source: dict[str, Any],
    job_class: type,
    job_key: str | None,
) -> Path:
    """Write ``<root>/runs/<name>`` atomically: built in a hidden folder, renamed when complete.

    Nothing is left under ``runs/`` when anything fails. The hidden folder holds the run's lock while
    it is written, so the staging folders of imports that were killed are told apart from those
    being written, and removed by the next import under this root."""
    from theseus.checkpoint.store import CheckpointStore
    from theseus.config import write_yaml
    from theseus.runs.directory import RunDirectory, provenance
    from theseus.runs.layout import CONFIG_FILE as RUN_CONFIG
    from theseus.runs.layout import runs_dir
    from theseus.runs.lock import RunLock, publish

    runs = runs_dir(root)
    final = runs / name
    if final.exists():
        raise ConfigError(f"run {name!r} already exists in {runs}; choose another run/name or delete that folder")
    created_runs = not runs.exists()
    runs.mkdir(parents=True, exist_ok=True)
    remove_abandoned_imports(runs)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}{IMPORTING}", dir=runs))
    lock = RunLock(staging).acquire()
    try:
        tokenizer = prepared.tokenizer
        if tokenizer is not None:
            target = staging / TOKENIZER_DIR
            target.mkdir()
            for file in TOKENIZER_FILES:
                if (prepared.checkpoint.folder / file).is_file():
                    shutil.copyfile(prepared.checkpoint.folder / file, target / file)
            digest = hashlib.sha256((target / "tokenizer.json").read_bytes()).hexdigest()
            tokenizer = {**tokenizer, "path": str(final / TOKENIZER_DIR / "tokenizer.json"), "sha256": digest}
        template = chat_template_record(prepared.checkpoint.folder)
        if template is not None:  # kept as train/sft keeps its own: rl/chat and generate/chat render with it
            (staging / TEMPLATE_FILE).write_text(json.dumps(template, indent=2) + "\n", encoding="utf-8")
        params = read_params(prepared)
        store = CheckpointStore(staging / "checkpoints", keep=0, async_save=False, save_concurrent_gb=1)
        try:
            store.save(0, {"params": params}, {"step": 0, "source": source.get("source")})
        finally:
            store.close()
        del params
        write_yaml(dict(prepared.config), staging / RUN_CONFIG)
        record = provenance(job_key, job_class, resumed_from=None, model=type(prepared.model), tokenizer=tokenizer)
        record["huggingface"] = {
            **source,
            "model_type": prepared.checkpoint.imported.family,
            "files": file_hashes(prepared.checkpoint),
            "bos_id": prepared.bos_id,
        }
        directory = RunDirectory(root, name)
        directory.path = staging
        directory.write_provenance(record)
        if not publish(staging, final):
            raise ConfigError(
                f"run {name!r} was created in {runs} by another command while this import ran; its run is "
                "kept and this import is discarded: choose another run/name"
            )
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if created_runs:
            with contextlib.suppress(OSError):
                runs.rmdir()
        raise
    finally:
        lock.release()
    return final


def remove_abandoned_imports(runs: Path) -> list[Path]:
    """Remove the staging folders (``.<name>.importing-*``) that imports killed midway left in ``runs``:
    those whose lock names a writer that no longer holds it. Folders being written stay. Returns
    the removed folders."""
    from theseus.runs.lock import remove_abandoned

    return remove_abandoned(runs, f".*{IMPORTING}*")
