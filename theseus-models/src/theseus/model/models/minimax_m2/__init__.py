"""MiniMax-M2: ``MiniMaxM2`` and its presets (``model.py``), the ``hf/minimax_m2`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.minimax_m2.model import MINIMAX_M2_PRESETS, MiniMaxM2

#: Imported from ``model.py`` when first read: ``theseus.model.models.minimax_m2:MiniMaxM2``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"MINIMAX_M2_PRESETS": "model", "MiniMaxM2": "model"})

__all__ = ["MINIMAX_M2_PRESETS", "MiniMaxM2"]
