"""Falcon-H1: ``FalconH1`` and its presets (``model.py``), the ``hf/falcon_h1`` Hugging Face family (``hf.py``).
Its layers are the stack's parallel arrangement (:meth:`theseus.model.stack.block.Block.parallel_mixers`) of
attention and the shared Mamba-2 mixer (:mod:`theseus.model.layers.mamba2`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.falcon_h1.model import FALCON_H1_PRESETS, FalconH1

#: Imported from ``model.py`` when first read: ``theseus.model.models.falcon_h1:FalconH1``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"FALCON_H1_PRESETS": "model", "FalconH1": "model"})

__all__ = ["FALCON_H1_PRESETS", "FalconH1"]
