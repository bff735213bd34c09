"""OLMo Hybrid: ``OLMoHybrid`` and its presets (``model.py``), the ``hf/olmo_hybrid`` Hugging Face family
(``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.olmo_hybrid.model import OLMO_HYBRID_PRESETS, OLMoHybrid

#: Imported from ``model.py`` when first read: ``theseus.model.models.olmo_hybrid:OLMoHybrid``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"OLMO_HYBRID_PRESETS": "model", "OLMoHybrid": "model"})

__all__ = ["OLMO_HYBRID_PRESETS", "OLMoHybrid"]
