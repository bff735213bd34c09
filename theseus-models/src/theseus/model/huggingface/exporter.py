"""``hf/export``: write a run's checkpoint as a folder transformers loads with ``from_pretrained``."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from theseus.base import jsonfile
from theseus.errors import ConfigError
from theseus.model.huggingface.convert import export_plan
from theseus.model.huggingface.family import export_family
from theseus.model.huggingface.safetensors_io import write_checkpoint
from theseus.model.huggingface.tokenizer_files import BYTE_END_OF_TEXT, byte_tokenizer_json, token_id
from theseus.model.loading.chat import TEMPLATE_FILE
from theseus.runs.records import read_provenance
from theseus.runs.ref import RunRef

DTYPES = {"float32": "float32", "bfloat16": "bfloat16"}
#: The largest ``tokenizer.json`` read (the largest vocabularies write a few tens of megabytes).
TOKENIZER_BYTES = 512 << 20
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}


def parse_size(text: str) -> int:
    """``"5GB"`` -> 5_000_000_000 (also KB/MB, KiB/MiB/GiB, or plain bytes)."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?\s*", str(text), flags=re.IGNORECASE)
    if not match:
        raise ConfigError(f"hf/shard_size={text!r} is not a size; use e.g. 5GB, 500MB or a number of bytes")
    size = int(float(match.group(1)) * _UNITS[(match.group(2) or "").upper()])
    if size < 1:
        raise ConfigError(f"hf/shard_size={text!r} must be positive")
    return size


def numpy_dtype(name: str) -> Any:
    if name not in DTYPES:
        raise ConfigError(f"hf/dtype={name!r} is not supported; choose one of {', '.join(DTYPES)}")
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    import numpy as np

    return np.float32


def output_folder(out: str) -> Path:
    if not out:
        raise ConfigError("hf/out is empty; pass hf/out=<folder> to write the checkpoint to")
    folder = Path(out).expanduser().absolute()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"hf/out={out!r} exists and is not an empty folder; choose a new folder")
    return folder


def new_folder(parent: Path, prefix: str) -> Path:
    """A folder ``<parent>/<prefix><random>`` that did not exist before and that this call created."""
    parent.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        candidate = parent / f"{prefix}{secrets.token_hex(6)}"
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        return candidate
    raise ConfigError(f"cannot create a staging folder {prefix}* in {parent}; remove the old ones there")


#: The middle of a staging folder's name, ``.<out>.exporting-<random>``.
EXPORTING = ".exporting-"


@contextlib.contextmanager
def staged_folder(folder: Path) -> Iterator[Path]:
    """A new hidden ``.<name>.exporting-<random>`` beside ``folder`` to write into, renamed to ``folder``
    when the block completes and removed when it fails: ``folder`` only ever holds a complete export.
    The staging folder holds a lock while it is written, so the staging folders of exports that were
    killed are told apart from those being written, and removed by the next export beside them."""
    from theseus.runs.lock import LOCK_FILE, RunLock, publish, remove_abandoned

    remove_abandoned(folder.parent, f".*{EXPORTING}*")
    staging = new_folder(folder.parent, f".{folder.name}{EXPORTING}")
    lock = RunLock(staging).acquire()
    try:
        yield staging
        lock.release()
        (staging / LOCK_FILE).unlink()  # not part of the export
        if not publish(staging, folder):
            raise ConfigError(
                f"{folder} was filled by another command while this export ran; what it holds is kept and this "
                "export is discarded: choose a new hf/out"
            )
    except BaseException:
        lock.release()
        with contextlib.suppress(OSError):
            shutil.rmtree(staging)
        raise


def _read_object(path: Path, max_bytes: int = jsonfile.MAX_BYTES) -> dict[str, Any]:
    """A JSON object of the run being exported; ConfigError (one line) naming the file when it is unreadable.
    Its numbers are not checked: a tokenizer's ``model_max_length`` may be ``int(1e30)``, and the export
    reads only texts and token ids from these files."""
    try:
        return jsonfile.read_object(path, max_bytes=max_bytes, check_numbers=False)
    except jsonfile.UnreadableJSON as exc:
        raise ConfigError(f"{exc}; restore the run's copy of it") from exc


