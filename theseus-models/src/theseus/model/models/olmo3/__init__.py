"""OLMo 3: ``OLMo3`` and its presets (``model.py``), the ``hf/olmo3`` Hugging Face family (``hf.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from theseus.base.lazy import lazy_exports

if TYPE_CHECKING:
    from theseus.model.models.olmo3.model import OLMO3_PRESETS, OLMo3

#: Imported from ``model.py`` when first read: ``theseus.model.models.olmo3:OLMo3``, as runs record it.
__getattr__, __dir__ = lazy_exports(__name__, {"OLMO3_PRESETS": "model", "OLMo3": "model"})

__all__ = ["OLMO3_PRESETS", "OLMo3"]
