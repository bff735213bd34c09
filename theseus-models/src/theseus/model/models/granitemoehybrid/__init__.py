"""Granite 4 hybrids: ``GraniteMoeHybrid`` and its presets (``model.py``), the ``hf/granitemoehybrid`` Hugging Face
family (``hf.py``). Its layers are each a Mamba-2 mixer (:mod:`theseus.model.layers.mamba2`) or attention, then a
mixture of experts with a shared MLP (:mod:`theseus.model.stack.mixture`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.granitemoehybrid.model import GRANITE_MOE_HYBRID_PRESETS, GraniteMoeHybrid

#: Imported from ``model.py`` when first read: ``theseus.model.models.granitemoehybrid:GraniteMoeHybrid``, as runs
#: record it.
__getattr__, __dir__ = lazy_exports(__name__, {"GRANITE_MOE_HYBRID_PRESETS": "model", "GraniteMoeHybrid": "model"})

__all__ = ["GRANITE_MOE_HYBRID_PRESETS", "GraniteMoeHybrid"]
