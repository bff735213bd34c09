"""Activation capture: run a trainer's ``trace`` with every module's output recorded, for analyses.

Works with any ``trace`` that calls the model through ``state.apply_fn``; the recorded paths are
static (found while tracing) and kept for calls that reuse the compiled function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

from theseus.checkpoint.layers import layer_names, per_layer
from theseus.training.protocol import Batch, Trainer
from theseus.training.state import TrainState


def capture(
    trainer: Trainer, state: TrainState, batch: Batch, key: jax.Array
) -> tuple[Any, list[tuple[tuple[str, ...], Any]]]:
    """``(trace outputs, [(path, array), ...])``: ``trainer.trace`` with the module outputs in
    execution order; a path is the module path plus the output's position (``("up", "__call__", "0")``)."""
    trainer.setup()
    cls, sharding = type(trainer), trainer.sharding
    # Paths are static: recorded while tracing, kept for calls that reuse the compiled function.
    paths: list[tuple[str, ...]] = trainer.compiled("capture_paths", list)
    stacked = getattr(trainer.model, "stacked_layers", ())  # scanned layers: one entry per layer

    def build() -> Any:
        def captured(state: TrainState, batch: Batch, key: jax.Array) -> tuple[Any, list[Any]]:
            recorded: list[Any] = []
            apply_fn = state.apply_fn

            def recording_apply(variables: Any, *args: Any, **kwargs: Any) -> Any:
                if kwargs.get("capture_intermediates"):
                    out = apply_fn(variables, *args, **kwargs)
                    recorded.append(out[1].get("intermediates", {}))
                    return out
                out, mutated = apply_fn(
                    variables, *args, capture_intermediates=True, mutable=["intermediates"], **kwargs
                )
                recorded.append(mutated.get("intermediates", {}))
                return out

            outputs = cls.trace(state.replace(apply_fn=recording_apply), batch, key, sharding=sharding)
            if isinstance(outputs, tuple) and len(outputs) == 3 and isinstance(outputs[2], Mapping):
                outputs = (outputs[0], outputs[1], {k: v for k, v in outputs[2].items() if k != "intermediates"})
            ordered = (
                _in_order(_children_first(per_layer(recorded[-1], stacked), layer_names(stacked))) if recorded else []
            )
            paths[:] = [path for path, _ in ordered]
            return outputs, [value for _, value in ordered]

        return jax.jit(captured)

    outputs, values = trainer.compiled("capture", build)(state, batch, key)
    if jax.process_count() > 1:  # rows live on other processes too: gather them
        outputs, values = trainer.sharding.fetch((outputs, values))
    return outputs, list(zip(paths, values, strict=True))


def _children_first(tree: Any, stacked: set[str]) -> Any:
    """Recorded outputs of scanned layers (which a scan keeps in name order, not execution order)
    with each module's own output after its children's, as an unrolled layer records them."""
    if not stacked or not isinstance(tree, Mapping):
        return tree

    def reorder(node: Any) -> Any:
        if not isinstance(node, Mapping):
            return node
        children = {k: reorder(v) for k, v in node.items() if k != "__call__"}
        return {**children, **({"__call__": node["__call__"]} if "__call__" in node else {})}

    def of_stack(key: str) -> bool:
        name, _, index = key.rpartition("_")
        return name in stacked and index.isdigit()

    return {k: reorder(v) if of_stack(str(k)) else v for k, v in tree.items()}


def _in_order(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Leaves of nested mappings/sequences with their paths, in insertion (execution) order."""
    if isinstance(tree, Mapping):
        items: list[tuple[tuple[str, ...], Any]] = []
        for key, value in tree.items():
            items += _in_order(value, (*prefix, str(key)))
        return items
    if isinstance(tree, (list, tuple)):
        items = []
        for index, value in enumerate(tree):
            items += _in_order(value, (*prefix, str(index)))
        return items
    return [] if tree is None else [(prefix, tree)]
