"""Reading runs whose checkpoints hold only LoRA adapters: the base comes from ``training/init_from``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from theseus.model.finetune.adapters import overlay, prune
from theseus.model.layers.lora import is_adapter


def refers_to_base(config: Mapping[str, Any]) -> bool:
    """Whether a run's checkpoints hold adapters only (LoRA started from ``training/init_from``)."""
    return int(config.get("model/lora/rank") or 0) > 0 and bool(config.get("training/init_from"))


def base_shapes(tree: Any) -> Any:
    """``tree`` (parameters, shapes or shardings) without the adapters."""

    def strip(node: Any, path: tuple[Any, ...]) -> Any:
        if isinstance(node, Mapping):
            kept = {k: strip(v, (*path, k)) for k, v in node.items()}
            return {k: v for k, v in kept.items() if v is not None}
        return None if is_adapter(path) else node

    return strip(tree, ())


def load_base(source: Any, model: Any, abstract: Any, shardings: Any) -> Any:
    """The base parameters (every parameter but the adapters) from an ``init_from`` source."""
    return source.load(model, base_shapes(abstract), base_shapes(shardings))


def restore_adapted(
    root: str | Path, config: Mapping[str, Any], model: Any, run_dir: Path, step: int, abstract: Any, run: str
) -> Any:
    """The parameters of an adapter-only checkpoint: its adapters over the base its run started from."""
    from theseus.config import configuration
    from theseus.runs.layout import state_path
    from theseus.runs.params import restore_params
    from theseus.training.init_from import open_source

    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
    source = open_source(str(config.get("training/init_from")), Path(root))
    with configuration(config):
        base = load_base(source, model, abstract, shardings)
    what = f"checkpoint {step} of run {run!r} (its LoRA adapters)"
    fix = "restore the run's config.yaml or train the run again"
    adapters = restore_params(state_path(run_dir, step), prune(abstract), what=what, fix=fix)
    return overlay(base, adapters)


__all__ = ["base_shapes", "load_base", "refers_to_base", "restore_adapted"]
