"""Phi-3: ``Phi3`` and its presets (``model.py``), the ``hf/phi3`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.phi3.model import PHI3_PRESETS, Phi3

#: Imported from ``model.py`` when first read: ``theseus.model.models.phi3:Phi3``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"PHI3_PRESETS": "model", "Phi3": "model"})

__all__ = ["PHI3_PRESETS", "Phi3"]