def write_tokenizer(
    folder: Path, run_path: Path, spec: dict[str, Any] | None, block_size: int
) -> tuple[int, int] | None:
    """Copy (or, for the byte tokenizer, create) the tokenizer files; returns (bos, eos) ids or None."""
    kind = (spec or {}).get("kind")
    if kind == "hf":
        source = Path(spec["path"]) if spec else None
        if source is None or not source.is_file():
            raise ConfigError(f"the run's tokenizer file {source} is missing; restore it to export the tokenizer")
        shutil.copyfile(source, folder / "tokenizer.json")
        for companion in ("tokenizer_config.json", "special_tokens_map.json"):
            if (source.parent / companion).is_file():
                shutil.copyfile(source.parent / companion, folder / companion)
        eot = spec.get("eot") if spec else None
    elif kind == "byte":
        (folder / "tokenizer.json").write_text(json.dumps(byte_tokenizer_json()))
        eot = BYTE_END_OF_TEXT
    else:
        return None
    tokenizer = _read_object(folder / "tokenizer.json", max_bytes=TOKENIZER_BYTES)
    ends = ("<|endoftext|>", "</s>", "<|end_of_text|>")
    eot = eot or next((t for t in ends if token_id(tokenizer, t) is not None), None)
    eos = token_id(tokenizer, eot) if eot else None
    if not (folder / "tokenizer_config.json").is_file():
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": block_size,
            "eos_token": eot,
            "bos_token": eot,
            "unk_token": None,
            "clean_up_tokenization_spaces": False,
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return (eos, eos) if eos is not None else None


def write_chat_template(folder: Path, run_path: Path) -> None:
    """The chat template the run keeps (``chat_template.json``: the one ``train/sft`` trained with, or an
    imported checkpoint's) as the ``chat_template`` of the exported ``tokenizer_config.json``, where
    transformers' ``apply_chat_template`` reads it; nothing without a template or a tokenizer."""
    kept, config_file = run_path / TEMPLATE_FILE, folder / "tokenizer_config.json"
    if not kept.is_file() or not config_file.is_file():
        return
    template = _read_object(kept).get("chat_template")
    if not isinstance(template, str) or not template:
        return
    config = _read_object(config_file)
    config["chat_template"] = template
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def merged_params(loaded: Any) -> Any:
    """A run's parameters one entry per layer (host views of stacked layers, nothing copied) with any
    LoRA adapters folded into their kernels and a quantized base (``model/quantize``) dequantized (the
    plain model's layout)."""
    import jax
    import numpy as np

    from theseus.checkpoint.layers import per_layer
    from theseus.config import configuration
    from theseus.model.layers import lora, quantization
    from theseus.training import frozen

    params = loaded.params
    if frozen.has_frozen(params):
        from theseus.model.loading.adapters import plain_shapes

        with configuration(loaded.config):
            params = quantization.dequantize_params(params, plain_shapes(loaded.model))
    params = per_layer(jax.tree.map(np.asarray, params), loaded.model.stacked_layers)
    rank = int(loaded.config.get("model/lora/rank") or 0)
    if rank <= 0:
        return params
    return lora.merge(params, float(loaded.config.get("model/lora/alpha", 16.0)), rank)


def export_run(
    root: Path,
    run: str | RunRef,
    out: str,
    *,
    step: int | None = None,
    dtype: str = "float32",
    shard_size: str = "5GB",
) -> Path:
    """Export a checkpoint of run ``run`` (``NAME``, ``NAME@STEP`` or a reference; ``step`` names the
    checkpoint too, default: the latest) to ``out``; returns the folder."""
    from theseus.model.loading.run import load_run

    target_dtype = numpy_dtype(dtype)
    shard_bytes = parse_size(shard_size)
    folder = output_folder(out)
    ref = RunRef.of(run, root, key="hf/run", step=step).resolve()
    record = read_provenance(ref.path)
    # a run without a recorded tokenizer (e.g. imported without tokenizer.json) exports weights only
    loaded = load_run(root, ref, tokenizer=None if record.get("tokenizer") else "byte")
    model_class = f"{type(loaded.model).__module__}:{type(loaded.model).__qualname__}"
    arch = loaded.model.architecture
    family = export_family(model_class, arch, (record.get("huggingface") or {}).get("model_type"))
    plan = export_plan(family, arch, merged_params(loaded), target_dtype)
    # refuse what the family cannot express before anything is written
    family.to_config(arch, loaded.config, dtype=dtype, bos_id=None, eos_id=None)
    with staged_folder(folder) as staging:
        ids = write_tokenizer(staging, loaded.path, record.get("tokenizer"), arch.block_size)
        write_chat_template(staging, loaded.path)
        hf = record.get("huggingface") or {}
        bos = hf.get("bos_id") if hf.get("bos_id") is not None else (ids[0] if ids else None)
        eos = ids[1] if ids else None
        config = family.to_config(arch, loaded.config, dtype=dtype, bos_id=bos, eos_id=eos)
        (staging / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        generation = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": None}
        (staging / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        write_checkpoint(staging, plan, shard_bytes)
    return folder
