"""``training/init_from=hf:<folder or hub id>``: a Hugging Face checkpoint as a trainer's starting point."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from theseus.model.huggingface.convert import checkpoint_family, open_checkpoint, plan_import
from theseus.model.huggingface.importer import PreparedImport, flat_paths, read_params
from theseus.model.huggingface.source import hub_config_folder, read_config, resolve_source
from theseus.model.huggingface.tokenizer_files import tokenizer_spec
from theseus.training.init_from import InitSource


def hf_model_class(target: str) -> str:
    """The theseus model class (``module:Name``) that ``target``'s ``config.json`` imports into; a hub
    id fetches that file alone (the weights come when the run opens the source)."""
    folder = Path(target).expanduser()
    if not folder.is_dir():
        folder = hub_config_folder(target)
    return str(checkpoint_family(read_config(folder)).model_class)


def hf_source(target: str, spec: str) -> InitSource:
    """Read ``config.json``, the safetensors headers and the tokenizer of ``target``; weights load later."""
    folder, _ = resolve_source(target)
    checkpoint = open_checkpoint(folder)
    vocab = int(checkpoint.imported.keys["architecture/vocab_size"])
    tokenizer, _ = tokenizer_spec(folder, checkpoint.config, vocab)
    if tokenizer is not None:
        import hashlib

        tokenizer = {**tokenizer, "sha256": hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()}

    def read(model: Any, abstract: Any, shardings: Any) -> Any:
        maps = plan_import(checkpoint, model.architecture)
        prepared = PreparedImport(checkpoint, model, None, maps, tokenizer, None)  # type: ignore[arg-type]
        return read_params(prepared, flat_paths(shardings), wanted=flat_paths(abstract))

    return InitSource(spec, dict(checkpoint.imported.keys), checkpoint.imported.model_class, tokenizer, read)


class HFInitSource:
    """The ``init_source/hf`` component: what ``training/init_from=hf:<folder or hub id>`` reads."""

    open = staticmethod(hf_source)
    model_class = staticmethod(hf_model_class)
