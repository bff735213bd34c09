"""Reading runs whose checkpoints hold only LoRA adapters: the base comes from ``training/init_from``
(quantized as it is read when ``model/quantize`` asks for it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax

from theseus.config import Configuration, configuration, current_configuration
from theseus.model.layers import quantization
from theseus.runs.layout import state_path
from theseus.runs.params import restore_params
from theseus.training.adapters import base_only, overlay, prune
from theseus.training.init_from import open_source


def refers_to_base(config: Mapping[str, Any]) -> bool:
    """Whether a run's checkpoints hold adapters only (LoRA started from ``training/init_from``)."""
    return int(config.get("model/lora/rank") or 0) > 0 and bool(config.get("training/init_from"))


def plain_shapes(model: Any) -> Any:
    """The parameter shapes of ``model`` built without ``model/quantize`` (float kernels)."""
    import flax.linen as nn
    import jax.numpy as jnp

    own = getattr(model, "theseus_config", None) or current_configuration() or {}
    plain = model.clone(theseus_config=Configuration({**own, "model/quantize": "none"}))
    shapes = jax.eval_shape(lambda: plain.init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32), deterministic=True))
    return nn.unbox(shapes["params"])


def _plain_shardings(shardings: Any, plain: Any) -> Any:
    """``shardings`` in the float layout: a quantized kernel's float form is placed as its codes are."""

    def walk(node: Any, shapes: Any) -> Any:
        if not isinstance(node, Mapping):
            return node
        out = {}
        for key, value in node.items():
            method = quantization.method_of(key)
            if method is not None and isinstance(value, Mapping):
                out[str(key)[: -len(method) - 1]] = value["codes"]
            else:
                out[key] = walk(value, shapes.get(key, {}) if isinstance(shapes, Mapping) else {})
        return out

    return walk(shardings, plain)


def read_quantized(model: Any, read: Any, abstract: Any, shardings: Any) -> Any:
    """The parameters ``abstract`` names, read by ``read(model, abstract, shardings)`` in the float layout
    a checkpoint stores; with ``model/quantize``, the float kernels are read and quantized one by one into
    ``abstract``'s layout (what ``read_params`` of the models does)."""
    if not quantization.has_quantized(abstract):
        return read(model, abstract, shardings)
    plain = _matching(plain_shapes(model), abstract)
    float_base = read(model, plain, _plain_shardings(shardings, plain))
    return quantization.quantize_params(float_base, abstract, shardings)


def _matching(plain: Any, abstract: Any) -> Any:
    """``plain`` (float shapes) cut to the parameters ``abstract`` names: a float kernel where ``abstract``
    holds it quantized, nothing it leaves out (the adapters of a base, a trainer's own head)."""
    if not isinstance(abstract, Mapping) or not isinstance(plain, Mapping):
        return plain
    out: dict[str, Any] = {}
    for key, value in abstract.items():
        method = quantization.method_of(key)
        if method is not None and isinstance(value, Mapping):
            name = str(key)[: -len(method) - 1]
            out[name] = plain[name]
        elif key in plain:
            out[key] = _matching(plain[key], value)
    return out


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
