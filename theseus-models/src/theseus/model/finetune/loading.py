"""Reading runs whose checkpoints hold only LoRA adapters: the base comes from the run named by ``sft/init``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.errors import CheckpointError
from theseus.model.finetune.adapters import overlay, prune
from theseus.model.layers.lora import is_adapter


def refers_to_base(config: Mapping[str, Any]) -> bool:
    """Whether a run's checkpoints hold adapters only (LoRA with a base run in ``sft/init``)."""
    return int(config.get("model/lora/rank") or 0) > 0 and bool(config.get("sft/init"))


def base_shapes(abstract: Any) -> Any:
    """``abstract`` without the adapters."""

    def strip(node: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(node, Mapping):
            kept = {k: strip(v, (*path, k)) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None}
        return None if is_adapter(path) else node

    return strip(abstract, ())


def base_folder(root: str | Path, init: str) -> Path:
    """The run folder ``sft/init`` names: a folder holding ``checkpoints``, or a run name under the root."""
    from theseus.model.generation.runs import run_folder
    from theseus.training.run import CHECKPOINTS

    folder = Path(init).expanduser()
    return folder if (folder / CHECKPOINTS).is_dir() else run_folder(root, init)


def load_base(root: str | Path, init: str, abstract: Any) -> Any:
    """The base parameters from the latest checkpoint of run ``init``, checked against ``abstract``."""
    from theseus.model.generation.runs import check_saved_shapes, load_run

    folder = base_folder(root, init)
    base = load_run(folder.parent.parent if folder.parent.name == "runs" else root, folder.name).params
    check_saved_shapes(base, base_shapes(abstract), f"of base run {init!r} (sft/init)")
    return base


def restore_adapted(
    root: str | Path, config: Mapping[str, Any], checkpoints: Path, step: int, abstract: Any, run: str
) -> Any:
    """The parameters of an adapter-only checkpoint: its adapters over the base run's parameters."""
    from theseus.model.generation.runs import restore_params

    init = str(config.get("sft/init"))
    try:
        base = load_base(root, init, abstract)
    except CheckpointError:
        raise
    adapters = restore_params(checkpoints, step, prune(abstract), run)
    return overlay(base, adapters)


__all__ = ["base_folder", "base_shapes", "load_base", "refers_to_base", "restore_adapted"]
