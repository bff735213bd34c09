"""Reading runs whose checkpoints hold only LoRA adapters: the base comes from ``training/init_from``
(quantized as it is read when ``model/quantize`` asks for it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from theseus.config import configuration
from theseus.model.layers.quantized_base import plain_shapes, read_quantized
from theseus.runs.layout import state_path
from theseus.runs.params import restore_params
from theseus.training.adapters import base_only, overlay, prune
from theseus.training.init_from import open_source


def refers_to_base(config: Mapping[str, Any]) -> bool:
    """Whether a run's checkpoints hold adapters only (LoRA started from ``training/init_from``)."""
    return int(config.get("model/lora/rank") or 0) > 0 and bool(config.get("training/init_from"))


def load_base(source: Any, model: Any, abstract: Any, shardings: Any) -> Any:
    """The base parameters (every parameter but the adapters) from an ``init_from`` source; with
    ``model/quantize``, the float kernels are read and quantized one by one into ``abstract``'s layout
    (the source's ``load`` does it, for every trainer)."""
    return source.load(model, base_only(abstract), base_only(shardings))


def restore_adapted(
    root: str | Path, config: Mapping[str, Any], model: Any, run_dir: Path, step: int, abstract: Any, run: str
) -> Any:
    """The parameters of an adapter-only checkpoint: its adapters over the base its run started from."""
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda _: device, abstract)
    source = open_source(str(config.get("training/init_from")), Path(root))
    with configuration(config):
        base = load_base(source, model, abstract, shardings)
    what = f"checkpoint {step} of run {run!r} (its LoRA adapters)"
    fix = "restore the run's config.yaml or train the run again"
    adapters = restore_params(state_path(run_dir, step), prune(abstract), what=what, fix=fix)
    return overlay(base, adapters)


__all__ = ["load_base", "plain_shapes", "read_quantized", "refers_to_base", "restore_adapted"]
