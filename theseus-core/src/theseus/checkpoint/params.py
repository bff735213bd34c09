"""Reading only the parameters of a saved train state (initialising from a run, generating from it)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from theseus.checkpoint.layers import convert_restored, layout_changes, to_layout
from theseus.checkpoint.shapes import first_shape_mismatch, param_shapes


class NoSavedParams(Exception):
    """The saved state holds no ``params``."""


class ParamsMismatch(Exception):
    """A parameter of the model is missing from the save or saved with another shape."""

    def __init__(self, key: str, found: str, shape: tuple[int, ...]) -> None:
        super().__init__(f"{key!r}: saved {found}, expected {shape}")
        self.key, self.found, self.shape = key, found, shape


def read_params(path: Path, target: Any) -> Any:
    """The ``params`` of the orbax state at ``path`` restored onto ``target`` (a tree of
    ``jax.ShapeDtypeStruct`` with shardings), whichever layer layout (stacked or per layer) the
    save uses. Raises :class:`NoSavedParams`, :class:`ParamsMismatch` (names in the saved layout),
    or orbax's own error for an unreadable save."""
    import orbax.checkpoint as ocp

    handler = ocp.PyTreeCheckpointHandler()
    try:
        metadata = handler.metadata(path)
    finally:
        handler.close()
    saved = getattr(metadata, "tree", metadata)
    if not isinstance(saved, Mapping) or "params" not in saved:
        raise NoSavedParams(str(path))
    changes = layout_changes(param_shapes(saved["params"]), target)
    layout = to_layout(target, changes)
    mismatch = first_shape_mismatch(saved["params"], layout)
    if mismatch is not None:
        raise ParamsMismatch(*mismatch)
    restore_args = ocp.checkpoint_utils.construct_restore_args(layout)
    args = ocp.args.PyTreeRestore(item={"params": layout}, restore_args={"params": restore_args}, partial_restore=True)
    with ocp.PyTreeCheckpointer() as checkpointer:
        restored = checkpointer.restore(path, args=args)
    return convert_restored(restored["params"], changes, target)


__all__ = ["NoSavedParams", "ParamsMismatch", "read_params"]
